"""`minipic serve`'s default, the compact reading (pads and PDep markers unread and given no
position), through a real server: exact against HF transformers given the protocol's per-token masks and positions, the
same whether the spans were prefilled first, never, moved or at their origin."""

from __future__ import annotations

import random

import httpx
import pytest

from minipic_client import BlockAttention

from pic_reference import (
    TINY,
    HFReference,
    client_layout_matches_reference,
    dependent,
    flatten,
    matches_reference,
    random_tokens,
    span,
    system,
)
from server_api import max_logprob_diff, prefill
from servers import RunningServer, ServerPool, ServerSpec

pytestmark = pytest.mark.server

COMPACT = ServerSpec(compact=None)  # no reading flag: the default
hidden_span, refreshed = TINY.hidden_span, TINY.refreshed


@pytest.fixture(scope="module")
def compact_server(server_pool: ServerPool) -> RunningServer:
    return server_pool.get(COMPACT)


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> HFReference:
    return HFReference(tiny_model_dir, compact=True)


def test_the_server_reads_compact_by_default(compact_server: RunningServer) -> None:
    assert httpx.get(compact_server.url + "/minipic/info", timeout=30).json()["compact"] is True


def test_spans_and_tails_read_compact_never_prefilled_cached_and_moved(compact_server, reference) -> None:
    rng = random.Random(21)
    sys_ = system(random_tokens(rng, 21))
    doc_a, doc_b = span(random_tokens(rng, 40)), span(random_tokens(rng, 25))
    task = dependent(random_tokens(rng, 11))
    never = matches_reference(compact_server, reference, [sys_, doc_a, doc_b, task])
    assert never.cached_tokens == 0
    cached = matches_reference(compact_server, reference, [sys_, doc_a, doc_b, task])
    assert cached.cached_tokens == len(flatten([sys_, doc_a, doc_b]))
    assert cached.token_ids == never.token_ids
    assert max_logprob_diff(cached.top_logprobs, never.top_logprobs) < 1e-4
    swapped = [sys_, doc_b, doc_a, dependent(random_tokens(rng, 11))]  # both spans moved, and so their shifts
    assert matches_reference(compact_server, reference, swapped).cached_tokens == len(flatten(swapped[:-1]))


def test_refreshed_heads_read_compact_from_prefilled_spans(compact_server, reference) -> None:
    """Hidden heads overlap the positions of their in-context copies; spans prefilled alone first."""
    rng = random.Random(22)
    sys_ = system(random_tokens(rng, 20))
    docs = [random_tokens(rng, n) for n in (50, 37)]
    for doc in docs:
        prefill(compact_server, list(hidden_span(doc).tokens))
    segments = [sys_, *refreshed(docs[1]), *refreshed(docs[0]), dependent(random_tokens(rng, 12))]
    result = matches_reference(compact_server, reference, segments)
    assert result.cached_tokens == sum(len(hidden_span(doc).tokens) for doc in docs)
    salted = matches_reference(compact_server, reference, segments, cache_salt="never-prefilled")
    assert salted.cached_tokens == 0
    assert salted.token_ids == result.token_ids
    assert max_logprob_diff(salted.top_logprobs, result.top_logprobs) < 1e-4


@pytest.mark.parametrize("technique", [None, BlockAttention()], ids=["default", "block-attention"])
async def test_the_clients_layouts_read_compact_through_the_server(compact_server, reference, technique) -> None:
    await client_layout_matches_reference(compact_server, reference, technique)


def test_the_compact_reading_changes_what_the_model_reads(compact_server, reference, tiny_model_dir) -> None:
    """Not a no-op: the plain reading's answer to a padded prompt differs from the compact one's."""
    rng = random.Random(23)
    segments = [system(random_tokens(rng, 5)), dependent(random_tokens(rng, 3)), dependent(random_tokens(rng, 9))]
    _, compact_tops = reference.greedy_top_logprobs(segments, num_tokens=1)
    _, plain_tops = HFReference(tiny_model_dir).greedy_top_logprobs(segments, num_tokens=1)
    assert len(compact_tops[0].keys() & plain_tops[0].keys()) < 10  # most of the top 20 differ
    matches_reference(compact_server, reference, segments)
