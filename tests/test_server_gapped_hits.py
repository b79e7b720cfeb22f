"""Gapped hits through a real `minipic serve`: cached blocks after a miss are reused where they sit.

Oracles: Hugging Face transformers with an explicit mask (`pic_reference`), and the same
prompt answered with nothing cached (a fresh `cache_salt` keys every block apart).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pic_reference import TINY, HFReference, Segment, dependent, flatten, random_tokens, span, system
from server_api import complete, complete_after, max_logprob_diff, prefill

pytestmark = pytest.mark.server

LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> HFReference:
    return HFReference(tiny_model_dir)


def in_context(tokens: list[int]) -> Segment:
    """A PDep segment followed by more of the prompt: computed in context, padded to a block."""
    return Segment(tuple(TINY.padded([TINY.pdep, *tokens])))


def answer(server, reference, segments: list[Segment], **extra):
    return matches_reference(complete(server, flatten(segments), **extra), reference, segments)


def matches_reference(result, reference, segments: list[Segment]):
    expected_ids, expected_tops = reference.greedy_top_logprobs(segments)
    assert result.token_ids == expected_ids
    assert max_logprob_diff(result.top_logprobs, expected_tops) < LOGPROB_TOL
    return result


def test_cached_spans_after_gaps_are_reused_and_answer_exactly(pic_server, reference) -> None:
    rng = random.Random(21)
    sys_ = system(random_tokens(rng, 20))
    docs = [span(random_tokens(rng, 30 + 11 * i)) for i in range(3)]
    gaps = [in_context(random_tokens(rng, 9 + 5 * i)) for i in range(2)]
    segments = [sys_, docs[0], gaps[0], docs[1], gaps[1], docs[2], dependent(random_tokens(rng, 12))]
    for part in (sys_, *docs):
        prefill(pic_server, list(part.tokens))
    gapped = answer(pic_server, reference, segments)
    assert gapped.cached_tokens == len(sys_.tokens) + sum(len(doc.tokens) for doc in docs)
    cold = answer(pic_server, reference, segments, cache_salt="gapped-hits-cold")
    assert cold.cached_tokens == 0
    assert cold.token_ids == gapped.token_ids
    assert max_logprob_diff(cold.top_logprobs, gapped.top_logprobs) < LOGPROB_TOL


def test_a_miss_at_the_prompt_start_still_reuses_the_spans_after_it(pic_server, reference) -> None:
    rng = random.Random(22)
    doc_a, doc_b = span(random_tokens(rng, 40)), span(random_tokens(rng, 25))
    for doc in (doc_a, doc_b):
        prefill(pic_server, list(doc.tokens))
    segments = [system(random_tokens(rng, 33)), doc_b, doc_a, dependent(random_tokens(rng, 10))]
    result = answer(pic_server, reference, segments)
    assert result.cached_tokens == len(doc_a.tokens) + len(doc_b.tokens)


def test_gap_chunks_longer_than_the_step_budget(pic_server, reference) -> None:
    rng = random.Random(23)
    sys_, doc_a, doc_b = system(random_tokens(rng, 12)), span(random_tokens(rng, 300)), span(random_tokens(rng, 50))
    long_gap = in_context(random_tokens(rng, 500))  # > 256 tokens per step: computed over several chunks
    for part in (sys_, doc_a, doc_b):
        prefill(pic_server, list(part.tokens))
    segments = [sys_, doc_a, long_gap, doc_b, dependent(random_tokens(rng, 10))]
    result = answer(pic_server, reference, segments)
    assert result.cached_tokens == len(sys_.tokens) + len(doc_a.tokens) + len(doc_b.tokens)


def test_a_gap_the_step_budget_ends_mid_block_still_reuses_the_span_after_it(pic_server, reference) -> None:
    """Behind a 1,000-token prompt the gap's first chunk gets what is left of a 256-token step
    and ends mid-block; the chunk after it must still stop at the cached span and adopt it."""
    rng = random.Random(24)
    sys_, doc_a, doc_b = system(random_tokens(rng, 12)), span(random_tokens(rng, 40)), span(random_tokens(rng, 50))
    long_gap = in_context(random_tokens(rng, 500))
    for part in (sys_, doc_a, doc_b):
        prefill(pic_server, list(part.tokens))
    segments = [sys_, doc_a, long_gap, doc_b, dependent(random_tokens(rng, 10))]
    result = matches_reference(complete_after(pic_server, random_tokens(rng, 1000), flatten(segments)),
                               reference, segments)
    assert result.cached_tokens == len(sys_.tokens) + len(doc_a.tokens) + len(doc_b.tokens)
