"""`SpanRAG`: retrieve, then answer with every document as a span.

A LangChain `Runnable` when langchain-core is installed (the ``langchain``
extra); without it, the same class works with any object that has LangChain's
retriever interface (``ainvoke`` or ``invoke`` returning documents with
``page_content``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from minipic_client.client import RagResult
from minipic_client.errors import ConfigError

if TYPE_CHECKING:
    from minipic_client.client import SpanClient

try:
    from langchain_core.runnables import Runnable

    _Base: Any = Runnable[str, RagResult]
except ImportError:  # the optional extra is absent: SpanRAG stands alone
    _Base = object


class SpanRAG(_Base):
    """``await SpanRAG(retriever, client).ainvoke(question)`` -> `RagResult`.

    `task_template` is formatted with ``question=``; `rag_options` (``max_tokens``,
    ``technique``, ``modules``, ...) go to `SpanClient.rag` unchanged. Async only,
    like `SpanClient`.
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
        self.retriever = retriever
        self.client = client
        self.system = system
        self.task_template = task_template
        self.rag_options = rag_options

    async def ainvoke(self, input: str, config: Any = None, **kwargs: Any) -> RagResult:
        documents = await self._retrieve(input, config)
        return await self.client.rag(
            system=self.system,
            docs=[getattr(doc, "page_content", doc) for doc in documents],
            task=self.task_template.format(question=input),
            **self.rag_options,
        )

    def invoke(self, input: str, config: Any = None, **kwargs: Any) -> RagResult:
        raise NotImplementedError("SpanRAG is asynchronous (SpanClient is): use ainvoke")

    async def _retrieve(self, question: str, config: Any) -> list[Any]:
        if hasattr(self.retriever, "ainvoke"):
            # Only LangChain callers pass a config; plain retrievers may not take one.
            if config is None:
                return list(await self.retriever.ainvoke(question))
            return list(await self.retriever.ainvoke(question, config))
        return list(await asyncio.to_thread(self.retriever.invoke, question))
