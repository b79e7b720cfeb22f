"""An event loop on a thread of its own, for blocking callers of async code.

`SpanClient` is asynchronous and bound to the event loop it first runs on (its
connection pool is). A caller without a loop (LangChain's ``invoke``, ``batch``,
``stream``) hands its coroutines to one long-lived loop here instead of
``asyncio.run`` per call, which would leave the client on a closed loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterator
from typing import Any, TypeVar

from minipic_client.errors import ConfigError

T = TypeVar("T")


class LoopThread:
    """A daemon thread running one event loop; started on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the thread's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._started(coro)).result()

    def iterate(self, items: AsyncGenerator[T, None]) -> Iterator[T]:
        """Iterate an async generator on the thread's loop, one item at a time; closing the
        iterator early (``break``) closes `items` there too."""

        async def next_item() -> T:
            return await anext(items)

        try:
            while True:
                try:
                    yield self.run(next_item())
                except StopAsyncIteration:
                    return
        finally:
            self.run(items.aclose())

    def _started(self, coro: Coroutine[Any, Any, Any]) -> asyncio.AbstractEventLoop:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise ConfigError(f"{self._name}: a blocking call inside a running event loop would stall it; "
                              "await the async method (ainvoke, abatch, astream) instead")
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name=self._name, daemon=True).start()
            return self._loop
