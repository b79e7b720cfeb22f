"""`SpanClient`: RAG and part-built prompts against a MiniPIC server."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from minipic_client.config import ServerInfo
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
from minipic_client.prompt import (
    BlockAttention,
    ChatTemplate,
    Dependent,
    Part,
    Prefill,
    PromptBuilder,
    PromptLayout,
    RefreshedHeads,
    Span,
    Technique,
    Text,
    check_documents,
)
from minipic_client.scheduler import RequestEvent, Scheduler, Strategy
from minipic_client.tokenizer import Tokenizer
from minipic_client.tokens import TokenCache
from minipic_client.transport import Connection, RetryPolicy, Usage, root_url, usage_of

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger("minipic_client")

DEFAULT_TIMEOUT = httpx.Timeout(300.0, connect=10.0)
_REFRESHED_HEADS, _BLOCK_ATTENTION = RefreshedHeads(), BlockAttention()


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

    @classmethod
    def of(cls, layout: PromptLayout, max_tokens: int, temperature: float, cache_salt: str | None) -> _Job:
        """A job whose prefills carry its salt: salted blocks are cached apart, so they are sent apart."""
        prefills = layout.prefills if cache_salt is None else tuple(p.salted(cache_salt) for p in layout.prefills)
        return cls(layout, max_tokens, temperature, cache_salt, prefills)


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

    info: ServerInfo
    tokenizer: Tokenizer
    builder: PromptBuilder
    chat: ChatTemplate | None
    scheduler: Scheduler


class SpanClient:
    """A MiniPIC server's client: lays prompts out as spans, prefills each span
    once, and sends final prompts under the server's concurrency limit.

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
            is dropped).
        tokenizer: a `Tokenizer`, or a tokenizer directory or Hugging Face name,
            when the server's tokenizer path is not readable here.
        max_in_flight: concurrent requests (default: the server's ``max_num_seqs``).
        retry: backoff for connection errors, 429 and 5xx.
        timeout: httpx timeout per request.
        transport: an httpx transport (``httpx.MockTransport`` in tests).
        on_request: called with a `RequestEvent` after every request.
        info_check_interval_s: least time between two restart checks.
        allow_stock_server: accept a server without ``/minipic/info`` (stock vLLM, for
            comparisons): only ``Strategy.BASELINE`` (plain prompts) works there, and
            `tokenizer` and `max_in_flight` must be given.
        cache_salt: the default salt of every request (``None``: unsalted).
    """

    def __init__(
        self,
        base_url: str,
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
    ) -> None:
        if max_in_flight is not None and max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be at least 1, got {max_in_flight}")
        check_cache_salt(cache_salt)
        self._http = httpx.AsyncClient(
            base_url=root_url(base_url), transport=transport or pooled_transport(), timeout=timeout
        )
        self._conn = Connection(self._http, retry)
        self._cache_salt = cache_salt
        self._tokenizer_arg = tokenizer
        self._max_in_flight = max_in_flight
        self._on_request = on_request
        self._info_check_interval_s = info_check_interval_s
        self._allow_stock_server = allow_stock_server
        self._info_checked_at = float("-inf")
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
        """Read the server's info and load the tokenizer."""
        info = await self._fetch_info(quick=True)
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
        scheduler = Scheduler(
            self._conn,
            model=info.model,
            max_in_flight=self._max_in_flight or info.max_num_seqs,
            on_request=self._on_request,
        )
        chat = ChatTemplate(tokenizer) if tokenizer.chat_template else None
        self._session = _Session(info, tokenizer, builder, chat, scheduler)
        return info

    async def aclose(self) -> None:
        await self._http.aclose()

    @property
    def info(self) -> ServerInfo:
        return self._live.info

    @property
    def tokenizer(self) -> Tokenizer:
        return self._live.tokenizer

    @property
    def default_technique(self) -> Technique:
        """The layout `rag` uses when a call names none: the client's ``technique=``, else
        `RefreshedHeads`, the layout that kept a model not trained for block attention near full
        attention (docs/accuracy.md); `BlockAttention` on a server without hidden heads (no
        ``hsep_token_id``), with a warning once."""
        if self._technique is not None:
            return self._technique
        if self._live.info.hsep_token_id is not None:
            return _REFRESHED_HEADS
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
        return self._live.scheduler.computed_tokens

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
        if strategy.pic and not session.info.pic:
            raise ConfigError(
                f"{self._http.base_url} is a stock vLLM server: only strategy=baseline "
                "(plain prompts) works there"
            )
        max_model_len = session.info.max_model_len
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
        spans = [Span(self._module(name)) for name in request.modules]
        technique = request.technique or self.default_technique
        spans += [technique.span(doc) for doc in request.docs]
        chat = self._live.chat
        if chat is not None and not request.raw:
            parts = chat.parts(request.system, spans, request.task)
            return self.layout(parts, strategy=strategy, add_special_tokens=False)
        head: list[Part] = [Text(request.system)] if request.system else []
        return self.layout([*head, *spans, Dependent(request.task)], strategy=strategy)

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
        job = _Job.of(layout, max_tokens, temperature, self._salt(cache_salt))
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
        ISPS and BATCHED coincide here; BASELINE sends the plain prompt.
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
        outcomes = self._live.scheduler.run(jobs, strategy, self._complete, window=window)
        async with aclosing(outcomes):
            async for outcome in outcomes:
                yield outcome

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
        return _Job.of(layout, request.max_tokens, request.temperature, self._salt(request.cache_salt))

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
        return await self._conn.retry.retrying(self._conn.log, (StreamInterruptedError,))(self._collect, job, started)

    async def _collect(self, job: _Job, started: float) -> RagResult:
        completion = _Completion()
        async with aclosing(self._answer(job, completion)) as deltas:
            async for _ in deltas:
                pass
        return completion.result(started, job.layout)

    async def _answer(self, job: _Job, completion: _Completion) -> AsyncGenerator[str, None]:
        """The one request path of every call: the job's prefills, then its final
        prompt streamed into `completion`, yielding text deltas; a cached shortfall
        makes the client check whether the server restarted."""
        scheduler = self._live.scheduler
        completion.prefill_computed = await scheduler.prefill(job.prefills)
        events = scheduler.stream(
            job.layout.token_ids,
            max_tokens=job.max_tokens,
            temperature=job.temperature,
            cache_salt=job.cache_salt,
        )
        async with aclosing(events):
            async for event in events:
                yield completion.add(event)
        cached = completion.usage.cached_tokens if completion.usage else None
        if cached is not None and cached < job.layout.cacheable_tokens:
            # Evicted (or lost to a restart): the next sample that needs them prefills them again.
            self._live.scheduler.forget(job.layout.prefills)
            await self._check_restart()

    async def _check_restart(self) -> None:
        """Forget prefilled spans if the server restarted (rate-limited)."""
        now = time.monotonic()
        if now - self._info_checked_at < self._info_check_interval_s:
            return
        self._info_checked_at = now
        try:
            info = await self._fetch_info(quick=True)
        except (ServerError, TransportError) as exc:
            # The completion itself succeeded; the next shortfall checks again.
            logger.warning("could not re-read /minipic/info: %s", exc)
            return
        session = self._live
        old = session.info
        if info.instance_id == old.instance_id:
            return
        if info.layout_key != old.layout_key:
            raise ConfigError(
                f"the server restarted with a different setup ({old.layout_key} -> "
                f"{info.layout_key}); create a new SpanClient"
            )
        logger.info("server restarted (instance %s): prefilling spans again", info.instance_id)
        session.scheduler.forget()
        session.info = info

    async def _fetch_info(self, *, quick: bool = False) -> ServerInfo:
        try:
            data = await self._conn.get_json("/minipic/info", quick=quick)
        except RequestError as exc:
            if exc.status_code != 404:
                raise
            if self._allow_stock_server:
                return await self._stock_info()
            raise ConfigError(
                f"{self._http.base_url} is not a MiniPIC server: GET /minipic/info answered "
                f"404 ({exc.message}); start it with `minipic serve`, or send it plain prompts "
                "(allow_stock_server=True; `minipic batch --strategy baseline`)"
            ) from None
        return ServerInfo.from_json(data)

    async def _stock_info(self) -> ServerInfo:
        if self._tokenizer_arg is None or self._max_in_flight is None:
            raise ConfigError(
                f"{self._http.base_url} is a stock vLLM server (no /minipic/info): "
                "pass tokenizer= and max_in_flight= to send it plain prompts"
            )
        models = (await self._conn.get_json("/v1/models")).get("data") or []
        if not models:
            raise ConfigError(f"{self._http.base_url}/v1/models lists no model")
        logger.warning("%s is a stock vLLM server: plain prompts only", self._http.base_url)
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

