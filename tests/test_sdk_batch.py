"""Batch runs: input checking, resuming after a kill, the CLI's error reporting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minipic_client import BatchInputError, InputFileError, RagResult
from minipic_client.batch import BatchSummary, ResultFile, read_samples, run_batch
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


UNREACHABLE = "http://127.0.0.1:9"  # nothing listens there: a test that connects would hang in retries


def run_cli(*args: str):
    return CliRunner().invoke(app, list(args))


def test_the_cli_names_the_bad_line_before_connecting(tmp_path):
    path = write_lines(tmp_path / "in.jsonl", [json.dumps(GOOD), '{"id": "b"}'])
    result = run_cli("batch", str(path), "--server", UNREACHABLE, "--output", str(tmp_path / "out.jsonl"))
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
        with ResultFile(output) as results, pytest.raises(Killed):
            await run_batch(client, samples, results, on_done=die_after_four)
    with output.open("a", encoding="utf-8") as out:
        out.write('{"id": "s9", "text": "t1')  # the kill cut a line short
    assert len(output.read_text().splitlines()) == 5

    async with fake_client(max_in_flight=2) as client:
        with ResultFile(output) as results:
            assert output.read_text().endswith("\n")  # the truncated line is gone
            todo = results.pending(samples)
            assert sorted(s.id for s in todo) == sorted(s.id for s in samples if s.id not in finished)
            summary = await run_batch(client, todo, results)

    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(s.id for s in samples)
    assert summary.completed == 6 and summary.failed == 0
    assert set(records[0]) == {
        "id", "text", "ttft_s", "cached_tokens", "prompt_tokens", "computed_tokens", "reused_tokens"
    }
    run = [r for r in records if r["id"] not in finished]
    # isps sends each prefill for one sample: the run's count is the sum of its samples'.
    assert summary.computed_tokens == sum(r["computed_tokens"] for r in run)
    assert summary.prompt_tokens == sum(r["prompt_tokens"] for r in run)
    assert 0 < summary.reused_fraction < 1
    assert summary.cached_fraction > summary.reused_fraction  # re-sent prefills cost their last block


async def test_a_rejected_sample_is_left_for_the_next_run(tmp_path, fake_server, fake_client):
    samples = read_samples(samples_file(tmp_path / "in.jsonl", 3), max_tokens=2)
    output = tmp_path / "out.jsonl"
    outcomes = []
    async with fake_client(max_in_flight=1) as client:
        await client.rag(
            system="Be brief.", docs=["Document 0: the school is by the river.\n"], task="warm"
        )
        fake_server.faults.append("400")  # the next request: the first sample's final
        with ResultFile(output) as results:
            summary = await run_batch(client, samples, results, on_done=lambda s, o: outcomes.append(o))
    assert summary.failed == 1 and summary.completed == 2
    assert sum(isinstance(o, RagResult) for o in outcomes) == 2
    with ResultFile(output) as results:
        assert len(results.pending(samples)) == 1


async def test_bad_text_fails_its_own_sample_and_the_batch_goes_on(tmp_path, fake_server, fake_client):
    path = tmp_path / "in.jsonl"
    lines = [
        json.dumps(GOOD).encode(),
        b'{"id": "surrogate", "docs": ["ok\\udcff"], "task": "q"}',
        '{"id": "latin1", "docs": ["caf\u00e9"], "task": "q"}'.encode("latin-1"),
        json.dumps(dict(GOOD, id="z")).encode(),
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    samples = read_samples(path, max_tokens=2)
    assert [str(s.error) if s.error else None for s in samples] == [
        None,
        f"{path}:2: 'docs[0]' has a lone surrogate '\\udcff' at character 2: not valid Unicode",
        f"{path}:3: not valid UTF-8: byte 0xe9 at offset 30",
        None,
    ]
    reported = []
    async with fake_client() as client:
        with ResultFile(tmp_path / "out.jsonl") as results:
            summary = await run_batch(client, samples, results, on_done=lambda s, o: reported.append((s.id, o)))
    assert summary.completed == 2 and summary.failed == 2
    assert sorted(i for i, o in reported if isinstance(o, RagResult)) == ["a", "z"]
    assert len(fake_server.of_kind("final")) == 2  # the bad samples were never sent
    written = [json.loads(line)["id"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(written) == ["a", "z"]


RESULT = json.dumps({"id": "s0", "text": "t", "ttft_s": 0.1, "cached_tokens": 16, "prompt_tokens": 20})


@pytest.mark.parametrize(
    ("content", "line", "reason"),
    [
        (f"{RESULT}\nsome log line\n", 2, "not a result line: is this"),
        ("my notes about the run, no newline", 1, "not a result line: is this"),  # 46 -> 19 bytes before
        (f"{RESULT}\n{{\"text\": \"x\"}}\n", 2, "not a result line \\(no 'id', 'ttft_s', "),
        (f"{RESULT}\nnotes", 2, "not a result line: is this"),
        # Sample lines carry an "id" too: before, these were resumed, their last line cut.
        (f"{json.dumps(GOOD)}\n", 1, "not a result line \\(no 'text', 'ttft_s', 'cached_tokens', 'prompt_tokens'\\)"),
        (f"{json.dumps(GOOD)}\n{json.dumps(GOOD)}", 1, "not a result line \\(no 'text'"),
        (json.dumps(GOOD), 1, "not a result line \\(no 'text'"),  # one whole line without its newline
        (json.dumps(GOOD)[:30], 1, "not a result line: is this"),  # a sample line cut short
        ('{"id": "s', 1, "not a result line: is this"),  # too short to tell: not cut when alone
    ],
)
def test_a_foreign_output_file_is_refused_and_left_unchanged(tmp_path, content, line, reason):
    output = tmp_path / "out.jsonl"
    output.write_text(content)
    with pytest.raises(BatchInputError, match=rf"out\.jsonl:{line}: {reason}"):
        with ResultFile(output):
            pass
    assert output.read_text() == content


def test_a_copy_of_the_input_as_output_is_refused_with_one_line(tmp_path):
    inp = samples_file(tmp_path / "in.jsonl", 5)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(inp.read_bytes())
    result = run_cli("batch", str(inp), "--server", UNREACHABLE, "--output", str(copy))
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"error: {copy}:1: not a result line (no 'text', 'ttft_s', 'cached_tokens', 'prompt_tokens'): "
        "is this the right --output file? (left unchanged)"
    ]  # before: "resuming: 5 of 5 samples done", exit 0
    assert copy.read_bytes() == inp.read_bytes()


@pytest.mark.parametrize(
    ("tail", "kept"),
    [
        ('{"id": "s1", "text": "half an ans', ""),  # a kill cut the first line: cut off
        (RESULT.replace("s0", "s1"), RESULT.replace("s0", "s1") + "\n"),  # whole, newline missing: kept
    ],
)
def test_a_last_line_is_cut_only_when_it_is_a_result_cut_short(tmp_path, tail, kept):
    output = tmp_path / "out.jsonl"
    output.write_text(tail)
    with ResultFile(output) as results:
        assert results.done == ({"s1"} if kept else set())
    assert output.read_text() == kept


def test_results_of_another_input_are_refused(tmp_path):
    samples = read_samples(samples_file(tmp_path / "in.jsonl", 2), max_tokens=2)
    output = tmp_path / "out.jsonl"
    output.write_text(RESULT.replace('"s0"', '"other"') + "\n")
    with ResultFile(output) as results, pytest.raises(InputFileError, match="all of other samples' ids"):
        results.pending(samples)


def test_an_output_that_is_the_input_is_refused_before_anything_changes(tmp_path):
    path = samples_file(tmp_path / "in.jsonl", 2)
    before = path.read_bytes()
    result = run_cli("batch", str(path), "--server", UNREACHABLE, "--output", str(path))
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == f"error: {path}: is the input file: choose another --output"
    assert path.read_bytes() == before


def test_two_runs_cannot_write_one_output(tmp_path):
    output = tmp_path / "out.jsonl"
    with ResultFile(output):
        with pytest.raises(InputFileError, match=r"another run is writing it \(lock .*out\.jsonl\.lock\)"):
            with ResultFile(output):
                pass
    with ResultFile(output):  # released with the first run
        pass


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("missing-dir/out.jsonl", "its folder {tmp}/missing-dir does not exist"),
        ("/proc/version", "cannot write it: Invalid argument"),  # unwritable even for root
    ],
)
def test_an_unwritable_output_is_one_line_before_connecting(tmp_path, target, reason):
    inp = samples_file(tmp_path / "in.jsonl", 2)
    output = tmp_path / target
    result = run_cli("batch", str(inp), "--server", UNREACHABLE, "--output", str(output))
    assert result.exit_code == 1
    assert result.output.splitlines() == [f"error: {output}: {reason.format(tmp=tmp_path)}"]
    assert not (tmp_path / "missing-dir").exists()


def test_a_salt_the_server_would_refuse_is_one_line_before_anything(tmp_path):
    inp = samples_file(tmp_path / "in.jsonl", 2)
    output = tmp_path / "out.jsonl"
    result = run_cli("batch", str(inp), "--server", UNREACHABLE, "--output", str(output),
                     "--cache-salt", "alice@example.com")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "error: cache_salt 'alice@example.com' has '@' at character 5: a salt is 1-128 characters "
        "without '@', '/', '\\' or NUL (the server's rule)"
    ]  # before: every request failed with HTTP 400
    assert not output.exists()


def test_a_document_that_is_not_utf8_is_named_before_connecting(tmp_path):
    doc = tmp_path / "latin1.txt"
    doc.write_bytes("Caf\u00e9 au lait.".encode("latin-1"))
    result = run_cli("rag", "--server", UNREACHABLE, "--doc", str(doc), "--task", "q")
    assert result.exit_code == 1
    assert result.output.strip() == f"error: {doc}: not valid UTF-8: byte 0xe9 at offset 3"


def test_summary_percentiles():
    summary = BatchSummary(completed=100, elapsed_s=4.0, ttfts_s=[i / 100 for i in range(1, 101)])
    assert summary.samples_per_s == 25.0
    assert summary.ttft_percentile(50) == pytest.approx(0.505)
    assert summary.ttft_percentile(99) == pytest.approx(0.9901)
    assert BatchSummary().ttft_percentile(50) is None


def test_the_summary_says_what_the_run_computed_and_took_from_the_cache():
    from minipic_client.cli import _cost

    assert _cost(BatchSummary(prompt_tokens=26_760, computed_tokens=3_212)) == (
        "3,212 prompt tokens computed (span prefills included), 88.0% of 26,760 from the cache"
    )
    assert _cost(BatchSummary(computed_tokens=0)).endswith("0.0% of 0 from the cache")  # nothing left to run
    assert _cost(BatchSummary(prompt_tokens=10)) == "10 prompt tokens (the server reports no cache hits)"
