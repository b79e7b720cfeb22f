"""Batch runs: input checking, resuming after a kill, the CLI's error reporting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minipic_client import BatchInputError, RagResult
from minipic_client.batch import BatchSummary, pending_samples, read_samples, run_batch
from minipic_client.cli import app

pytest_plugins = ["sdk_fixtures"]  # fake_server, fake_client, sdk_tokenizer

GOOD = {"id": "a", "system": "Be brief.", "docs": ["The mill is old.\n"], "task": "How old?"}


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def samples_file(path: Path, n: int) -> Path:
    docs = [f"Document {i % 3}: the school is by the river.\n" for i in range(3)]
    return write_lines(
        path,
        [
            json.dumps(
                {"id": f"s{i}", "system": "Be brief.", "docs": [docs[i % 3]], "task": f"q{i}"}
            )
            for i in range(n)
        ],
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "in.jsonl:2: not JSON"),
        ("[1, 2]", "in.jsonl:2: expected a JSON object, got list"),
        ('{"docs": [], "task": "q"}', "in.jsonl:2: 'id' must be a string or an integer"),
        ('{"id": "b", "docs": "one doc", "task": "q"}', "in.jsonl:2: 'docs' must be a list"),
        ('{"id": "b", "docs": ["ok", ""], "task": "q"}', "in.jsonl:2: 'docs': document 1 is empty"),
        ('{"id": "b", "docs": [], "task": ""}', "in.jsonl:2: 'task' must be a non-empty string"),
        ('{"id": "b", "system": 3, "task": "q"}', "in.jsonl:2: 'system' must be a string"),
        ('{"id": "a", "task": "q"}', "in.jsonl:2: id 'a' already used on line 1"),
    ],
)
def test_bad_input_lines_are_named(tmp_path, line, message):
    path = write_lines(tmp_path / "in.jsonl", [json.dumps(GOOD), line])
    with pytest.raises(BatchInputError, match=message):
        read_samples(path, max_tokens=4)


def test_blank_lines_are_skipped_and_ids_may_be_integers(tmp_path):
    path = write_lines(tmp_path / "in.jsonl", [json.dumps(GOOD), "", json.dumps(dict(GOOD, id=7))])
    assert [s.id for s in read_samples(path, max_tokens=4)] == ["a", 7]


def test_the_cli_names_the_bad_line_before_connecting(tmp_path):
    path = write_lines(tmp_path / "in.jsonl", [json.dumps(GOOD), '{"id": "b"}'])
    result = CliRunner().invoke(
        app,
        [
            "batch",
            str(path),
            "--server",
            "http://127.0.0.1:9",
            "--output",
            str(tmp_path / "out.jsonl"),
        ],
    )
    assert result.exit_code == 1
    assert "in.jsonl:2: 'task' must be a non-empty string" in result.output


class Killed(Exception):
    pass


async def test_a_killed_run_resumes_with_every_id_exactly_once(tmp_path, fake_server, fake_client):
    samples = read_samples(samples_file(tmp_path / "in.jsonl", 10), max_tokens=2)
    output = tmp_path / "out.jsonl"
    finished = []

    def die_after_four(sample, outcome):
        finished.append(sample.id)
        if len(finished) == 4:
            raise Killed

    async with fake_client(max_in_flight=2) as client:
        with pytest.raises(Killed):
            await run_batch(client, samples, output, on_done=die_after_four)
    with output.open("a", encoding="utf-8") as out:
        out.write('{"id": "s9", "text": "t1')  # the kill cut a line short
    assert len(output.read_text().splitlines()) == 5

    todo = pending_samples(samples, output)
    assert output.read_text().endswith("\n")  # the truncated line is gone
    assert sorted(s.id for s in todo) == sorted(s.id for s in samples if s.id not in finished)
    async with fake_client(max_in_flight=2) as client:
        summary = await run_batch(client, todo, output)

    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(s.id for s in samples)
    assert summary.completed == 6 and summary.failed == 0
    assert set(records[0]) == {"id", "text", "ttft_s", "cached_tokens", "prompt_tokens"}
    assert 0 < summary.cached_fraction < 1


async def test_a_rejected_sample_is_left_for_the_next_run(tmp_path, fake_server, fake_client):
    samples = read_samples(samples_file(tmp_path / "in.jsonl", 3), max_tokens=2)
    output = tmp_path / "out.jsonl"
    outcomes = []
    async with fake_client(max_in_flight=1) as client:
        await client.rag(
            system="Be brief.", docs=["Document 0: the school is by the river.\n"], task="warm"
        )
        fake_server.faults.append("400")  # the next request: the first sample's final
        summary = await run_batch(client, samples, output, on_done=lambda s, o: outcomes.append(o))
    assert summary.failed == 1 and summary.completed == 2
    assert sum(isinstance(o, RagResult) for o in outcomes) == 2
    assert len(pending_samples(samples, output)) == 1


def test_a_foreign_output_file_is_refused(tmp_path):
    samples = read_samples(samples_file(tmp_path / "in.jsonl", 2), max_tokens=2)
    output = write_lines(tmp_path / "out.jsonl", ['{"id": "s0"}', "some log line"])
    with pytest.raises(BatchInputError, match=r"out\.jsonl:2: not a result line"):
        pending_samples(samples, output)


def test_summary_percentiles():
    summary = BatchSummary(completed=100, elapsed_s=4.0, ttfts_s=[i / 100 for i in range(1, 101)])
    assert summary.samples_per_s == 25.0
    assert summary.ttft_percentile(50) == pytest.approx(0.505)
    assert summary.ttft_percentile(99) == pytest.approx(0.9901)
    assert BatchSummary().ttft_percentile(50) is None
