"""Span prefills are lost when the server restarts; answers must not change, and clients can tell."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from minipic_client import BlockAttention, RagRequest, SpanClient

from batch_signals import batch_signalling_itself
from pic_reference import HFReference, dependent, flatten, random_tokens, span, system
from server_api import complete, max_logprob_diff, prefill
from servers import ServerPool, ServerSpec

pytestmark = pytest.mark.server


def test_restart_drops_spans_but_not_exactness(server_pool: ServerPool, pic_server, tiny_model_dir: Path) -> None:
    rng = random.Random(21)
    sys_, doc_a, doc_b = system(random_tokens(rng, 20)), span(random_tokens(rng, 40)), span(random_tokens(rng, 33))
    segments = [sys_, doc_b, doc_a, dependent(random_tokens(rng, 12))]
    for part in (sys_, doc_a, doc_b):
        prefill(pic_server, list(part.tokens))
    before = httpx.get(pic_server.url + "/minipic/info").json()["instance_id"]

    restarted = server_pool.restart()
    assert httpx.get(restarted.url + "/minipic/info").json()["instance_id"] != before
    result = complete(restarted, flatten(segments))
    assert result.cached_tokens == 0
    expected_ids, expected_tops = HFReference(tiny_model_dir).greedy_top_logprobs(segments)
    assert result.token_ids == expected_ids
    assert max_logprob_diff(result.top_logprobs, expected_tops) < 1e-3


async def test_client_prefills_again_after_a_restart(server_pool: ServerPool, pic_server) -> None:
    docs = [f"Restart report {i}: the ferry leaves at {i} o'clock from the east pier.\n" for i in range(3)]
    async with SpanClient(pic_server.url, info_check_interval_s=0, technique=BlockAttention()) as client:
        expected = client.rag_layout(RagRequest("When?", docs, "Be brief.")).cacheable_tokens
        before = await client.rag(system="Be brief.", docs=docs, task="When?", max_tokens=2)
        server_pool.restart()
        # The client still believes its spans are cached: this answer is computed in full...
        first_after = await client.rag(system="Be brief.", docs=docs, task="When?", max_tokens=2)
        # ...and its shortfall made the client notice the new instance and prefill again.
        second_after = await client.rag(system="Be brief.", docs=docs, task="When?", max_tokens=2)
    assert before.cached_tokens == expected
    assert first_after.cached_tokens == 0
    assert second_after.cached_tokens == expected
    assert first_after.token_ids == before.token_ids == second_after.token_ids


def test_a_batch_survives_kill_9_of_the_server_and_leaves_no_orphans(server_pool: ServerPool, tmp_path):
    """kill -9 of the API server mid-batch: its engine and worker die with it, and the batch
    waits for the restarted server and finishes with every id exactly once."""
    pic_server = server_pool.get(ServerSpec())  # the live one: earlier tests here restart it
    samples = [
        {"id": i, "system": "Be brief.", "docs": [f"Ferry report {i % 4}: the boat leaves at {i % 4}.\n"],
         "task": f"Question {i}?"}
        for i in range(40)
    ]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    args = (str(inp), "--server", pic_server.url, "--output", str(out), "--max-tokens", "16", "--max-in-flight", "2")
    children = psutil.Process(pic_server.process.pid).children(recursive=True)
    assert any("EngineCore" in c.name() for c in children)

    # The batch stops itself after its third result line, so the server dies mid-batch
    # however fast the run goes; it goes on while the server is down.
    command = batch_signalling_itself(*args, after_results=3, signum=signal.SIGSTOP)
    batch = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        batch_process = psutil.Process(batch.pid)
        deadline = time.monotonic() + 300
        while batch.poll() is None and batch_process.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(pic_server.process.pid, signal.SIGKILL)
        pic_server.process.wait()
        _, orphans = psutil.wait_procs(children, timeout=20)
        assert not orphans, f"left running: {[(p.pid, p.name()) for p in orphans]}"
        written_before_restart = out.read_text().count("\n")
        batch.send_signal(signal.SIGCONT)
        server_pool.restart()
        _, stderr = batch.communicate(timeout=600)
    finally:
        batch.kill()
    assert batch.returncode == 0, stderr
    assert written_before_restart == 3
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == list(range(len(samples)))
