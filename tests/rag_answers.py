"""`rag_many` collected, for tests that check every request is answered once."""

from __future__ import annotations

from typing import Any

from minipic_client import RagRequest, RagResult, SpanClient


async def every_answer(client: SpanClient, requests: list[RagRequest], **options: Any) -> dict[int, RagResult]:
    """`rag_many`'s outcomes by index, checking each request is answered exactly once and without error."""
    results: dict[int, RagResult] = {}
    async for i, outcome in client.rag_many(requests, **options):
        assert isinstance(outcome, RagResult), outcome
        assert i not in results
        results[i] = outcome
    assert sorted(results) == list(range(len(requests)))
    return results
