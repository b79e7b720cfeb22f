"""Another architecture through a real `minipic serve`, with no per-model declaration: a Qwen2
look-alike (biased q/k/v, 8/2 heads of 32 lanes, RoPE base 1e6) answers PIC prompts exactly
as transformers does with an explicit mask."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_server_pic import assert_matches_reference, cached_part, rag_segments

from minipic_server.tiny_model import make_tiny_model

from pic_reference import HFReference, dependent, random_tokens
from server_api import prefill
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
