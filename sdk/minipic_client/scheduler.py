"""When requests go out: one in-flight limit, shared span prefills, four policies.

Every prompt the server runs (a prefill or a final) holds one of `max_in_flight`
slots, so the server's running batch is kept full (at its ``max_num_seqs``) without
queueing work there. A span prefill is sent once: concurrent and later users of the
same span await the same task. The prefills a caller needs are sent together, as one
completions request with a list of prompts (up to `MAX_PROMPTS_PER_REQUEST`): the
server does the same work with a fraction of the HTTP round trips. Under ``inline``
the spans no one has sent travel in the caller's own final prompt instead (`Claim`):
one request, one contiguous prefill, and the same cached blocks.
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial
from itertools import islice
from operator import attrgetter
from typing import Any, Generic, Literal, Protocol, TypeVar

from minipic_client.errors import MiniPICError
from minipic_client.prompt import Prefill
from minipic_client.transport import Connection, usage_of

COMPLETIONS = "/v1/completions"
MAX_PROMPTS_PER_REQUEST = 32


class Strategy(str, enum.Enum):
    """How a set of samples is scheduled.

    - ``isps``: each sample awaits its own span prefills, then sends its final
      prompt; no global barrier (the default).
    - ``inline``: ISPS whose final prompt carries the sample's spans that no one has
      sent: they are computed (and cached) in the final, so a sample over cold spans is
      one request and one prefill. Spans another sample is sending are awaited, as in
      ISPS, so no span is computed twice at once.
    - ``batched``: the span prefills of a whole batch, a barrier, then its finals.
    - ``baseline``: plain prompts without markers (PIC off), for comparisons.
    """

    ISPS = "isps"
    INLINE = "inline"
    BATCHED = "batched"
    BASELINE = "baseline"

    @property
    def pic(self) -> bool:
        return self is not Strategy.BASELINE

    @property
    def barrier(self) -> bool:
        return self is Strategy.BATCHED

    @property
    def inline(self) -> bool:
        return self is Strategy.INLINE


RequestKind = Literal["prefix", "span", "final"]


@dataclass(frozen=True, slots=True)
class RequestEvent:
    """One request the client completed: what it carried and what the server reported.

    A prefill request carries `prompts` prompts (its `kind` is ``"span"`` when any of
    them is a span); token counts are totals over them. `endpoint` names the replica.
    """

    kind: RequestKind
    prompt_tokens: int
    cached_tokens: int | None
    duration_s: float
    prompts: int = 1
    endpoint: str = ""  # the replica's `Endpoint.name`


class _HasPrefills(Protocol):
    @property
    def prefills(self) -> Sequence[Prefill]: ...


J = TypeVar("J", bound=_HasPrefills)
R = TypeVar("R")


class Claim:
    """Prefills a final prompt computes itself (``inline``): registered as under way, so
    other callers await them, until `settle` says whether the final stored them.

    The final's first token means its whole prompt was prefilled, so its blocks are cached:
    ``settle(True)`` then. A final that failed or was cancelled before it settles False: the
    prefills count as never sent, the callers that waited compute them in their own finals,
    and later callers send them again.
    """

    def __init__(self, sizes: dict[bytes, int]) -> None:
        self.sizes = sizes
        self.stored: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    @property
    def tokens(self) -> int:
        """Prompt tokens of the claimed prefills (computed in the final, not cached there)."""
        return sum(self.sizes.values())

    def settle(self, stored: bool) -> None:
        """Once; later calls change nothing."""
        if not self.stored.done():
            self.stored.set_result(stored)


class Scheduler:
    """Sends one replica's prefill and final requests: slots, prefill dedup, and what
    that replica holds (for placement)."""

    def __init__(
        self,
        connection: Connection,
        *,
        model: str,
        max_in_flight: int,
        on_request: Callable[[RequestEvent], None] | None = None,
        name: str = "",
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._conn = connection
        self._model = model
        self._slots = asyncio.Semaphore(max_in_flight)
        # Taking several slots is serialised: two requests each holding part of what
        # they need could otherwise wait for each other forever.
        self._taking_many = asyncio.Lock()
        self._on_request = on_request
        self.name = name
        # Digests and sizes only: remembering every span ever prefilled stays small.
        self._done: dict[bytes, int] = {}
        # Under way: a prefill request, or a final that computes the prefill itself (`Claim`).
        self._pending: dict[bytes, asyncio.Future[Any]] = {}
        self._done_tokens = 0
        self._pending_tokens = 0
        self._busy = 0
        # Prompt tokens the server reported computing (not cached) for this scheduler's requests.
        self.computed_tokens = 0

    def holds(self, key: bytes) -> bool:
        """Whether the prefill with `key` was sent here (done or under way)."""
        return key in self._done or key in self._pending

    @property
    def load(self) -> int:
        """Tokens of the prefills held or under way here."""
        return self._done_tokens + self._pending_tokens

    @property
    def busy(self) -> int:
        """Slots taken now."""
        return self._busy

    def forget(self, prefills: Iterable[Prefill] | None = None) -> None:
        """Drop the record of completed prefills: all of them (the server restarted) or
        `prefills` (the server evicted some of them), so the next user sends them again."""
        if prefills is None:
            self._done.clear()
            self._done_tokens = 0
            return
        self.drop(p.key for p in prefills)

    def drop(self, keys: Iterable[bytes]) -> None:
        """`forget` by key: the server reported those prefills' blocks evicted."""
        for key in keys:
            self._done_tokens -= self._done.pop(key, 0)

    def record(self, key: bytes, size: int) -> None:
        """Count a prefill as done: the server reported its blocks stored (by anyone)."""
        if key not in self._done:
            self._done[key] = size
            self._done_tokens += size

    async def prefill(self, prefills: Iterable[Prefill], headers: dict[str, str] | None = None) -> int | None:
        """Make `prefills` resident, sending only those no one sent or is sending
        (`headers` go with the requests this call sends). Returns the prompt tokens the
        server computed for the requests this call sent (None: it reports no cache hits)."""
        sent, resident = self._start(prefills, headers)
        await resident
        total = 0
        for task in sent:
            computed = task.result()
            if computed is None:
                return None
            total += computed
        return total

    def send(self, prefills: Iterable[Prefill], headers: dict[str, str] | None = None) -> asyncio.Future[Any]:
        """`prefill`, its requests started at once (so placement sees them as held
        before it routes the next job); await the result to wait for them."""
        return self._start(prefills, headers)[1]

    def claim(self, prefills: Iterable[Prefill]) -> tuple[Claim, asyncio.Future[Any]]:
        """``inline``: the prefills no one has sent or is sending become the caller's, to be
        computed in its final prompt; returns that `Claim` and a future of the others under
        way, to await before the final goes out."""
        todo = self._not_done(prefills)
        claim = Claim({key: len(p.token_ids) for key, p in todo.items() if key not in self._pending})
        waits = self._under_way(todo)
        self._hold(claim.sizes, claim.stored)
        claim.stored.add_done_callback(lambda stored: self._release(claim.sizes, stored.result()))
        return claim, asyncio.gather(*waits, return_exceptions=True)

    def _start(
        self, prefills: Iterable[Prefill], headers: dict[str, str] | None
    ) -> tuple[list[asyncio.Task[int | None]], asyncio.Future[Any]]:
        """The requests this call sends, and a future of every prefill it needs.

        The ones nobody is sending go out together (one request per
        `MAX_PROMPTS_PER_REQUEST`); a failed request is forgotten, so the next caller
        that needs its prefills sends them again.
        """
        todo = self._not_done(prefills)
        fresh = [p for key, p in todo.items() if key not in self._pending]
        step = min(MAX_PROMPTS_PER_REQUEST, self.max_in_flight)
        sent: list[asyncio.Task[int | None]] = []
        for salt in dict.fromkeys(p.cache_salt for p in fresh):  # a request carries one salt
            salted = [p for p in fresh if p.cache_salt == salt]
            for start in range(0, len(salted), step):
                chunk = salted[start : start + step]
                task = asyncio.create_task(self._send_prefills(chunk, headers))
                sent.append(task)
                sizes = {p.key: len(p.token_ids) for p in chunk}
                self._hold(sizes, task)
                task.add_done_callback(partial(self._settle, sizes))
        return sent, asyncio.gather(*self._under_way(todo))

    def _not_done(self, prefills: Iterable[Prefill]) -> dict[bytes, Prefill]:
        return {p.key: p for p in prefills if p.key not in self._done}

    def _under_way(self, keys: Iterable[bytes]) -> list[asyncio.Future[Any]]:
        """What sends the prefills with `keys` (each once), shielded: a caller that is
        cancelled must not cancel the others' prefills."""
        futures = {id(f): f for f in (self._pending.get(key) for key in keys) if f is not None}
        return [asyncio.shield(f) for f in futures.values()]

    async def stream(
        self,
        token_ids: Sequence[int],
        *,
        max_tokens: int,
        temperature: float,
        cache_salt: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Stream a final prompt's completion events while holding one slot."""
        body = {
            "model": self._model,
            "prompt": token_ids,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        async with self._slots:
            self._busy += 1
            try:
                start = time.perf_counter()
                cached = None
                async with aclosing(self._conn.stream(COMPLETIONS, body, headers)) as events:
                    async for event in events:
                        usage = usage_of(event)
                        if usage is not None:
                            cached = usage.cached_tokens
                        yield event
            finally:
                self._busy -= 1
        self._emit("final", len(token_ids), cached, start)

    def _hold(self, sizes: dict[bytes, int], under_way: asyncio.Future[Any]) -> None:
        self._pending.update(dict.fromkeys(sizes, under_way))
        self._pending_tokens += sum(sizes.values())

    def _settle(self, sizes: dict[bytes, int], task: asyncio.Task[int | None]) -> None:
        self._release(sizes, not task.cancelled() and task.exception() is None)

    def _release(self, sizes: dict[bytes, int], stored: bool) -> None:
        for key, size in sizes.items():
            del self._pending[key]
            self._pending_tokens -= size
            if stored:
                self.record(key, size)

    async def _send_prefills(self, prefills: list[Prefill], headers: dict[str, str] | None) -> int | None:
        """Send `prefills` as one request; returns the prompt tokens the server computed."""
        prompts = [list(p.token_ids) for p in prefills]
        body = {
            "model": self._model,
            "prompt": prompts if len(prompts) > 1 else prompts[0],
            "max_tokens": 1,
            "temperature": 0.0,
        }
        if prefills[0].cache_salt is not None:  # one salt per request: see prefill()
            body["cache_salt"] = prefills[0].cache_salt
        async with self._taking_many:
            for _ in prefills:
                await self._slots.acquire()
        self._busy += len(prefills)
        try:
            start = time.perf_counter()
            response = await self._conn.post_json(COMPLETIONS, body, headers)
        finally:
            self._busy -= len(prefills)
            for _ in prefills:
                self._slots.release()
        usage = usage_of(response)
        kind: RequestKind = "span" if any(p.kind == "span" for p in prefills) else "prefix"
        tokens = sum(len(p) for p in prompts)
        cached = usage.cached_tokens if usage is not None else None
        self._emit(kind, tokens, cached, start, prompts=len(prompts))
        return None if cached is None else tokens - cached

    def _emit(
        self, kind: RequestKind, prompt_tokens: int, cached: int | None, start: float, *, prompts: int = 1
    ) -> None:
        if cached is not None:
            self.computed_tokens += prompt_tokens - cached
        if self._on_request is not None:
            duration = time.perf_counter() - start
            self._on_request(RequestEvent(kind, prompt_tokens, cached, duration, prompts, self.name))


async def run(
    jobs: Iterable[J | MiniPICError],
    strategy: Strategy,
    complete: Callable[[J, float], Coroutine[Any, Any, R]],
    *,
    prefill: Callable[[list[J]], Awaitable[None]],
    max_in_flight: int,
    window: int | None = None,
) -> AsyncGenerator[tuple[int, R | MiniPICError], None]:
    """Complete `jobs`, yielding ``(index, result or error)`` as each one finishes.

    ``complete(job, started)`` awaits the job's own prefills, then its final;
    ``prefill(jobs)`` sends the prefills of several (BATCHED's barrier).
    ISPS keeps `window` jobs in progress (default ``2 * max_in_flight``, so a
    request is ready whenever a slot frees up), each started from the next
    `window` built (`LookAhead`). BATCHED takes `window` jobs
    at a time (default ``max_in_flight``, one server batch), prefills all of
    their spans and waits for all of them before any final is sent. Errors
    raised while building a job are passed in as items and yielded as they are.
    """
    if window is None:
        window = max_in_flight if strategy.barrier else 2 * max_in_flight
    numbered: Iterator[tuple[int, J | MiniPICError]] = enumerate(jobs)
    if not strategy.barrier:
        numbered = LookAhead(numbered, window)
    running: dict[asyncio.Task[R], int] = {}
    try:
        while group := list(islice(numbered, window if strategy.barrier else 1)):
            started = time.perf_counter()
            ready = []
            for i, job in group:
                if isinstance(job, MiniPICError):
                    yield i, job
                else:
                    ready.append((i, job))
            if strategy.barrier:
                # Failures surface (and are retried) in each job's own prefill.
                await asyncio.gather(prefill([job for _, job in ready]), return_exceptions=True)
            for i, job in ready:
                running[asyncio.create_task(complete(job, started))] = i
            # Let the tasks just started send before the next job is built: building (tokenizing)
            # a whole window first would hold the first request back by as many jobs.
            await asyncio.sleep(0)
            async for outcome in _drain(running, keep=0 if strategy.barrier else window - 1):
                yield outcome
        async for outcome in _drain(running, keep=0):
            yield outcome
    finally:
        for task in running:
            task.cancel()


@dataclass(slots=True, eq=False)
class _Waiting(Generic[J]):
    """A built job not started yet: how many of its prefills started jobs share."""

    index: int
    job: J | MiniPICError
    built_at: int  # `LookAhead`'s picks when it was built
    shared: float = 0


class LookAhead(Iterator[tuple[int, "J | MiniPICError"]]):
    """ISPS's order: each next job picked among the next `size` built ones, the one sharing
    most prefills with the jobs already started (their spans are the likeliest still cached
    where a server's KV cache holds fewer than a run's spans), errors first, ties in build
    order; a job passed over `size` times goes next. It builds two jobs a pick, up to `size`,
    so the first request does not wait for a whole look-ahead to be tokenized."""

    def __init__(self, numbered: Iterator[tuple[int, J | MiniPICError]], size: int) -> None:
        self._numbered = numbered
        self._size = size
        self._waiting: list[_Waiting[J]] = []  # in build order
        self._started: set[bytes] = set()
        self._by_key: dict[bytes, list[_Waiting[J]]] = {}  # waiting jobs by a prefill no started job has
        self._picks = 0

    def __next__(self) -> tuple[int, J | MiniPICError]:
        for index, job in islice(self._numbered, min(2, self._size - len(self._waiting))):
            self._build(_Waiting(index, job, self._picks))
        if not self._waiting:
            raise StopIteration
        oldest = self._waiting[0]
        pick = oldest if self._picks - oldest.built_at >= self._size else max(self._waiting, key=attrgetter("shared"))
        self._waiting.remove(pick)
        self._picks += 1
        if not isinstance(pick.job, MiniPICError):
            self._start(pick.job)
        return pick.index, pick.job

    def _build(self, waiting: _Waiting[J]) -> None:
        self._waiting.append(waiting)
        if isinstance(waiting.job, MiniPICError):
            waiting.shared = math.inf
            return
        for key in {p.key for p in waiting.job.prefills}:
            if key in self._started:
                waiting.shared += 1
            else:
                self._by_key.setdefault(key, []).append(waiting)

    def _start(self, job: J) -> None:
        for key in {p.key for p in job.prefills} - self._started:
            self._started.add(key)
            for waiting in self._by_key.pop(key, ()):
                waiting.shared += 1


async def _drain(
    running: dict[asyncio.Task[R], int], *, keep: int
) -> AsyncIterator[tuple[int, R | MiniPICError]]:
    """Yield finished jobs until at most `keep` are still running."""
    while len(running) > keep:
        done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            yield running.pop(task), _outcome(task)


def _outcome(task: asyncio.Task[R]) -> R | MiniPICError:
    """A job's result, or its MiniPIC error; anything else is a bug and propagates."""
    exc = task.exception()
    if exc is None:
        return task.result()
    if isinstance(exc, MiniPICError):
        return exc
    raise exc
