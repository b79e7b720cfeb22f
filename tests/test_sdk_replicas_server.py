"""Placement across two real `minipic serve` replicas (the tiny model, one CPU core each):
span hits with placement against round-robin, answers equal to one server's, a replica
stopped mid-run and started again, and an eviction learned from vLLM's KV events."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from minipic_client import BlockAttention, Endpoint, RagRequest, RagResult, RequestEvent, RoundRobin, SpanClient
from minipic_server.launch import free_port

from batch_signals import batch_command
from rag_answers import every_answer
from servers import RunningServer, ServerPool, ServerSpec, start

pytestmark = pytest.mark.server

BLOCKS = BlockAttention()  # placement is about spans: every document one span
SYSTEM = "Answer from the documents."


EVENT_PORTS = [free_port(), free_port()]


def publishing(port: int) -> ServerSpec:
    """`minipic serve` publishing its KV events on `port`."""
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
    return ServerSpec(extra_args=("--kv-events-config", json.dumps(config)))


@pytest.fixture(scope="module")
def replicas(server_pool: ServerPool) -> Iterator[list[RunningServer]]:
    with server_pool.side_by_side([publishing(port) for port in EVENT_PORTS]) as servers:
        yield servers


def workload(documents: int = 6, uses: int = 2) -> list[RagRequest]:
    """Each document asked about `uses` times, its uses spread over the run."""
    tag = uuid.uuid4().hex[:8]
    docs = [
        f"Report {tag} number {i}: the river runs past mill {i}, the old school and the bridge "
        f"that the town rebuilt after the flood of year {1900 + i}.\n"
        for i in range(documents)
    ]
    return [RagRequest(f"Which mill is in report {i}?", [doc], SYSTEM, max_tokens=6)
            for i in range(uses) for doc in docs]


async def run(client: SpanClient, requests: list[RagRequest], **options: Any) -> list[RagResult]:
    results = await every_answer(client, requests, **options)
    return [results[i] for i in range(len(requests))]


def span_hit_rate(client: SpanClient, requests: list[RagRequest], results: list[RagResult]) -> float:
    """Cached tokens over those the layouts promise (the spans and the shared system prompt)."""
    promised = sum(client.rag_layout(r).cacheable_tokens for r in requests)
    return sum(r.cached_tokens or 0 for r in results) / promised


async def one_server_answers(server: RunningServer, requests: list[RagRequest]) -> list[RagResult]:
    async with SpanClient(server.url, cache_salt=uuid.uuid4().hex, technique=BLOCKS) as client:
        return await run(client, requests)


async def test_placement_hits_every_span_round_robin_does_not_and_answers_are_one_servers(
    replicas: list[RunningServer],
) -> None:
    requests = workload()
    urls = [s.url for s in replicas]
    events: list[RequestEvent] = []
    async with SpanClient(urls, on_request=events.append, cache_salt=uuid.uuid4().hex, technique=BLOCKS) as client:
        placed = await run(client, requests)
        placed_rate = span_hit_rate(client, requests, placed)
    async with SpanClient(urls, placement=RoundRobin(), cache_salt=uuid.uuid4().hex, technique=BLOCKS) as client:
        spread = await run(client, requests, window=1)
        round_robin_rate = span_hit_rate(client, requests, spread)
    single = [r.token_ids for r in await one_server_answers(replicas[0], requests)]
    print(f"span hit rate: placement {placed_rate:.3f}, round-robin {round_robin_rate:.3f}")

    assert placed_rate >= 0.99 and round_robin_rate <= 0.75
    assert [r.token_ids for r in placed] == [r.token_ids for r in spread] == single
    # Six documents, each prefilled once in the whole fleet; the system prompt's prefix
    # once on each replica that answered; both replicas got documents.
    prefilled = Counter(e.endpoint for e in events if e.kind != "final" for _ in range(e.prompts))
    answered = {e.endpoint for e in events if e.kind == "final"}
    assert sum(prefilled.values()) == 6 + len(answered) and set(prefilled) == answered == {
        client.endpoints[0].name, client.endpoints[1].name
    }


async def test_minipic_batch_over_two_replicas(replicas: list[RunningServer], tmp_path: Path) -> None:
    requests = workload()
    samples = tmp_path / "in.jsonl"
    samples.write_text("".join(
        json.dumps({"id": f"q{i}", "system": r.system, "docs": list(r.docs), "task": r.task}) + "\n"
        for i, r in enumerate(requests)
    ))
    servers = [arg for server in replicas for arg in ("--server", server.url)]
    command = batch_command(
        str(samples), *servers, "--output", str(tmp_path / "out.jsonl"), "--max-tokens", "6", "--layout", "block"
    )
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    single = [r.text for r in await one_server_answers(replicas[0], requests)]
    assert sorted(line["id"] for line in lines) == sorted(f"q{i}" for i in range(len(requests)))
    assert {line["id"]: line["text"] for line in lines} == {f"q{i}": text for i, text in enumerate(single)}


async def test_a_replica_stopped_mid_run_and_started_again(
    replicas: list[RunningServer], server_pool: ServerPool, caplog: pytest.LogCaptureFixture
) -> None:
    requests = workload(documents=8, uses=2)
    single = [r.token_ids for r in await one_server_answers(replicas[0], requests)]
    victim = replicas[1]
    events: list[RequestEvent] = []
    crashed = False

    def crash_after_four(event: RequestEvent) -> None:
        """The victim dies as the fourth answer arrives, before the client sends anything
        else: with a window of four, no document's second use has gone out yet, and
        placement sends those of the victim's documents to it."""
        nonlocal crashed
        events.append(event)
        if not crashed and sum(e.kind == "final" for e in events) == 4:
            victim.crash()
            crashed = True

    urls = [s.url for s in replicas]
    async with SpanClient(
        urls, on_request=crash_after_four, failover_s=1.0, cache_salt=uuid.uuid4().hex, technique=BLOCKS
    ) as client:
        victim_name = client.endpoints[1].name
        with caplog.at_level("WARNING", logger="minipic_client"):
            results = await run(client, requests, window=4)
        assert [r.token_ids for r in results] == single  # every sample once, as one server answers it
        assert any(f"{victim_name} failed" in r.getMessage() for r in caplog.records)  # it failed mid-run
        # The victim answered at most the four before its crash.
        assert sum(e.kind == "final" and e.endpoint == victim_name for e in events) <= 4

        port = int(victim.url.rsplit(":", 1)[1])
        replicas[1] = start(victim.spec, victim.model_dir, server_pool.log_dir, port)
        await asyncio.sleep(1.0)  # its sit-out ends
        events.clear()
        more = workload(documents=6, uses=2)
        again = await run(client, more)
        assert span_hit_rate(client, more, again) >= 0.99
    assert {e.endpoint for e in events if e.kind == "span"} >= {victim_name}
    assert victim_name in {e.endpoint for e in events if e.kind == "final"}


