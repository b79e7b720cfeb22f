"""What a replica really caches, from vLLM's KV events.

Otherwise the client's record of a replica is what it sent there, corrected only when a
final comes back short. A server started with ``--kv-events-config '{"enable_kv_cache_events":
true, "publisher": "zmq", "endpoint": "tcp://*:5557"}'`` publishes every block it stores
and evicts (``BlockStored``/``BlockRemoved``/``AllBlocksCleared``, vLLM 0.26 and 0.32
alike); with them the client forgets an evicted span before a prompt misses it, and
learns the spans a final computed inline. Events carry tokens, not span names: a span is
recognised by the digests of its blocks' tokens, its first block anywhere (an SSep block
hashes alone) and each next one after the previous. Unsalted spans only: events do not
name a request's salt.
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from minipic_client.errors import ConfigError
from minipic_client.prompt import Prefill
from minipic_client.scheduler import Scheduler

logger = logging.getLogger("minipic_client")

_Place = tuple[bytes, int]  # a span's key and the index of one of its blocks


def _digests(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    return [
        hashlib.blake2b(array("q", token_ids[start : start + block_size]).tobytes(), digest_size=16).digest()
        for start in range(0, len(token_ids) - block_size + 1, block_size)
    ]


class SpanIndex:
    """The spans the client sends, by the digests of their blocks (no tokens kept)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.blocks: dict[bytes, tuple[bytes, ...]] = {}
        self.starting: dict[bytes, set[bytes]] = {}

    def watch(self, prefills: Iterable[Prefill]) -> None:
        for prefill in prefills:
            if prefill.kind != "span" or prefill.cache_salt is not None or prefill.key in self.blocks:
                continue
            digests = tuple(_digests(prefill.token_ids, self.block_size))
            if digests:
                self.blocks[prefill.key] = digests
                self.starting.setdefault(digests[0], set()).add(prefill.key)


class BlockLedger:
    """One replica's stored blocks that belong to watched spans."""

    def __init__(self, index: SpanIndex) -> None:
        self._index = index
        self._at: dict[int, set[_Place]] = {}

    def stored(
        self, hashes: Sequence[int], parent: int | None, token_ids: Sequence[int], block_size: int
    ) -> dict[bytes, int]:
        """Record stored blocks; return the spans whose last block this stored, with their sizes."""
        index: SpanIndex = self._index
        complete: dict[bytes, int] = {}
        previous = self._at.get(parent, set()) if parent is not None else set()
        for block_hash, digest in zip(hashes, _digests(token_ids, block_size)):
            here = {(key, 0) for key in index.starting.get(digest, ())}
            here |= {
                (key, i + 1) for key, i in previous
                if i + 1 < len(index.blocks[key]) and index.blocks[key][i + 1] == digest
            }
            if here:
                self._at.setdefault(block_hash, set()).update(here)
                complete.update(
                    (key, (i + 1) * block_size) for key, i in here if i == len(index.blocks[key]) - 1
                )
            previous = here
        return complete

    def removed(self, hashes: Iterable[int]) -> set[bytes]:
        """Forget removed blocks; return the spans that lost one."""
        return {key for block_hash in hashes for key, _ in self._at.pop(block_hash, ())}

    def clear(self) -> None:
        self._at.clear()


def apply(events: Iterable[Any], ledger: BlockLedger, scheduler: Scheduler) -> None:
    """One decoded ``KVEventBatch``'s events, applied to a replica's scheduler."""
    for event in events:
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "BlockStored":
            complete = ledger.stored(
                event["block_hashes"], event.get("parent_block_hash"), event["token_ids"], event["block_size"]
            )
            for key, size in complete.items():
                scheduler.record(key, size)
        elif kind == "BlockRemoved":
            scheduler.drop(ledger.removed(event["block_hashes"]))
        elif kind == "AllBlocksCleared":
            ledger.clear()
            scheduler.forget()


def subscribe(address: str) -> Any:
    """A ZMQ subscriber to `address` (pyzmq is an optional extra)."""
    try:
        import zmq
        import zmq.asyncio
    except ImportError:
        raise ConfigError("kv_events needs pyzmq: pip install 'minipic[kv-events]'") from None
    socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
    socket.connect(address)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    return socket


async def follow(socket: Any, name: str, ledger: BlockLedger, scheduler: Scheduler) -> None:
    """Apply a replica's event stream (a `subscribe` socket) until cancelled. A gap in the
    sequence numbers (lost events, a restarted server) forgets everything: the record
    could be wrong either way."""
    expected: int | None = None
    try:
        while True:
            frames = await socket.recv_multipart()
            if len(frames) != 3:
                continue
            seq = int.from_bytes(frames[1], "big", signed=True)
            if expected is not None and seq != expected:
                logger.warning("%s: KV events %d..%d lost; forgetting what it holds", name, expected, seq - 1)
                ledger.clear()
                scheduler.forget()
            expected = seq + 1
            try:
                batch = msgspec.msgpack.decode(frames[2])
                apply(batch[1], ledger, scheduler)
            except (msgspec.DecodeError, LookupError, TypeError) as exc:
                logger.warning("%s: unreadable KV event batch %d: %s", name, seq, exc)
    finally:
        socket.close(linger=0)
