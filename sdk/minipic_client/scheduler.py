"""When requests go out: one in-flight limit, shared span prefills, three policies.

Every prompt the server runs (a prefill or a final) holds one of `max_in_flight`
slots, so the server's running batch is kept full (at its ``max_num_seqs``) without
queueing work there. A span prefill is sent once: concurrent and later users of the
same span await the same task. The prefills a caller needs are sent together, as one
completions request with a list of prompts (up to `MAX_PROMPTS_PER_REQUEST`): the
server does the same work with a fraction of the HTTP round trips.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import Any, Literal, Protocol, TypeVar

from minipic_client.errors import MiniPICError
from minipic_client.prompt import Prefill
from minipic_client.transport import Connection, usage_of

COMPLETIONS = "/v1/completions"
MAX_PROMPTS_PER_REQUEST = 32


class Strategy(str, enum.Enum):
    """How a set of samples is scheduled.

    - ``isps``: each sample awaits its own span prefills, then sends its final
      prompt; no global barrier (the default).
    - ``batched``: the span prefills of a whole batch, a barrier, then its finals.
    - ``baseline``: plain prompts without markers (PIC off), for comparisons.
    """

    ISPS = "isps"
    BATCHED = "batched"
    BASELINE = "baseline"

    @property
    def pic(self) -> bool:
        return self is not Strategy.BASELINE

    @property
    def barrier(self) -> bool:
        return self is Strategy.BATCHED


RequestKind = Literal["prefix", "span", "final"]


@dataclass(frozen=True, slots=True)
class RequestEvent:
    """One request the client completed: what it carried and what the server reported.

    A prefill request carries `prompts` prompts (its `kind` is ``"span"`` when any of
    them is a span); token counts are totals over them.
    """

    kind: RequestKind
    prompt_tokens: int
    cached_tokens: int | None
    duration_s: float
    prompts: int = 1


class _HasPrefills(Protocol):
    @property
    def prefills(self) -> Sequence[Prefill]: ...


J = TypeVar("J", bound=_HasPrefills)
R = TypeVar("R")


class Scheduler:
    """Sends a client's prefill and final requests: slots, prefill dedup, policies."""

    def __init__(
        self,
        connection: Connection,
        *,
        model: str,
        max_in_flight: int,
        on_request: Callable[[RequestEvent], None] | None = None,
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
        # Digests only: remembering every span ever prefilled stays small.
        self._done: set[bytes] = set()
        self._pending: dict[bytes, asyncio.Task[int | None]] = {}
        # Prompt tokens the server reported computing (not cached) for this scheduler's requests.
        self.computed_tokens = 0

    def forget(self, prefills: Iterable[Prefill] | None = None) -> None:
        """Drop the record of completed prefills: all of them (the server restarted) or
        `prefills` (the server evicted some of them), so the next user sends them again."""
        if prefills is None:
            self._done.clear()
        else:
            self._done.difference_update(p.key for p in prefills)

    async def prefill(self, prefills: Iterable[Prefill]) -> int | None:
        """Make `prefills` resident, sending only those no one sent or is sending.

        The ones nobody is sending go out together (one request per
        `MAX_PROMPTS_PER_REQUEST`); a failed request is forgotten, so the next caller
        that needs its prefills sends them again. Returns the prompt tokens the
        server computed for the requests this call sent (None: it reports no cache hits).
        """
        todo = {p.key: p for p in prefills if p.key not in self._done}
        fresh = [p for key, p in todo.items() if key not in self._pending]
        step = min(MAX_PROMPTS_PER_REQUEST, self.max_in_flight)
        sent = []
        for salt in dict.fromkeys(p.cache_salt for p in fresh):  # a request carries one salt
            salted = [p for p in fresh if p.cache_salt == salt]
            for start in range(0, len(salted), step):
                chunk = salted[start : start + step]
                task = asyncio.create_task(self._send_prefills(chunk))
                sent.append(task)
                keys = [p.key for p in chunk]
                self._pending.update(dict.fromkeys(keys, task))
                task.add_done_callback(partial(self._settle, keys))
        tasks = {id(t): t for t in (self._pending.get(key) for key in todo) if t is not None}
        # Shielded: a caller that is cancelled must not cancel the others' prefills.
        await asyncio.gather(*map(asyncio.shield, tasks.values()))
        total = 0
        for task in sent:
            computed = task.result()
            if computed is None:
                return None
            total += computed
        return total

    async def stream(
        self, token_ids: Sequence[int], *, max_tokens: int, temperature: float, cache_salt: str | None = None
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
            start = time.perf_counter()
            cached = None
            async with aclosing(self._conn.stream(COMPLETIONS, body)) as events:
                async for event in events:
                    usage = usage_of(event)
                    if usage is not None:
                        cached = usage.cached_tokens
                    yield event
        self._emit("final", len(token_ids), cached, start)

    async def run(
        self,
        jobs: Iterable[J | MiniPICError],
        strategy: Strategy,
        complete: Callable[[J, float], Coroutine[Any, Any, R]],
        *,
        window: int | None = None,
    ) -> AsyncGenerator[tuple[int, R | MiniPICError], None]:
        """Complete `jobs`, yielding ``(index, result or error)`` as each one finishes.

        ``complete(job, started)`` awaits the job's own prefills, then its final.
        ISPS keeps `window` jobs in progress (default ``2 * max_in_flight``, so a
        request is ready whenever a slot frees up). BATCHED takes `window` jobs
        at a time (default ``max_in_flight``, one server batch), prefills all of
        their spans and waits for all of them before any final is sent. Errors
        raised while building a job are passed in as items and yielded as they are.
        """
        if window is None:
            window = self.max_in_flight if strategy.barrier else 2 * self.max_in_flight
        numbered = enumerate(jobs)
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
                    prefills = [p for _, job in ready for p in job.prefills]
                    await asyncio.gather(self.prefill(prefills), return_exceptions=True)
                for i, job in ready:
                    running[asyncio.create_task(complete(job, started))] = i
                async for outcome in _drain(running, keep=0 if strategy.barrier else window - 1):
                    yield outcome
            async for outcome in _drain(running, keep=0):
                yield outcome
        finally:
            for task in running:
                task.cancel()

    def _settle(self, keys: list[bytes], task: asyncio.Task[int | None]) -> None:
        succeeded = not task.cancelled() and task.exception() is None
        for key in keys:
            del self._pending[key]
            if succeeded:
                self._done.add(key)

    async def _send_prefills(self, prefills: list[Prefill]) -> int | None:
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
        try:
            start = time.perf_counter()
            response = await self._conn.post_json(COMPLETIONS, body)
        finally:
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
            self._on_request(RequestEvent(kind, prompt_tokens, cached, duration, prompts))


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
