"""Following vLLM's KV events: spans recognised in stored blocks, forgotten when a block
goes, and a real ZMQ stream in-process (the server side: test_sdk_replicas_server.py)."""

from __future__ import annotations

import asyncio

import httpx
import msgspec
import pytest
import zmq
import zmq.asyncio

from minipic_client import ConfigError, Endpoint, Prefill, RetryPolicy
from minipic_client.kv_events import BlockLedger, SpanIndex, apply, follow, subscribe
from minipic_client.scheduler import Scheduler
from minipic_client.transport import Connection

B = 4
SSEP = 5
SPAN = Prefill.of("span", (SSEP, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20))  # three blocks
TWIN = Prefill.of("span", (SSEP, 10, 11, 12, 99, 99, 99, 99))  # SPAN's first block, then others
PREFIX = [0, 1, 2, 3]


def stored(hashes: list[int], token_ids: list[int], parent: int | None = None) -> dict[str, object]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": token_ids, "block_size": B}


def removed(hashes: list[int]) -> dict[str, object]:
    return {"type": "BlockRemoved", "block_hashes": hashes}


def scheduler() -> Scheduler:
    return Scheduler(Connection(httpx.AsyncClient(), RetryPolicy()), model="m", max_in_flight=1)


def ledger() -> BlockLedger:
    index = SpanIndex(B)
    index.watch([SPAN, TWIN])
    return BlockLedger(index)


def test_a_span_is_held_once_its_last_block_is_stored_after_its_first() -> None:
    blocks = ledger()
    assert blocks.stored([1, 2, 3], None, [*PREFIX, *SPAN.token_ids[:8]], B) == {}
    assert blocks.stored([4], 3, list(SPAN.token_ids[8:]), B) == {SPAN.key: 12}
    assert blocks.stored([7, 8], None, list(TWIN.token_ids), B) == {TWIN.key: 8}
    assert blocks.removed([3]) == {SPAN.key}  # its middle block
    assert blocks.removed([3, 42]) == set()


def test_the_last_block_alone_is_not_the_span() -> None:
    assert ledger().stored([4], None, list(SPAN.token_ids[8:]), B) == {}


def test_salted_spans_are_not_watched() -> None:
    index = SpanIndex(B)
    index.watch([SPAN.salted("tenant")])
    assert BlockLedger(index).stored([1, 2, 3], None, list(SPAN.token_ids), B) == {}


async def test_events_make_the_scheduler_learn_and_forget() -> None:
    blocks, sched = ledger(), scheduler()
    apply([stored([1, 2, 3], list(SPAN.token_ids))], blocks, sched)
    assert sched.holds(SPAN.key) and sched.load == 12
    apply([removed([2]), {"type": "SomethingNew"}], blocks, sched)
    assert not sched.holds(SPAN.key) and sched.load == 0
    apply([stored([7, 8], list(TWIN.token_ids)), {"type": "AllBlocksCleared"}], blocks, sched)
    assert not sched.holds(TWIN.key)


async def test_follow_reads_vllms_wire_format_and_forgets_on_a_gap() -> None:
    publisher = zmq.asyncio.Context.instance().socket(zmq.PUB)
    port = publisher.bind_to_random_port("tcp://127.0.0.1")
    blocks, sched = ledger(), scheduler()
    task = asyncio.create_task(follow(subscribe(f"tcp://127.0.0.1:{port}"), "r", blocks, sched))

    async def publish(seq: int, events: list[dict[str, object]]) -> None:
        batch = msgspec.msgpack.encode([1.0, events, None])  # KVEventBatch: array-like [ts, events, dp rank]
        await publisher.send_multipart([b"", seq.to_bytes(8, "big"), batch])
        await asyncio.sleep(0.05)

    try:
        for _ in range(100):  # PUB drops what it sends before the subscription is up
            await publish(0, [stored([1, 2, 3], list(SPAN.token_ids))])
            if sched.holds(SPAN.key):
                break
        assert sched.holds(SPAN.key)
        await publish(1, [stored([7, 8], list(TWIN.token_ids))])
        assert sched.holds(TWIN.key)
        await publish(3, [])  # batch 2 was lost
        assert not sched.holds(SPAN.key) and not sched.holds(TWIN.key)
    finally:
        task.cancel()
        publisher.close(linger=0)


def test_a_bad_events_address_gets_one_line() -> None:
    with pytest.raises(ConfigError, match="must be a ZMQ address such as tcp://host:5557, got 'host:5557'"):
        Endpoint("http://a", kv_events="host:5557")
