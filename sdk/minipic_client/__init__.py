"""MiniPIC's client: documents as position-independent spans over a vLLM server.

    async with SpanClient("http://127.0.0.1:8000") as client:
        r = await client.rag(system="...", docs=["...", "..."], task="...")

`SpanRAG` (the retriever wrapper) is imported on first use, so langchain-core
is loaded only by those who use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minipic_client.client import RagRequest, RagResult, SpanClient
from minipic_client.errors import (
    APIError,
    BatchInputError,
    ConfigError,
    InputFileError,
    InvalidDocumentError,
    MiniPICError,
    PromptError,
    PromptTooLongError,
    RequestError,
    ServerError,
    StreamInterruptedError,
    TransportError,
)
from minipic_client.placement import Endpoint, Placement, Rendezvous, RoundRobin, Route, SpanAffinity
from minipic_client.prompt import (
    BlockAttention,
    Dependent,
    Epic,
    HiddenSink,
    LeadInContext,
    Prefill,
    PrefixSink,
    PromptLayout,
    RefreshedHeads,
    Span,
    Technique,
    Text,
)
from minipic_client.scheduler import RequestEvent, Strategy
from minipic_client.tokenizer import Tokenizer
from minipic_client.transport import RetryPolicy
from minipic_protocol import ServerInfo

if TYPE_CHECKING:
    from minipic_client.retriever import SpanRAG

__all__ = [
    "APIError",
    "BatchInputError",
    "BlockAttention",
    "ConfigError",
    "Dependent",
    "Endpoint",
    "Epic",
    "HiddenSink",
    "PrefixSink",
    "InputFileError",
    "InvalidDocumentError",
    "LeadInContext",
    "MiniPICError",
    "Placement",
    "Prefill",
    "PromptError",
    "PromptLayout",
    "PromptTooLongError",
    "RagRequest",
    "RagResult",
    "RefreshedHeads",
    "Rendezvous",
    "RequestError",
    "RequestEvent",
    "RetryPolicy",
    "RoundRobin",
    "Route",
    "ServerError",
    "ServerInfo",
    "Span",
    "SpanAffinity",
    "SpanClient",
    "SpanRAG",
    "Strategy",
    "StreamInterruptedError",
    "Technique",
    "Text",
    "Tokenizer",
    "TransportError",
]


def __getattr__(name: str) -> Any:
    if name == "SpanRAG":
        from minipic_client.retriever import SpanRAG

        return SpanRAG
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
