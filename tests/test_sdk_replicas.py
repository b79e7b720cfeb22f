"""SpanClient over several replicas, against fake servers (fault injection): placement,
data-parallel ranks, failover and recovery. The real servers: test_sdk_replicas_server.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from minipic_client import (
    ConfigError,
    Endpoint,
    Prefill,
    RagRequest,
    RagResult,
    Rendezvous,
    RequestEvent,
    RetryPolicy,
    RoundRobin,
    SpanAffinity,
    SpanClient,
    Strategy,
    TransportError,
)
from minipic_client.batch import read_samples, run_batch
from minipic_client.placement import DP_RANK_HEADER, weight

from rag_answers import every_answer

if TYPE_CHECKING:
    from collections.abc import Callable

    from sdk_fixtures import FakeFleet, FakeServer

    Fleet = Callable[[list[str]], FakeFleet]

pytest_plugins = ["sdk_fixtures"]  # fake_fleet

SYSTEM = "Answer from the documents."
LONG = "A long record: " + "the ferry leaves at dawn. " * 12 + "\n"


def docs(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"Record {tag}-{i}: the ferry leaves pier {i} at dawn and returns at dusk.\n" for i in range(n)]


def span_prefills(servers: dict[str, FakeServer]) -> Counter[tuple[int, ...]]:
    """How many times each span was prefilled, over the whole fleet."""
    return Counter(tuple(r.prompt) for s in servers.values() for r in s.of_kind("span"))


async def answers(client: SpanClient, requests: list[RagRequest], **options: Any) -> dict[int, RagResult]:
    return await every_answer(client, requests, **options)


def hit_rate(client: SpanClient, requests: list[RagRequest], results: dict[int, RagResult]) -> float:
    promised = sum(client.rag_layout(r).cacheable_tokens for r in requests)
    return sum(r.cached_tokens or 0 for r in results.values()) / promised


def one_doc_each(documents: list[str], uses: int) -> list[RagRequest]:
    """Every document asked about `uses` times, the uses spread over the run."""
    return [RagRequest(f"When does ferry {i} leave?", [doc], SYSTEM, max_tokens=2)
            for i in range(uses) for doc in documents]


@pytest.mark.parametrize("strategy", [Strategy.ISPS, Strategy.BATCHED])
async def test_spans_are_prefilled_on_one_replica_and_every_final_hits(
    fake_fleet: Fleet, strategy: Strategy
) -> None:
    fleet = fake_fleet(["http://r0", "http://r1", "http://r2"])
    servers = fleet.servers
    requests = one_doc_each(docs(12), uses=3)
    async with fleet.client() as client:
        results = await answers(client, requests, strategy=strategy)
        assert hit_rate(client, requests, results) == 1.0
    assert set(span_prefills(servers).values()) == {1} and len(span_prefills(servers)) == 12
    assert all(s.of_kind("span") for s in servers.values())  # rendezvous spreads them


async def test_round_robin_misses_what_placement_hits(
    fake_fleet: Fleet,
) -> None:
    fleet = fake_fleet(["http://r0", "http://r1"])
    requests = one_doc_each(docs(8), uses=2)
    async with fleet.client(placement=RoundRobin()) as client:
        rate = hit_rate(client, requests, await answers(client, requests, window=1))
    assert rate < 0.75  # each document's first use misses: its final lands where it was not prefilled


async def test_round_robin_per_job_hits_but_prefills_each_document_on_every_replica(
    fake_fleet: Fleet,
) -> None:
    fleet = fake_fleet(["http://r0", "http://r1"])
    requests = one_doc_each(docs(9), uses=2)  # odd: a document's second use is on the other replica
    async with fleet.client(placement=RoundRobin(per_job=True)) as client:
        assert hit_rate(client, requests, await answers(client, requests, window=1)) == 1.0
    assert set(span_prefills(fleet.servers).values()) == {2}


async def test_data_parallel_ranks_are_replicas_by_header(
    fake_fleet: Fleet,
) -> None:
    fleet = fake_fleet(["http://dp#dp=0", "http://dp#dp=1"])
    servers = fleet.servers
    requests = one_doc_each(docs(8), uses=2)
    async with fleet.client(Endpoint.ranks("http://dp", 2)) as client:
        results = await answers(client, requests)
        assert hit_rate(client, requests, results) == 1.0
    for rank, server in enumerate(servers.values()):
        assert server.of_kind("span") and server.of_kind("final")
        assert {h[DP_RANK_HEADER] for h in server.headers} == {str(rank)}


async def test_a_final_goes_where_most_of_its_span_tokens_are(
    fake_fleet: Fleet,
) -> None:
    fleet = fake_fleet(["http://r0", "http://r1"])
    servers = fleet.servers
    short, long_ = "A short note.\n", LONG
    async with fleet.client() as client:
        await client.rag(docs=[long_], task="When?", max_tokens=1)
        await client.rag(docs=[short], task="When?", max_tokens=1)
        holder = next(s for s in servers.values() if s.of_kind("final"))
        for s in servers.values():
            s.requests.clear()
        result = await client.rag(docs=[short, long_], task="When?", max_tokens=1)
    assert [len(s.of_kind("final")) for s in servers.values()] == [int(s is holder) for s in servers.values()]
    # Where the short span was missing, it was prefilled first; the final hit both.
    assert result.cached_tokens == client.rag_layout(RagRequest("When?", [short, long_])).cacheable_tokens


async def test_an_affinity_header_keeps_a_jobs_requests_and_its_main_document_together(
    fake_fleet: Fleet,
) -> None:
    fleet = fake_fleet(["http://router"])
    long_, short, other = LONG, "A short note.\n", "Another note.\n"
    async with fleet.client(affinity_header="X-MiniPIC-Affinity") as client:
        for documents in ([long_, short], [other, long_], [short]):
            await client.rag(docs=documents, task="When?", max_tokens=1)
        keys = [
            next(p.key.hex() for p in client.rag_layout(RagRequest("When?", [d])).prefills if p.kind == "span")
            for d in (long_, short)
        ]
    values = [h.get("X-MiniPIC-Affinity") for h in fleet.servers["http://router"].headers]
    # /minipic/info; two prefills and two finals led by the long document; the short one's final.
    assert values == [None, keys[0], keys[0], keys[0], keys[0], keys[1]]


@dataclass
class Stub:
    name: str
    load: int = 0
    busy: int = 0
    keys: set[bytes] = field(default_factory=set)

    def holds(self, key: bytes) -> bool:
        return key in self.keys


def spans(n: int, size: int = 10) -> list[Prefill]:
    return [Prefill.of("span", tuple(range(i, i + size))) for i in range(n)]


def test_rendezvous_moves_only_a_leaving_replicas_spans_and_gives_them_back() -> None:
    homes, replicas = Rendezvous(load_factor=100.0), [Stub(f"r{i}") for i in range(4)]
    before = {p.key: homes.home(p, replicas).name for p in spans(400)}
    without = {p.key: homes.home(p, replicas[:3]).name for p in spans(400)}
    moved = {k for k in before if before[k] != without[k]}
    assert moved == {k for k in before if before[k] == "r3"} and 60 < len(moved) < 140
    assert {p.key: homes.home(p, replicas).name for p in spans(400)} == before


def test_rendezvous_bounds_the_load() -> None:
    homes, replicas = Rendezvous(load_factor=1.25), [Stub(f"r{i}") for i in range(4)]
    for prefill in spans(400):
        homes.home(prefill, replicas).load += 10
    assert max(r.load for r in replicas) <= 1.25 * 4000 / 4 + 10


def test_span_affinity_counts_held_tokens_then_homes_then_business() -> None:
    small, big = Prefill.of("span", (1,) * 5), Prefill.of("span", (2,) * 50)
    a, b = Stub("a", keys={small.key}), Stub("b", keys={big.key})
    assert SpanAffinity().route([small, big], [a, b]).final is b
    idle, busy = Stub("x"), Stub("y", busy=3)
    assert SpanAffinity().route([], [busy, idle]).final is idle
    route = SpanAffinity().route([big], [a, idle])  # held nowhere: its home
    assert route.prefill is route.final is Rendezvous().home(big, [a, idle])
    system = Prefill.of("prefix", (3,) * 500)  # shared by every job: held where jobs went so far
    home = Rendezvous().home(big, [a, idle])
    home_not = idle if home is a else a
    home_not.keys.add(system.key)
    assert SpanAffinity().route([system, big], [a, idle]).final is home


async def test_a_replica_that_dies_mid_run_loses_its_work_once_and_gets_it_back(
    fake_fleet: Fleet, tmp_path: Path
) -> None:
    fleet = fake_fleet(["http://r0", "http://r1"])
    servers = fleet.servers
    victim = servers["http://r1"]
    finals: list[RequestEvent] = []

    def kill_after_some(event: RequestEvent) -> None:
        if event.kind == "final":
            finals.append(event)
            victim.down = victim.down or len(finals) == 6

    requests = one_doc_each(docs(8), uses=4)
    lines = [json.dumps({"id": f"s{i}", "system": r.system, "docs": list(r.docs), "task": r.task})
             for i, r in enumerate(requests)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    samples = read_samples(tmp_path / "in.jsonl", max_tokens=2)
    async with fleet.client(failover_s=0.2, on_request=kill_after_some) as client:
        summary = await run_batch(client, samples, tmp_path / "out.jsonl", window=1)
        ids = [json.loads(line)["id"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert sorted(ids) == sorted(s.id for s in samples) and summary.completed == len(samples)
        after = [e.endpoint for e in finals[6:]]
        assert set(after) == {"http://r0"}  # no final reached the dead replica again
        victim.down = False
        await asyncio.sleep(0.25)  # its sit-out ends
        victim.requests.clear()
        more = one_doc_each(docs(8), uses=1)
        results = await answers(client, more)
        assert hit_rate(client, more, results) == 1.0
    assert victim.of_kind("span") and victim.of_kind("final")  # placement uses it again


@pytest.mark.parametrize("fault", ["break", "abort", "shutdown-midway"])
async def test_a_replica_failing_mid_answer_hands_the_sample_to_another(fake_fleet: Fleet, fault: str) -> None:
    fleet = fake_fleet(["http://r0", "http://r1"])
    request = one_doc_each(docs(1), uses=1)[0]
    async with fleet.client(failover_s=0.2) as client:
        span = next(p for p in client.rag_layout(request).prefills if p.kind == "span")
        first = max(fleet.servers, key=lambda name: weight(span.key, name))  # its home: both are empty
        fleet.servers[first].faults.extend(["", fault])  # the prefill is answered, the final fails
        result = await client.rag(docs=request.docs, task=request.task, system=request.system, max_tokens=2)
    other = next(s for name, s in fleet.servers.items() if name != first)
    assert result.token_ids == [100, 101] and len(other.of_kind("final")) == 1
    assert len(fleet.servers[first].of_kind("final")) == 1


async def test_with_every_replica_down_the_call_fails_with_one_line(
    fake_fleet: Fleet,
) -> None:
    fleet = fake_fleet(["http://r0", "http://r1"])
    servers = fleet.servers
    retry = RetryPolicy(total_s=0.5, initial_backoff_s=0.001, max_backoff_s=0.01)
    async with fleet.client(retry=retry, failover_s=0.3) as client:
        for server in servers.values():
            server.down = True
        with pytest.raises(TransportError, match="every replica failed") as failed:
            await client.rag(docs=docs(1), task="When?", max_tokens=1)
    assert "\n" not in str(failed.value)


async def test_replicas_of_different_models_are_refused(
    fake_fleet: Fleet,
) -> None:
    fleet = fake_fleet(["http://r0", "http://r1"])
    servers = fleet.servers
    servers["http://r1"].info["block_size"] = 32
    with pytest.raises(ConfigError, match="http://r1 serves .* but http://r0 serves"):
        async with fleet.client():
            pass


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SpanClient([]), "no server given"),
        (lambda: SpanClient(["http://a:1", "http://a:1/v1"]), "endpoint given twice: http://a:1"),
        (lambda: Endpoint("http://a", dp_rank=-1), "dp_rank of http://a must be a non-negative int"),
        (lambda: Endpoint.ranks("http://a", 0), "data-parallel size must be at least 1"),
        (lambda: Endpoint("a:8000"), "must start with http:// or https://"),
        (lambda: Rendezvous(load_factor=0.5), "load_factor must be at least 1.0"),
        (lambda: SpanClient("http://a", failover_s=0), "failover_s must be positive"),
        (lambda: SpanClient("http://a", affinity_header="X Key"), "affinity_header must be a header name"),
    ],
)
def test_bad_fleet_settings_get_one_line(make: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        make()
    assert "\n" not in str(refused.value)
