"""Client-SDK test helpers: an in-process fake `minipic serve` behind httpx.MockTransport.

The fake implements ``/minipic/info`` and ``/v1/completions`` (JSON and SSE),
simulates vLLM's prefix cache under MiniPIC's hashing rules (so
``cached_tokens`` means what it means on a real server), records every request
in order, and injects faults on demand.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from minipic_client import BlockAttention, RetryPolicy, SpanClient, Tokenizer
from minipic_client.placement import DP_RANK_HEADER
from minipic_protocol import ServerInfo, block_kind_of, kinds_of_prompt, opens_span, span_openers
from minipic_server.markers import HSEP_TOKEN, PAD_TOKEN, PDEP_TOKEN, SSEP_TOKEN

BLOCK_SIZE = 16
FAST_RETRY = RetryPolicy(attempts=4, total_s=5.0, initial_backoff_s=0.001, max_backoff_s=0.01)


@dataclass
class Recorded:
    kind: str  # "prefix", "span", "final" (streamed) or "other"
    prompt: list[int]
    body: dict[str, Any]
    received: int  # FakeServer's clock: when the request arrived
    completed: int | None = None  # when its answer was ready


class FakeServer:
    """A MiniPIC server stand-in.

    `faults` is consumed one entry per ``/v1/completions`` request: ``"503"``,
    ``"429"``, ``"400"`` (answers that status), ``"drop"`` (connection error
    before an answer), ``"break"`` (a stream that dies after its first chunk),
    ``"abort"`` (a stream whose second event is vLLM's error event, code 500), ``"cut"``
    (a stream closed cleanly after its first chunk, without ``[DONE]``), ``"shutdown"`` and
    ``"shutdown-midway"`` (vLLM shutting down: before its first token the stream holds only
    the usage event and ``[DONE]``, as vLLM drops that empty ``abort``; after it, a choice
    with finish reason ``abort``; a prefill's choices say ``abort``).
    While `down` is set, every request fails to connect (a stopped replica). `gapped_hits`:
    look past a miss as `minipic serve` does (default: vLLM's leading run, the cache most
    scheduling tests were written against).
    """

    gapped_hits = False

    def __init__(
        self, model_dir: Path, tokenizer: Any, *, max_num_seqs: int = 8, delay_s: float = 0.0
    ):
        vocab = tokenizer.get_vocab()
        self.ssep, self.pdep, self.pad = vocab[SSEP_TOKEN], vocab[PDEP_TOKEN], vocab[PAD_TOKEN]
        self.hsep = vocab[HSEP_TOKEN]
        self.info: dict[str, Any] = ServerInfo(
            block_size=BLOCK_SIZE,
            ssep_token_id=self.ssep,
            pdep_token_id=self.pdep,
            pad_token_id=self.pad,
            hsep_token_id=self.hsep,
            max_num_seqs=max_num_seqs,
            max_model_len=2048,
            model="tiny",
            tokenizer=str(model_dir),
            vllm_version="fake",
            minipic_version="fake",
            instance_id=uuid.uuid4().hex,
        ).to_json()
        self.delay_s = delay_s
        self.down = False
        self.headers: list[httpx.Headers] = []  # of every request
        self.faults: deque[str] = deque()
        self.requests: list[Recorded] = []  # one per prompt
        self.http_requests = 0  # completions requests (each may carry several prompts)
        self._clock = itertools.count()  # orders arrivals and completions
        self.in_flight = 0
        self.peak_in_flight = 0
        self._cache: set[int] = set()

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def evict(self) -> None:
        """Drop every cached block, as vLLM does under memory pressure (same instance)."""
        self._cache.clear()

    def restart(self) -> None:
        self._cache.clear()
        self.info = dict(self.info, instance_id=uuid.uuid4().hex)

    def of_kind(self, kind: str) -> list[Recorded]:
        return [r for r in self.requests if r.kind == kind]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused (replica down)")
        self.headers.append(request.headers)
        if request.url.path == "/minipic/info":
            return httpx.Response(200, json=self.info)
        assert request.headers["content-type"] == "application/json"  # what vLLM's FastAPI parses
        body = json.loads(request.content)
        self.http_requests += 1
        records = self._record(body)
        self.in_flight += len(records)
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            return self._answer(records, body, self.faults.popleft() if self.faults else None)
        finally:
            self.in_flight -= len(records)

    def _record(self, body: dict[str, Any]) -> list[Recorded]:
        """One record per prompt (a completions request may carry a list of prompts)."""
        prompts = body["prompt"]
        prompts = prompts if prompts and isinstance(prompts[0], list) else [prompts]
        records = []
        for prompt in prompts:
            if body.get("stream"):
                kind = "final"
            elif body.get("max_tokens") == 1:
                kind = "span" if opens_span(block_kind_of(prompt[0], self.ssep, self.pdep, self.hsep)) else "prefix"
            else:
                kind = "other"
            records.append(Recorded(kind, list(prompt), body, next(self._clock)))
        self.requests.extend(records)
        return records

    def _answer(self, records: list[Recorded], body: dict[str, Any], fault: str | None) -> httpx.Response:
        if fault == "drop":
            raise httpx.ConnectError("connection refused (injected)")
        if fault in ("503", "429", "400"):
            message = f"injected {fault}"
            return httpx.Response(
                int(fault), json={"error": {"message": message, "code": int(fault)}}
            )
        usage = {
            "prompt_tokens": sum(len(r.prompt) for r in records),
            "completion_tokens": body["max_tokens"] * len(records),
            "prompt_tokens_details": {
                "cached_tokens": sum(self._lookup_and_insert(r.prompt) for r in records)
            },
        }
        for record in records:
            record.completed = next(self._clock)
        tokens = [100 + i for i in range(body["max_tokens"])]
        if not body.get("stream"):
            choices = [
                {"index": i, "text": "".join(f"t{t} " for t in tokens),
                 "finish_reason": "abort" if fault and fault.startswith("shutdown") else "length"}
                for i in range(len(records))
            ]
            return httpx.Response(200, json={"choices": choices, "usage": usage})
        events = [
            {"choices": [{"index": 0, "text": f"t{t} ", "token_ids": [t], "finish_reason": None}]}
            for t in tokens
        ]
        events[-1]["choices"][0]["finish_reason"] = "length"
        events.append({"choices": [], "usage": usage})
        if fault == "abort":
            events[1:] = [{"error": {"message": "EngineCore encountered an issue (injected)", "code": 500}}]
        elif fault == "shutdown":  # vLLM drops an abort that comes before any token
            events = [{"choices": [], "usage": usage}]
        elif fault == "shutdown-midway":
            aborted = {"choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": "abort"}]}
            events[1:] = [aborted, {"choices": [], "usage": usage}]
        chunks = [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            content=_broken(chunks[0]) if fault == "break" else _chunks(chunks[:1] if fault == "cut" else chunks),
        )

    def _block_hashes(self, ids: list[int]) -> list[int]:
        """MiniPIC's rule: an SSep or HSep block hashes alone, the rest of its span chains on it, any
        other block hashes over everything before it."""
        hashes: list[int] = []
        full = ids[: len(ids) // BLOCK_SIZE * BLOCK_SIZE]
        openers = span_openers(kinds_of_prompt(full, BLOCK_SIZE, self.ssep, self.pdep, self.hsep))
        for index, opener in enumerate(openers):
            start = index * BLOCK_SIZE
            block = tuple(ids[start : start + BLOCK_SIZE])
            if opener == index:
                hashes.append(hash(("span", block)))
            elif opener is not None:
                hashes.append(hash((hashes[-1], block)))
            else:
                hashes.append(hash(("prefix", tuple(ids[: start + BLOCK_SIZE]))))
        return hashes

    def _lookup_and_insert(self, ids: list[int]) -> int:
        """The leading run of cached blocks (vLLM's lookup), or with `gapped_hits` every cached
        block, also after a miss (`minipic serve`'s); never the block holding the last token."""
        hashes = self._block_hashes(ids)
        usable = hashes[: (len(ids) - 1) // BLOCK_SIZE]
        if self.gapped_hits:
            hits = sum(1 for h in usable if h in self._cache)
        else:
            hits = next((i for i, h in enumerate(usable) if h not in self._cache), len(usable))
        self._cache.update(hashes)
        return hits * BLOCK_SIZE


async def _chunks(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _broken(first: bytes) -> AsyncIterator[bytes]:
    yield first
    raise httpx.ReadError("connection reset (injected)")


@pytest.fixture(scope="session")
def sdk_tokenizer(tiny_model_dir: Path) -> Any:
    """The reference: transformers' tokenizer, as the client used before it dropped transformers."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="session")
def client_tokenizer(tiny_model_dir: Path) -> Tokenizer:
    """The client's own tokenizer (no transformers)."""
    return Tokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def fake_server(tiny_model_dir: Path, sdk_tokenizer: Any) -> FakeServer:
    return FakeServer(tiny_model_dir, sdk_tokenizer)


@pytest.fixture
def fake_client(fake_server: FakeServer, client_tokenizer: Tokenizer) -> Callable[..., SpanClient]:
    """``fake_client(**options)``: a SpanClient on `fake_server`, fast retries, the tiny
    tokenizer (``tokenizer=None`` loads the one the server names instead)."""

    def make(**options: Any) -> SpanClient:
        options.setdefault("retry", FAST_RETRY)
        options.setdefault("tokenizer", client_tokenizer)
        options.setdefault("technique", BlockAttention())  # the scheduling tests' short documents are spans
        return SpanClient("http://fake", transport=fake_server.transport, **options)

    return make


class FakeFleet:
    """Replicas of `FakeServer` by endpoint name, behind one transport that sends each
    request to the server its host and ``X-data-parallel-rank`` name."""

    def __init__(self, model_dir: Path, tokenizer: Any, client_tokenizer: Tokenizer, names: list[str]) -> None:
        self.servers = {name: FakeServer(model_dir, tokenizer) for name in names}
        self._client_tokenizer = client_tokenizer

    async def handle(self, request: httpx.Request) -> httpx.Response:
        rank = request.headers.get(DP_RANK_HEADER)
        name = f"http://{request.url.host}" + ("" if rank is None else f"#dp={rank}")
        return await self.servers[name].handle(request)

    def client(self, endpoints: Any = None, **options: Any) -> SpanClient:
        options.setdefault("retry", FAST_RETRY)
        options.setdefault("tokenizer", self._client_tokenizer)
        options.setdefault("technique", BlockAttention())  # placement tests: every document one span
        return SpanClient(endpoints or list(self.servers), transport=httpx.MockTransport(self.handle), **options)


@pytest.fixture
def fake_fleet(
    tiny_model_dir: Path, sdk_tokenizer: Any, client_tokenizer: Tokenizer
) -> Callable[[list[str]], FakeFleet]:
    """``fake_fleet(names)``: fake replicas named as `Endpoint.name` names them."""
    return lambda names: FakeFleet(tiny_model_dir, sdk_tokenizer, client_tokenizer, names)