async def test_an_evicted_span_is_prefilled_again_before_its_prompt_misses(replicas: list[RunningServer]) -> None:
    """8,192 tokens of KV cache: 40 documents of ~300 tokens evict the first one. The KV
    events tell the client, so its next prompt prefills the document first and hits it."""
    tag = uuid.uuid4().hex[:8]
    first = RagRequest("Which mill?", [f"Report {tag}: the river runs past the mill and the school.\n"], SYSTEM)
    flood = [
        RagRequest("Which?", [f"Note {tag}-{i}: " + " ".join(f"word{i}x{j}" for j in range(150)) + "\n"], SYSTEM,
                   max_tokens=1)
        for i in range(40)
    ]
    events: list[RequestEvent] = []
    endpoint = Endpoint(replicas[0].url, kv_events=f"tcp://127.0.0.1:{EVENT_PORTS[0]}")
    async with SpanClient([endpoint], on_request=events.append, technique=BLOCKS) as client:
        await asyncio.sleep(0.5)  # the subscription is up before anything is stored
        await client.rag(task=first.task, docs=first.docs, system=first.system, max_tokens=2)
        await run(client, flood, window=4)
        await asyncio.sleep(1.0)  # the last events arrive
        events.clear()
        again = await client.rag(task=first.task, docs=first.docs, system=first.system, max_tokens=2)
        promised = client.rag_layout(first).cacheable_tokens
    assert [e.kind for e in events] == ["span", "final"]
    assert again.cached_tokens == promised
