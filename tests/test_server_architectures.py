"""Another architecture through a real `minipic serve`, with no per-model declaration: a Qwen2
look-alike (biased q/k/v, 8/2 heads of 32 lanes, RoPE base 1e6, tied output head) answers PIC
prompts exactly as transformers does with an explicit mask, also with its markers read as a
newline (``--embed-markers-as``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_server_pic import LOGPROB_TOL, assert_matches_reference, cached_part, rag_segments

from minipic_server.tiny_model import make_tiny_model

from pic_reference import TINY, HFReference, Segment, dependent, flatten, random_tokens
from server_api import complete, max_logprob_diff, prefill
from servers import RunningServer, ServerPool, ServerSpec

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), architecture="qwen2")


@pytest.fixture(scope="module")
def qwen2_server(server_pool: ServerPool, qwen2_dir: Path) -> RunningServer:
    return server_pool.get(ServerSpec(model_dir=qwen2_dir))


def test_qwen2_spans_prefilled_moved_and_never_prefilled_match_reference(qwen2_server, qwen2_dir) -> None:
    reference = HFReference(qwen2_dir)
    rng = random.Random(7)
    sys_, doc_a, doc_b, task = rag_segments(rng)
    first = assert_matches_reference(qwen2_server, reference, [sys_, doc_a, doc_b, task])
    assert first.cached_tokens == 0  # spans computed inside the prompt, stored at their origin
    prefill(qwen2_server, list(doc_b.tokens))
    swapped = [sys_, doc_b, doc_a, dependent(random_tokens(rng, 12))]
    second = assert_matches_reference(qwen2_server, reference, swapped)
    assert second.cached_tokens == cached_part(swapped)


NEWLINE = 206  # the tiny tokenizer's "\n"
VOCAB = 2049


@pytest.fixture(scope="module")
def newline_markers_server(server_pool: ServerPool, qwen2_dir: Path) -> RunningServer:
    """Every logprob comes back, so the markers' own (banned) logits are compared too."""
    flags = ("--embed-markers-as", "newline", "--max-logprobs", str(VOCAB))
    return server_pool.get(ServerSpec(model_dir=qwen2_dir, extra_args=flags))


def whole_distributions(server: RunningServer, reference: HFReference, segments: list[Segment]):
    served = complete(server, flatten(segments), logprobs=VOCAB)
    expected_ids, expected = reference.greedy_top_logprobs(segments, top=VOCAB)
    assert served.token_ids == expected_ids
    assert max_logprob_diff(served.top_logprobs, expected) < LOGPROB_TOL
    return served, expected


def test_markers_read_as_a_newline_answer_like_the_reference_and_keep_their_own_logits(
    newline_markers_server, qwen2_dir
) -> None:
    """SSep, PDep and HSep embedded as the newline; the tied output head keeps the markers'
    rows, so every one of the 2,049 logprobs matches transformers fed newlines at the markers."""
    rng = random.Random(11)
    sys_, doc_a, doc_b, task = rag_segments(rng)
    segments = [sys_, doc_a, *TINY.refreshed(random_tokens(rng, 40)), doc_b, task]
    embedded = HFReference(qwen2_dir, embedded_as=dict.fromkeys((TINY.ssep, TINY.pdep, TINY.hsep), NEWLINE))
    first, expected = whole_distributions(newline_markers_server, embedded, segments)
    assert first.cached_tokens == 0
    _, own_rows = HFReference(qwen2_dir).greedy_top_logprobs(segments, top=VOCAB)
    assert max_logprob_diff(own_rows, expected) > 100 * LOGPROB_TOL  # the server did read newlines
    prefill(newline_markers_server, list(doc_b.tokens))
    moved = [sys_, doc_b, doc_a, dependent(random_tokens(rng, 12))]
    second, _ = whole_distributions(newline_markers_server, embedded, moved)
    assert second.cached_tokens == cached_part(moved)
