"""`SpanClient`: RAG and part-built prompts against a MiniPIC server."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from minipic_client.errors import (
    ConfigError,
    MiniPICError,
    PromptError,
    PromptTooLongError,
    RequestError,
    ServerError,
    StreamInterruptedError,
    TransportError,
)
from minipic_client.kv_events import BlockLedger, SpanIndex, follow, subscribe
from minipic_client.placement import Endpoint, Placement, Route, SpanAffinity, affinity_key, endpoints_of
from minipic_client.prompt import (
    TECHNIQUES,
    BlockAttention,
    ChatTemplate,
    Dependent,
    LeadInContext,
    Part,
    Prefill,
    PromptBuilder,
    PromptLayout,
    Span,
    Technique,
    Text,
    check_documents,
)
from minipic_client.replicas import Replica
from minipic_client.scheduler import RequestEvent, Scheduler, Strategy, run
from minipic_client.tokenizer import Tokenizer
from minipic_client.tokens import TokenCache
from minipic_client.transport import RetryLog, RetryPolicy, Usage, usage_of
from minipic_protocol import InfoError, ServerInfo

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger("minipic_client")

DEFAULT_TIMEOUT = httpx.Timeout(300.0, connect=10.0)
# The default where the server hides heads: the first document as text continuing the prompt,
# then every document as a span, the first again with its head hidden, the next four with refreshed
# heads (docs/accuracy.md).
_LEAD_TEXT_REPEAT, _BLOCK_ATTENTION = TECHNIQUES["lead-text-repeat-hidden-refreshed4-heads"], BlockAttention()


@dataclass(frozen=True, slots=True)
class RagRequest:
    """One RAG sample: a system prompt, documents (each a span) and a task."""

    task: str
    docs: Sequence[str] = ()
    system: str | None = None
    modules: Sequence[str] = ()
    technique: Technique | None = None  # None: the client's `default_technique`
    raw: bool = False
    max_tokens: int = 64
    temperature: float = 0.0
    cache_salt: str | None = None


@dataclass(frozen=True, slots=True)
class RagResult:
    """A completion. `ttft_s` runs from the call (or, in `rag_many`, from the
    sample's start) to the first generated token, prefills and queueing included.

    What the call cost: `computed_tokens` are the prompt tokens the server computed
    for it (the span prefills it sent and its final prompt's uncached tokens, as the
    server reported them); `reused_tokens` are the final prompt's other tokens, computed
    before the call. `cached_tokens` is the final prompt's own cache hit, which counts
    the spans this call just prefilled too. None: the server reports no cache hits.
    """

    text: str
    token_ids: list[int]
    ttft_s: float
    cached_tokens: int | None
    prompt_tokens: int
    finish_reason: str | None
    computed_tokens: int | None = None

    @property
    def reused_tokens(self) -> int | None:
        if self.computed_tokens is None:
            return None
        return max(self.prompt_tokens - self.computed_tokens, 0)

    def __add__(self, other: RagResult) -> RagResult:
        """Stream chunks (`SpanClient.rag_chunks`) add up to the whole result, as LangChain
        adds a stream's chunks: text and token ids concatenated, the last chunk's usage."""
        return RagResult(
            text=self.text + other.text,
            token_ids=[*self.token_ids, *other.token_ids],
            ttft_s=self.ttft_s,
            cached_tokens=other.cached_tokens if other.cached_tokens is not None else self.cached_tokens,
            prompt_tokens=other.prompt_tokens or self.prompt_tokens,
            finish_reason=other.finish_reason or self.finish_reason,
            computed_tokens=other.computed_tokens if other.computed_tokens is not None else self.computed_tokens,
        )


@dataclass(frozen=True, slots=True)
class _Job:
    layout: PromptLayout
    max_tokens: int
    temperature: float
    cache_salt: str | None
    prefills: tuple[Prefill, ...]
    inline: bool  # `Strategy.INLINE`: the spans no one sent go in the final prompt

    @classmethod
    def of(
        cls, layout: PromptLayout, max_tokens: int, temperature: float, cache_salt: str | None, strategy: Strategy
    ) -> _Job:
        """A job whose prefills carry its salt: salted blocks are cached apart, so they are sent apart."""
        prefills = layout.prefills if cache_salt is None else tuple(p.salted(cache_salt) for p in layout.prefills)
        return cls(layout, max_tokens, temperature, cache_salt, prefills, strategy.inline)


class _Completion:
    """Accumulates a streamed completion."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.first_token_at: float | None = None
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.prefill_computed: int | None = 0  # what the call's own prefills computed

    def add(self, event: dict[str, Any]) -> str:
        """Take one stream event; return its text delta."""
        delta = ""
        for choice in event.get("choices") or ():
            text, ids = choice.get("text") or "", choice.get("token_ids") or ()
            if self.first_token_at is None and (text or ids):
                self.first_token_at = time.perf_counter()
            delta += text
            self.token_ids.extend(ids)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        self.usage = usage_of(event) or self.usage
        self.text.append(delta)
        return delta

    def result(self, started: float, layout: PromptLayout) -> RagResult:
        first = self.first_token_at if self.first_token_at is not None else time.perf_counter()
        cached = self.usage.cached_tokens if self.usage else None
        prompt_tokens = self.usage.prompt_tokens if self.usage else len(layout.token_ids)
        computed = None
        if cached is not None and self.prefill_computed is not None:
            computed = self.prefill_computed + prompt_tokens - cached
        return RagResult(
            text="".join(self.text),
            token_ids=self.token_ids,
            ttft_s=first - started,
            cached_tokens=cached,
            prompt_tokens=prompt_tokens,
            finish_reason=self.finish_reason,
            computed_tokens=computed,
        )


@dataclass(slots=True)
class _Session:
    """What `connect` learns; everything that needs it is built here at once."""

    tokenizer: Tokenizer
    builder: PromptBuilder
    chat: ChatTemplate | None
    max_model_len: int  # the least of the replicas'


class SpanClient:
    """A MiniPIC server's client: lays prompts out as spans, prefills each span
    once, and sends final prompts under the server's concurrency limit.

    Several replicas (a list of URLs, or `Endpoint` ranks of one data-parallel
    server): `placement` chooses where each job's spans and final go (by default
    `SpanAffinity`: where most of its span tokens are, a new span at its rendezvous
    home), each replica under its own concurrency limit. A replica that fails for
    `failover_s` sits out as long and its work moves to the others; it is tried
    again after that. docs/scale-out.md has the details.

    Configuration comes from ``GET /minipic/info`` on `connect` (``async with``
    does it). The tokenizer is the server's (its ``tokenizer.json`` and chat template,
    read without transformers) unless `tokenizer` names or is another one.

    Server restarts: the client remembers which spans it prefilled. When a final
    prompt reports fewer cached tokens than its layout promises, it re-reads
    ``/minipic/info`` (at most every `info_check_interval_s`); a new
    ``instance_id`` makes it forget its prefills, so the next calls prefill again.
    A restart that changes the model, tokenizer, block size or markers raises
    `ConfigError`: prompts built for the old server would be wrong.

    Tenants: `cache_salt` (per client, or per call) is sent with every request;
    vLLM shares cached blocks only between requests with the same salt.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1``
            is dropped), an `Endpoint`, or a list of them (replicas of one model).
        tokenizer: a `Tokenizer`, or a tokenizer directory or Hugging Face name,
            when the server's tokenizer path is not readable here.
        max_in_flight: concurrent requests per replica (default: its ``max_num_seqs``).
        retry: backoff for connection errors, 429 and 5xx.
        timeout: httpx timeout per request.
        transport: an httpx transport (``httpx.MockTransport`` in tests).
        on_request: called with a `RequestEvent` after every request.
        info_check_interval_s: least time between two restart checks.
        allow_stock_server: accept a server without ``/minipic/info`` (stock vLLM, for
            comparisons): only ``Strategy.BASELINE`` (plain prompts) works there, and
            `tokenizer` and `max_in_flight` must be given.
        cache_salt: the default salt of every request (``None``: unsalted).
        placement: where jobs go among several replicas.
        failover_s: with several replicas, how long one is retried before its work
            moves to the others (and how long it then sits out).
        affinity_header: a header that carries each job's `affinity_key` on its
            requests, for a router that hashes on it (docs/scale-out.md).
    """

    def __init__(
        self,
        base_url: str | Endpoint | Sequence[str | Endpoint],
        *,
        tokenizer: str | os.PathLike[str] | Tokenizer | None = None,
        max_in_flight: int | None = None,
        retry: RetryPolicy = RetryPolicy(),
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        on_request: Callable[[RequestEvent], None] | None = None,
        info_check_interval_s: float = 1.0,
        allow_stock_server: bool = False,
        cache_salt: str | None = None,
        technique: Technique | None = None,
        placement: Placement = SpanAffinity(),
        failover_s: float = 5.0,
        affinity_header: str | None = None,
    ) -> None:
        if max_in_flight is not None and max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be at least 1, got {max_in_flight}")
        if not failover_s > 0:
            raise ConfigError(f"failover_s must be positive, got {failover_s!r}")
        if affinity_header is not None and not re.fullmatch(r"[A-Za-z0-9-]+", str(affinity_header)):
            raise ConfigError(
                f"affinity_header must be a header name such as X-MiniPIC-Affinity, got {affinity_header!r}"
            )
        check_cache_salt(cache_salt)
        endpoints = endpoints_of(base_url)
        # With others to fail over to, a replica is retried only for failover_s.
        retry_one = retry if len(endpoints) == 1 else retry.capped(failover_s)
        self._replicas = tuple(Replica(e, transport or pooled_transport(), retry_one, timeout) for e in endpoints)
        self._retry = retry
        self._resend_log = RetryLog()  # streams sent again, whichever replica
        self._placement = placement
        self._failover_s = failover_s
        self._affinity_header = affinity_header
        self._span_index: SpanIndex | None = None  # with KV events: the spans to recognise in them
        self._followers: list[asyncio.Task[None]] = []
        self._cache_salt = cache_salt
        self._tokenizer_arg = tokenizer
        self._max_in_flight = max_in_flight
        self._on_request = on_request
        self._info_check_interval_s = info_check_interval_s
        self._allow_stock_server = allow_stock_server
        self._modules: dict[str, str] = {}
        self._session: _Session | None = None
        self._technique = technique
        self._warned_no_hsep = False

    async def __aenter__(self) -> SpanClient:
        try:
            await self.connect()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def connect(self) -> ServerInfo:
        """Read every replica's info (they must agree on the layout) and load the tokenizer."""
        infos = await asyncio.gather(*(self._fetch_info(r, quick=True) for r in self._replicas))
        info = infos[0]
        for replica, other in zip(self._replicas[1:], infos[1:]):
            if other.layout_key != info.layout_key:
                raise ConfigError(
                    f"{replica.name} serves {other.layout_key} but {self._replicas[0].name} serves "
                    f"{info.layout_key}: replicas must share model, tokenizer, block size and markers"
                )
        tokenizer = self._tokenizer_arg
        if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = await asyncio.to_thread(Tokenizer.from_pretrained, tokenizer or info.tokenizer)
        elif not isinstance(tokenizer, Tokenizer):
            raise ConfigError(
                "tokenizer= takes a tokenizer directory, a Hugging Face name or a minipic_client.Tokenizer, "
                f"not a {type(tokenizer).__name__}"
            )
        if info.marker_ids and max(info.marker_ids) >= len(tokenizer):
            raise ConfigError(
                f"marker ids {sorted(info.marker_ids)} are outside the tokenizer's "
                f"{len(tokenizer)} tokens: is it the server's tokenizer?"
            )
        builder = PromptBuilder(
            TokenCache(tokenizer, info.marker_ids),
            block_size=info.block_size,
            ssep_token_id=info.ssep_token_id,
            pdep_token_id=info.pdep_token_id,
            pad_token_id=info.pad_token_id,
            hsep_token_id=info.hsep_token_id,
        )
        for replica, replica_info in zip(self._replicas, infos):
            scheduler = Scheduler(
                replica.conn,
                model=replica_info.model,
                max_in_flight=self._max_in_flight or replica_info.max_num_seqs,
                on_request=self._on_request,
                name=replica.name,
            )
            replica.attach(replica_info, scheduler)
        self._follow_kv_events(info.block_size)
        chat = ChatTemplate(tokenizer) if tokenizer.chat_template else None
        max_model_len = min(i.max_model_len for i in infos)
        self._session = _Session(tokenizer, builder, chat, max_model_len)
        return info

    async def aclose(self) -> None:
        for task in self._followers:
            task.cancel()
        await asyncio.gather(*self._followers, return_exceptions=True)
        for replica in self._replicas:
            await replica.http.aclose()

    def _follow_kv_events(self, block_size: int) -> None:
        """Start following the KV events of every endpoint that publishes them."""
        publishing = [r for r in self._replicas if r.endpoint.kv_events is not None]
        if not publishing or self._followers:
            return
        self._span_index = SpanIndex(block_size)
        for replica in publishing:
            socket = subscribe(str(replica.endpoint.kv_events))
            ledger = BlockLedger(self._span_index)
            self._followers.append(asyncio.create_task(follow(socket, replica.name, ledger, replica.scheduler)))

    @property
    def info(self) -> ServerInfo:
        """The (first) server's info, as last read."""
        return self._replicas[0].info

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(r.endpoint for r in self._replicas)

    @property
    def tokenizer(self) -> Tokenizer:
        return self._live.tokenizer

    @property
    def default_technique(self) -> Technique:
        """The layout `rag` uses when a call names none: the client's ``technique=``, else the
        first document as text, then every document, the first again as a hidden sink (read in
        context already), the next four with refreshed heads and the others' heads hidden
        (``--layout lead-text-repeat-hidden-refreshed4-heads``): a model not trained for block
        attention answers from it within 3 points of full attention on every question family
        measured over six ranked documents (not over ten), the cheapest of the layouts measured
        that are, computing a refreshed head only where a ranked prompt reads most
        (docs/accuracy.md); `BlockAttention` on a server without hidden heads (no
        ``hsep_token_id``), with a warning once."""
        if self._technique is not None:
            return self._technique
        if self.info.hsep_token_id is not None:
            return _LEAD_TEXT_REPEAT
        if not self._warned_no_hsep:
            self._warned_no_hsep = True
            logger.warning(
                "the server has no hidden-head marker (hsep_token_id): rag() defaults to BlockAttention, "
                "which loses accuracy on models not trained for it; see docs/accuracy.md"
            )
        return _BLOCK_ATTENTION

    @property
    def computed_tokens(self) -> int:
        """Prompt tokens the server computed (not cached) for this client's requests so far,
        span prefills included: what a run cost, as the server reported it."""
        return sum(r.scheduler.computed_tokens for r in self._replicas)

    @property
    def _live(self) -> _Session:
        if self._session is None:
            raise ConfigError(
                "not connected: use `async with SpanClient(...)` or `await connect()`"
            )
        return self._session

    def add_module(self, name: str, text: str) -> None:
        """Prompt Cache: register a named reusable module (a span) for ``rag(modules=[name])``."""
        check_documents([text])
        self._modules[name] = text

    def layout(
        self,
        parts: Sequence[Part],
        *,
        strategy: Strategy = Strategy.ISPS,
        add_special_tokens: bool = True,
    ) -> PromptLayout:
        """Token layout of a part-built prompt; raises `PromptTooLongError` before sending."""
        session = self._live
        if strategy.pic and not self.info.pic:
            raise ConfigError(
                f"{self._replicas[0].base_url} is a stock vLLM server: only strategy=baseline "
                "(plain prompts) works there"
            )
        max_model_len = session.max_model_len
        layout = session.builder.build(
            parts, pic=strategy.pic, add_special_tokens=add_special_tokens
        )
        if len(layout.token_ids) >= max_model_len:
            raise PromptTooLongError(len(layout.token_ids), max_model_len)
        return layout

    def rag_layout(
        self, request: RagRequest, *, strategy: Strategy = Strategy.ISPS
    ) -> PromptLayout:
        """Token layout of a RAG prompt: the chat template's turns unless `raw` or the
        tokenizer has none, then ``[BOS system][modules][documents][PDep task]``."""
        check_documents(request.docs)
        if not isinstance(request.task, str) or not request.task.strip():
            raise PromptError(f"task must be a non-empty string, got {request.task!r}")
        technique = self._technique_for(request, strategy)
        laid_out = technique.documents(request.docs)
        if request.modules and laid_out and isinstance(laid_out[0], Text):
            raise PromptError(
                f"{technique!r} continues the system prompt with the first documents as text, so they "
                "cannot follow modules (spans); pass modules=() or another technique"
            )
        documents = [*(Span(self._module(name)) for name in request.modules), *laid_out]
        chat = self._live.chat
        if chat is not None and not request.raw:
            parts = chat.parts(request.system, documents, request.task)
            return self.layout(parts, strategy=strategy, add_special_tokens=False)
        head: list[Part] = [Text(request.system)] if request.system else []
        return self.layout([*head, *documents, Dependent(request.task)], strategy=strategy)

    def _technique_for(self, request: RagRequest, strategy: Strategy) -> Technique:
        """The call's technique, else the client's default. A plain prompt (``BASELINE``) holds
        each document once, in order: a default's extra parts (a document repeated, a header)
        are its PIC layout, not the prompt. Modules are spans before the documents, where no
        document can continue the system prompt as text: a default that leads with text lays a
        call with modules out by its `rest` (refreshed heads)."""
        if request.technique is not None:
            return request.technique
        if not strategy.pic:
            return _BLOCK_ATTENTION  # its spans, built without markers, are the documents' text
        default = self.default_technique
        if request.modules and isinstance(default, LeadInContext) and default.as_text:
            return default.rest
        return default

    async def generate(
        self,
        parts: Sequence[Part],
        *,
        max_tokens: int = 64,
        temperature: float = 0.0,
        strategy: Strategy = Strategy.ISPS,
        add_special_tokens: bool = True,
        cache_salt: str | None = None,
    ) -> RagResult:
        """Complete a prompt built from `Text`, `Span` and `Dependent` parts."""
        started = time.perf_counter()
        layout = self.layout(parts, strategy=strategy, add_special_tokens=add_special_tokens)
        job = _Job.of(layout, max_tokens, temperature, self._salt(cache_salt), strategy)
        return await self._complete(job, started)

    async def rag(
        self,
        *,
        task: str,
        docs: Sequence[str] = (),
        system: str | None = None,
        modules: Sequence[str] = (),
        technique: Technique | None = None,
        raw: bool = False,
        max_tokens: int = 64,
        temperature: float = 0.0,
        strategy: Strategy = Strategy.ISPS,
        cache_salt: str | None = None,
    ) -> RagResult:
        """Answer `task` over `docs`, each document a span reused across calls.

        A single call prefills its own spans and then sends its final prompt, so
        ISPS and BATCHED coincide here; INLINE sends the spans no one has sent inside
        the final prompt; BASELINE sends the plain prompt.
        """
        started = time.perf_counter()
        request = RagRequest(
            task, docs, system, modules, technique, raw, max_tokens, temperature, cache_salt
        )
        return await self._complete(self._job(request, strategy), started)

    async def rag_stream(
        self,
        *,
        task: str,
        docs: Sequence[str] = (),
        system: str | None = None,
        modules: Sequence[str] = (),
        technique: Technique | None = None,
        raw: bool = False,
        max_tokens: int = 64,
        temperature: float = 0.0,
        strategy: Strategy = Strategy.ISPS,
        cache_salt: str | None = None,
    ) -> AsyncGenerator[str, None]:
        """`rag`, yielding text deltas as they are generated.

        The stream holds one request slot until it ends; to stop early, close it
        (``async with contextlib.aclosing(client.rag_stream(...)) as deltas``)."""
        request = RagRequest(
            task, docs, system, modules, technique, raw, max_tokens, temperature, cache_salt
        )
        async with aclosing(self.rag_chunks(request, strategy=strategy)) as chunks:
            async for chunk in chunks:
                if chunk.text:
                    yield chunk.text

    async def rag_chunks(
        self, request: RagRequest, *, strategy: Strategy = Strategy.ISPS
    ) -> AsyncGenerator[RagResult, None]:
        """`rag_stream` as `RagResult` chunks that add up (``+``) to `rag`'s result: one per
        text delta (its text and token ids), then an empty one with the usage and finish
        reason. Like `rag_stream`, not sent again once the first chunk is out."""
        started = time.perf_counter()
        job = self._job(request, strategy)
        completion = _Completion()
        seen = 0
        async with aclosing(self._answer(job, completion)) as deltas:
            async for delta in deltas:
                ids, seen = completion.token_ids[seen:], len(completion.token_ids)
                if delta or ids:
                    ttft = (completion.first_token_at or time.perf_counter()) - started
                    yield RagResult(delta, ids, ttft, None, 0, None)
        last = completion.result(started, job.layout)
        yield RagResult("", [], last.ttft_s, last.cached_tokens, last.prompt_tokens, last.finish_reason,
                        last.computed_tokens)

    async def rag_many(
        self,
        requests: Iterable[RagRequest],
        *,
        strategy: Strategy = Strategy.ISPS,
        window: int | None = None,
    ) -> AsyncGenerator[tuple[int, RagResult | MiniPICError], None]:
        """Run many samples under `strategy`; yield ``(index, result or error)`` as
        each finishes. A sample's error does not stop the others. See
        `Scheduler.run` for `window`."""
        jobs = (self._job_or_error(request, strategy) for request in requests)
        max_in_flight = sum(r.scheduler.max_in_flight for r in self._replicas)
        outcomes = run(
            jobs, strategy, self._complete, prefill=self._prefill_all, max_in_flight=max_in_flight, window=window
        )
        async with aclosing(outcomes):
            async for outcome in outcomes:
                yield outcome

    async def preload(self, requests: Iterable[RagRequest], *, strategy: Strategy = Strategy.ISPS) -> None:
        """Make the spans of `requests` resident without answering them: a warm cache, as
        where documents recur. Later calls over those documents send only their finals."""
        await self._prefill_all([self._job(request, strategy) for request in requests])

    def _module(self, name: str) -> str:
        try:
            return self._modules[name]
        except KeyError:
            raise PromptError(f"unknown module {name!r}: register it with add_module()") from None

    def _salt(self, cache_salt: str | None) -> str | None:
        check_cache_salt(cache_salt)
        return self._cache_salt if cache_salt is None else cache_salt

    def _job(self, request: RagRequest, strategy: Strategy) -> _Job:
        layout = self.rag_layout(request, strategy=strategy)
        return _Job.of(layout, request.max_tokens, request.temperature, self._salt(request.cache_salt), strategy)

    def _job_or_error(self, request: RagRequest, strategy: Strategy) -> _Job | MiniPICError:
        try:
            return self._job(request, strategy)
        except MiniPICError as exc:
            return exc

    async def _complete(self, job: _Job, started: float) -> RagResult:
        """`_answer` collected. A stream that broke midway (a server restart) is sent
        again: unlike `rag_stream`, nothing was handed out yet, so nothing repeats."""
        try:
            return await self._collect(job, started)
        except StreamInterruptedError as exc:
            logger.warning("%s: sending it again", exc)
        resend = self._retry.retrying(self._resend_log, (StreamInterruptedError,))
        return await resend(self._collect, job, started)

    async def _collect(self, job: _Job, started: float) -> RagResult:
        completion = _Completion()
        async with aclosing(self._answer(job, completion)) as deltas:
            async for _ in deltas:
                pass
        return completion.result(started, job.layout)

    async def _answer(self, job: _Job, completion: _Completion) -> AsyncGenerator[str, None]:
        """The one request path of every call: the job's prefills (``inline``: a claim on
        those no one has sent, which its final computes), then its final prompt streamed
        into `completion`, yielding text deltas, where placement
        routes them; a cached shortfall makes the client check whether that replica
        restarted. A replica that fails sits out and, until its first token, the job
        is routed again among the others."""
        deadline = time.monotonic() + self._retry.total_s
        headers = self._headers(job)
        if self._span_index is not None:
            self._span_index.watch(job.prefills)
        while True:
            route = await self._route(job, deadline)
            replica = route.prefill
            claim = None
            try:
                if job.inline and route.prefill is route.final:
                    claim, others = replica.scheduler.claim(job.prefills)
                    completion.prefill_computed = 0  # what it claims, its final computes and reports
                    await others
                else:
                    completion.prefill_computed = await replica.scheduler.prefill(job.prefills, headers)
                replica = route.final
                events = replica.scheduler.stream(
                    job.layout.token_ids,
                    max_tokens=job.max_tokens,
                    temperature=job.temperature,
                    cache_salt=job.cache_salt,
                    headers=headers,
                )
                async with aclosing(events):
                    async for event in events:
                        delta = completion.add(event)
                        if claim is not None and completion.first_token_at is not None:
                            claim.settle(True)  # a token came: the whole prompt is prefilled and cached
                        yield delta
                break
            except (ServerError, TransportError) as exc:
                if len(self._replicas) == 1:
                    raise
                replica.sit_out(exc, self._failover_s)
                if completion.first_token_at is not None:  # `_complete` sends it again, `rag_stream` cannot
                    if isinstance(exc, StreamInterruptedError):
                        raise
                    raise StreamInterruptedError(f"{replica.name} failed mid-answer: {exc}") from exc
            finally:
                if claim is not None:  # no event came: nothing was stored for the others
                    claim.settle(False)
        cached = completion.usage.cached_tokens if completion.usage else None
        computed_here = claim.tokens if claim is not None else 0
        if cached is not None and cached < job.layout.cacheable_tokens - computed_here:
            # Evicted (or lost to a restart): the next sample that needs them prefills them again.
            route.final.scheduler.forget(job.prefills)
            await self._check_restart(route.final)

    async def _route(self, job: _Job, deadline: float) -> Route[Replica]:
        """The placement's choice among the replicas that are up; with none up, wait
        for the first to be tried again, until `deadline`."""
        while True:
            now = time.monotonic()
            if up := [r for r in self._replicas if r.up(now)]:
                return self._placement.route(job.prefills, up)
            wake = min(r.down_until for r in self._replicas)
            if wake > deadline:
                raise TransportError(
                    f"every replica failed ({', '.join(r.name for r in self._replicas)}) and none "
                    "is due back within the retry policy's total_s"
                )
            await asyncio.sleep(wake - now)

    async def _prefill_all(self, jobs: list[_Job]) -> None:
        """BATCHED's barrier: each job's prefills, sent where its final will go."""
        up = [r for r in self._replicas if r.up(time.monotonic())] or list(self._replicas)
        if self._span_index is not None:
            self._span_index.watch(p for job in jobs for p in job.prefills)
        sent = [
            self._placement.route(job.prefills, up).prefill.scheduler.send(job.prefills, self._headers(job))
            for job in jobs
        ]
        await asyncio.gather(*sent)

    def _headers(self, job: _Job) -> dict[str, str] | None:
        """The job's affinity header, when the client sends one and the job has spans."""
        key = None if self._affinity_header is None else affinity_key(job.prefills)
        return None if self._affinity_header is None or key is None else {self._affinity_header: key}

    async def _check_restart(self, replica: Replica) -> None:
        """Forget the replica's prefilled spans if it restarted (rate-limited)."""
        now = time.monotonic()
        if now - replica.info_checked_at < self._info_check_interval_s:
            return
        replica.info_checked_at = now
        try:
            info = await self._fetch_info(replica, quick=True)
        except (ServerError, TransportError) as exc:
            # The completion itself succeeded; the next shortfall checks again.
            logger.warning("could not re-read /minipic/info: %s", exc)
            return
        old = replica.info
        if info.instance_id == old.instance_id:
            return
        if info.layout_key != old.layout_key:
            raise ConfigError(
                f"the server {replica.name} restarted with a different setup ({old.layout_key} -> "
                f"{info.layout_key}); create a new SpanClient"
            )
        logger.info("%s restarted (instance %s): prefilling spans again", replica.name, info.instance_id)
        replica.scheduler.forget()
        replica.info = info

    async def _fetch_info(self, replica: Replica, *, quick: bool = False) -> ServerInfo:
        try:
            data = await replica.conn.get_json("/minipic/info", quick=quick)
        except RequestError as exc:
            if exc.status_code != 404:
                raise
            if self._allow_stock_server:
                return await self._stock_info(replica)
            raise ConfigError(
                f"{replica.base_url} is not a MiniPIC server: GET /minipic/info answered "
                f"404 ({exc.message}); start it with `minipic serve`, or send it plain prompts "
                "(allow_stock_server=True; `minipic batch --strategy baseline`)"
            ) from None
        try:
            return ServerInfo.from_json(data)
        except InfoError as exc:
            raise ConfigError(f"{replica.base_url}: {exc}") from None

    async def _stock_info(self, replica: Replica) -> ServerInfo:
        if self._tokenizer_arg is None or self._max_in_flight is None:
            raise ConfigError(
                f"{replica.base_url} is a stock vLLM server (no /minipic/info): "
                "pass tokenizer= and max_in_flight= to send it plain prompts"
            )
        models = (await replica.conn.get_json("/v1/models")).get("data") or []
        if not models:
            raise ConfigError(f"{replica.base_url}/v1/models lists no model")
        logger.warning("%s is a stock vLLM server: plain prompts only", replica.base_url)
        tokenizer = self._tokenizer_arg
        return ServerInfo.stock(
            model=models[0]["id"],
            max_model_len=int(models[0].get("max_model_len") or 1 << 30),
            tokenizer=(
                os.fspath(tokenizer)
                if isinstance(tokenizer, (str, os.PathLike))
                else str(getattr(tokenizer, "name_or_path", ""))
            ),
            max_num_seqs=self._max_in_flight,
        )


def pooled_transport() -> httpx.AsyncBaseTransport:
    """httpx over aiohttp's connection pool.

    httpcore's own pool re-scans every connection for every request it assigns: with a
    few hundred requests in flight that cost the client ~13 ms per request on an H200
    host and starved the server (docs/benchmarks.md has the profile). aiohttp's pool
    does not. Requests are bounded by the scheduler's slots, so the pool is not; idle
    connections are dropped before vLLM's 5 s keep-alive would close them under a
    request.
    """
    from httpx_aiohttp import AiohttpTransport

    return AiohttpTransport(limits=httpx.Limits(max_connections=0, keepalive_expiry=2.0))


# vLLM's rule for salts (`validate_cache_salt`): checked here so that a bad salt fails
# once, before sending, instead of every request with HTTP 400.
MAX_CACHE_SALT_CHARS = 128
_SALT_FORBIDDEN = frozenset("@/\\\x00")


def check_cache_salt(cache_salt: str | None) -> None:
    """Raise `PromptError` naming what makes `cache_salt` one the server would refuse."""
    if cache_salt is None:
        return
    if not isinstance(cache_salt, str) or not cache_salt:
        raise PromptError(f"cache_salt must be a non-empty string or None, got {cache_salt!r}")
    rule = f"a salt is 1-{MAX_CACHE_SALT_CHARS} characters without '@', '/', '\\' or NUL (the server's rule)"
    if len(cache_salt) > MAX_CACHE_SALT_CHARS:
        raise PromptError(f"cache_salt has {len(cache_salt)} characters: {rule}")
    bad = next((i for i, char in enumerate(cache_salt) if char in _SALT_FORBIDDEN), None)
    if bad is not None:
        raise PromptError(f"cache_salt {cache_salt!r} has {cache_salt[bad]!r} at character {bad}: {rule}")

