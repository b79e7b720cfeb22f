"""A span bias (`minipic serve --span-bias`) through a real server: every key inside a span,
read from outside every span, weighed by the bias; exact against HF transformers given the
bias on its mask (an independent reference: `pic_reference.weighed`), the same whether the
spans were prefilled first, never, moved or at their origin, since no span's own rows are
weighed and its cached blocks never depend on the bias."""

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
    matches_reference,
    random_tokens,
    span,
    system,
)
from server_api import max_logprob_diff, prefill
from servers import RunningServer, ServerPool, ServerSpec

pytestmark = pytest.mark.server

BIAS = -1.5
BIASED = ServerSpec(compact=None, extra_args=("--span-bias", str(BIAS)))  # the default reading, weighed
hidden_span, refreshed = TINY.hidden_span, TINY.refreshed


@pytest.fixture(scope="module")
def biased_server(server_pool: ServerPool) -> RunningServer:
    return server_pool.get(BIASED)


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> HFReference:
    return HFReference(tiny_model_dir, compact=True, span_bias=BIAS)


def test_the_server_publishes_its_span_bias(biased_server: RunningServer) -> None:
    assert httpx.get(biased_server.url + "/minipic/info", timeout=30).json()["span_bias"] == BIAS


def test_the_bias_changes_what_the_question_reads(biased_server, reference, tiny_model_dir) -> None:
    """Not a no-op: the question's top logprobs over two spans move with the bias."""
    rng = random.Random(31)
    segments = [system(random_tokens(rng, 9)), span(random_tokens(rng, 40)), span(random_tokens(rng, 25)),
                dependent(random_tokens(rng, 7))]  # fmt: skip
    _, weighed_tops = reference.greedy_top_logprobs(segments, num_tokens=1)
    _, plain_tops = HFReference(tiny_model_dir, compact=True).greedy_top_logprobs(segments, num_tokens=1)
    weighed, plain = weighed_tops[0], plain_tops[0]
    assert max(abs(weighed[t] - plain[t]) for t in weighed.keys() & plain.keys()) > 0.05
    matches_reference(biased_server, reference, segments)


def test_refreshed_heads_weighed_never_prefilled_then_cached_and_moved(biased_server, reference) -> None:
    """Refreshed heads (the in-context heads read the spans before them weighed, as the question
    does) computed inside the prompt, then over spans prefilled alone and read moved."""
    rng = random.Random(32)
    sys_ = system(random_tokens(rng, 20))
    docs = [random_tokens(rng, n) for n in (50, 70)]
    never = matches_reference(biased_server, reference,
                              [sys_, *refreshed(docs[0]), *refreshed(docs[1]), dependent(random_tokens(rng, 12))])
    assert never.cached_tokens == 0
    for doc in docs:
        prefill(biased_server, list(hidden_span(doc).tokens))
    reordered = [sys_, *refreshed(docs[1]), *refreshed(docs[0]), dependent(random_tokens(rng, 12))]
    moved = matches_reference(biased_server, reference, reordered)
    assert moved.cached_tokens == len(sys_.tokens) + sum(len(hidden_span(doc).tokens) for doc in docs)
    salted = matches_reference(biased_server, reference, reordered, cache_salt="never-prefilled")
    assert salted.cached_tokens == 0 and salted.token_ids == moved.token_ids
    assert max_logprob_diff(salted.top_logprobs, moved.top_logprobs) < 1e-4


@pytest.mark.parametrize("technique", [None, BlockAttention()], ids=["default", "block-attention"])
async def test_the_clients_layouts_are_weighed_exactly_through_the_server(biased_server, reference, technique) -> None:
    await client_layout_matches_reference(biased_server, reference, technique)
