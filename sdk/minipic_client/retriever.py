"""`SpanRAG`: retrieve, then answer with every document as a span.

A LangChain `Runnable` when langchain-core is installed (the ``langchain``
extra): sync and async, streamed token by token, and seen by callbacks and
``astream_events`` as a retriever run and a chat-model run, like a chain of
LangChain's own. Without langchain-core, the same class works with any object
that has LangChain's retriever interface (``ainvoke`` or ``invoke`` returning
documents with ``page_content``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from minipic_client.client import RagRequest, RagResult
from minipic_client.errors import ConfigError
from minipic_client.loop_thread import LoopThread
from minipic_client.scheduler import Strategy

if TYPE_CHECKING:
    from minipic_client.client import SpanClient

_langchain: Any
try:
    from langchain_core.runnables import Runnable

    from minipic_client import langchain_calls as _langchain

    _Base: Any = Runnable[str, RagResult]
except ImportError:  # the optional extra is absent: SpanRAG stands alone
    _langchain = None
    _Base = object

_REQUEST_OPTIONS = frozenset(f.name for f in dataclasses.fields(RagRequest)) - {"task", "docs", "system"}


class SpanRAG(_Base):
    """``SpanRAG(retriever, client).invoke(question)`` -> `RagResult` (or ``ainvoke``,
    ``batch``, ``abatch``).

    ``stream``/``astream`` yield `RagResult` chunks as the answer is generated, each
    with its text delta; they add up (``+``) to the whole result, the last one
    carrying the usage. `task_template` is formatted with ``question=``;
    `rag_options` (``max_tokens``, ``technique``, ``modules``, ``strategy``, ...) are
    `SpanClient.rag`'s. Blocking calls run the client on a loop thread of this
    object's own: give it a client that is not in use on another loop.
    """

    def __init__(
        self,
        retriever: Any,
        client: SpanClient,
        *,
        system: str | None = None,
        task_template: str = "{question}",
        **rag_options: Any,
    ) -> None:
        if not (hasattr(retriever, "ainvoke") or hasattr(retriever, "invoke")):
            raise ConfigError(
                f"{type(retriever).__name__} is not a retriever: it has no ainvoke/invoke"
            )
        unknown = sorted(set(rag_options) - _REQUEST_OPTIONS - {"strategy"})
        if unknown:
            raise ConfigError(f"SpanRAG: unknown option(s) {unknown}; known: {sorted(_REQUEST_OPTIONS | {'strategy'})}")
        self.retriever = retriever
        self.client = client
        self.system = system
        self.task_template = task_template
        self.strategy: Strategy = rag_options.pop("strategy", Strategy.ISPS)
        self.rag_options = rag_options
        self._thread = LoopThread("SpanRAG")

    async def ainvoke(self, input: str, config: Any = None, **kwargs: Any) -> RagResult:
        result: RagResult | None = None
        async for chunk in self.astream(input, config, **kwargs):
            result = chunk if result is None else result + chunk
        assert result is not None, "a stream always ends with its usage chunk"
        return result

    async def astream(self, input: str, config: Any = None, **kwargs: Any) -> AsyncGenerator[RagResult, None]:
        if _langchain is None:
            chunks: AsyncIterator[RagResult] = self._chunks(input)
        else:
            chunks = _langchain.chain_run(self, input, config, self._chunks, **kwargs)
        async for chunk in chunks:
            yield chunk

    def invoke(self, input: str, config: Any = None, **kwargs: Any) -> RagResult:
        return self._thread.run(self.ainvoke(input, config, **kwargs))

    def stream(self, input: str, config: Any = None, **kwargs: Any) -> Iterator[RagResult]:
        return self._thread.iterate(self.astream(input, config, **kwargs))

    def close(self) -> None:
        """Close the client, on the loop the blocking calls used."""
        self._thread.run(self.client.aclose())

    async def _chunks(self, question: str, run: Any = None) -> AsyncGenerator[RagResult, None]:
        """The answer's chunks; `run` is LangChain's chain run, when there is one."""
        await self._connected()
        documents = await self._retrieve(question, run)
        request = RagRequest(
            task=self.task_template.format(question=question),
            docs=[getattr(doc, "page_content", doc) for doc in documents],
            system=self.system,
            **self.rag_options,
        )
        chunks = self.client.rag_chunks(request, strategy=self.strategy)
        if run is not None:
            chunks = _langchain.model_run(run, request, chunks)
        async for chunk in chunks:
            yield chunk

    async def _connected(self) -> None:
        """Connect the client on first use (blocking callers never enter ``async with``)."""
        try:
            self.client.info
        except ConfigError:
            await self.client.connect()

    async def _retrieve(self, question: str, run: Any) -> Sequence[Any]:
        if hasattr(self.retriever, "ainvoke"):
            config = () if run is None else _langchain.child_config(run, self.retriever)
            return list(await self.retriever.ainvoke(question, *config))
        return list(await asyncio.to_thread(self.retriever.invoke, question))
