"""Span prefills are lost when the server restarts; answers must not change, and clients can tell."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest

from minipic_client import RagRequest, SpanClient

from pic_reference import HFReference, dependent, flatten, random_tokens, span, system
from server_api import complete, max_logprob_diff, prefill
from servers import ServerPool

pytestmark = pytest.mark.server


def test_restart_drops_spans_but_not_exactness(server_pool: ServerPool, pic_server, tiny_model_dir: Path) -> None:
    rng = random.Random(21)
    sys_, doc_a, doc_b = system(random_tokens(rng, 20)), span(random_tokens(rng, 40)), span(random_tokens(rng, 33))
    segments = [sys_, doc_b, doc_a, dependent(random_tokens(rng, 12))]
    for part in (sys_, doc_a, doc_b):
        prefill(pic_server, list(part.tokens))
    before = httpx.get(pic_server.url + "/minipic/info").json()["instance_id"]

    restarted = server_pool.restart()
    assert httpx.get(restarted.url + "/minipic/info").json()["instance_id"] != before
    result = complete(restarted, flatten(segments))
    assert result.cached_tokens == 0
    expected_ids, expected_tops = HFReference(tiny_model_dir).greedy_top_logprobs(segments)
    assert result.token_ids == expected_ids
    assert max_logprob_diff(result.top_logprobs, expected_tops) < 1e-3


async def test_client_prefills_again_after_a_restart(server_pool: ServerPool, pic_server) -> None:
    docs = [f"Restart report {i}: the ferry leaves at {i} o'clock from the east pier.\n" for i in range(3)]
    async with SpanClient(pic_server.url, info_check_interval_s=0) as client:
        expected = client.rag_layout(RagRequest("When?", docs, "Be brief.")).cacheable_tokens
        before = await client.rag(system="Be brief.", docs=docs, task="When?", max_tokens=2)
        server_pool.restart()
        # The client still believes its spans are cached: this answer is computed in full...
        first_after = await client.rag(system="Be brief.", docs=docs, task="When?", max_tokens=2)
        # ...and its shortfall made the client notice the new instance and prefill again.
        second_after = await client.rag(system="Be brief.", docs=docs, task="When?", max_tokens=2)
    assert before.cached_tokens == expected
    assert first_after.cached_tokens == 0
    assert second_after.cached_tokens == expected
    assert first_after.token_ids == before.token_ids == second_after.token_ids
