"""Span prefills are lost when the server restarts; answers must not change, and clients can tell."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest

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
