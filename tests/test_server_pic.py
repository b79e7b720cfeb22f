"""PIC through a real `minipic serve`: hashing, exactness against HF transformers, safety under eviction."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer

from pic_reference import HFReference, Segment, dependent, flatten, padded, random_tokens, span, system
from server_api import acomplete, complete, complete_together, max_logprob_diff, metric, prefill
from servers import RunningServer

pytestmark = pytest.mark.server

LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> HFReference:
    return HFReference(tiny_model_dir)


def rag_segments(rng: random.Random, num_docs: int = 2, doc_len: int = 40) -> list[Segment]:
    docs = [span(random_tokens(rng, doc_len + 7 * i)) for i in range(num_docs)]
    return [system(random_tokens(rng, 20)), *docs, dependent(random_tokens(rng, 12))]


def assert_matches_reference(server: RunningServer, reference: HFReference, segments: list[Segment]):
    result = complete(server, flatten(segments))
    expected_ids, expected_tops = reference.greedy_top_logprobs(segments)
    assert result.token_ids == expected_ids
    assert max_logprob_diff(result.top_logprobs, expected_tops) < LOGPROB_TOL
    return result


def cached_part(segments: list[Segment]) -> int:
    return sum(len(s.tokens) for s in segments[:-1])


def test_prefilled_spans_hit_at_new_offsets_and_match_reference(pic_server, reference) -> None:
    sys_, doc_a, doc_b, task = rag_segments(random.Random(1))
    for part in (sys_, doc_a, doc_b):
        prefill(pic_server, list(part.tokens))
    swapped = [sys_, doc_b, doc_a, task]  # both documents now sit at offsets never prefilled
    result = assert_matches_reference(pic_server, reference, swapped)
    assert result.cached_tokens == len(sys_.tokens) + len(doc_a.tokens) + len(doc_b.tokens)


def test_never_prefilled_spans_match_reference_and_are_safe_to_reuse(pic_server, reference) -> None:
    rng = random.Random(2)
    sys_, doc_c, doc_d, task = rag_segments(rng)
    first = assert_matches_reference(pic_server, reference, [sys_, doc_c, doc_d, task])
    assert first.cached_tokens == 0
    # The spans were computed inside that prompt; reusing them in another order must not leak context.
    again = [sys_, doc_d, doc_c, dependent(random_tokens(rng, 12))]
    second = assert_matches_reference(pic_server, reference, again)
    assert second.cached_tokens == cached_part(again)


def test_a_span_computed_and_found_in_the_same_step_is_stored_for_both(pic_server, reference) -> None:
    """One request computes a span after its system prompt; the next, scheduled in the same step
    (a 300-token prompt ahead of them fills the step before), finds the span's blocks in the
    prefix cache at its own start. Both list the blocks; the cache must store the keys as the
    computing request rotates them (before 2026-12-06 the second request's write shift could
    win: both answers, and every later reuse, read keys off by the system prompt's length)."""
    rng = random.Random(4)
    doc = span(random_tokens(rng, 40))
    writer = [system(random_tokens(rng, 30)), doc, dependent(random_tokens(rng, 9))]
    reader = [doc, dependent(random_tokens(rng, 11))]
    filler = random_tokens(rng, 300)
    answers = complete_together(pic_server, [filler, flatten(writer), flatten(reader)])[1:]
    assert answers[0].cached_tokens == len(doc.tokens)  # the reader's hit (usage counts all three)
    later = [system(random_tokens(rng, 14)), doc, dependent(random_tokens(rng, 9))]
    for segments, result in [*zip((writer, reader), answers), (later, complete(pic_server, flatten(later)))]:
        expected_ids, expected_tops = reference.greedy_top_logprobs(segments)
        assert result.token_ids == expected_ids
        assert max_logprob_diff(result.top_logprobs, expected_tops) < LOGPROB_TOL


def test_evicted_spans_match_reference(pic_server, reference) -> None:
    rng = random.Random(3)
    segments = rag_segments(rng)
    for part in segments[:-1]:
        prefill(pic_server, list(part.tokens))
    for _ in range(24):  # 24 x 512 tokens overflow the 8,192-token KV cache
        prefill(pic_server, random_tokens(rng, 512))
    result = assert_matches_reference(pic_server, reference, segments)
    assert result.cached_tokens < cached_part(segments)


def test_pdep_tail_never_hits_after_a_different_document(pic_server) -> None:
    rng = random.Random(4)
    sys_ = system(random_tokens(rng, 20))
    doc_a, doc_b, doc_c = (span(random_tokens(rng, 30)) for _ in range(3))
    question = dependent(random_tokens(rng, 40))  # spans two full blocks
    for part in (sys_, doc_a, doc_b, doc_c):
        prefill(pic_server, list(part.tokens))
    prefill(pic_server, flatten([sys_, doc_a, doc_c, question]))
    result = complete(pic_server, flatten([sys_, doc_b, doc_c, question]), max_tokens=1, logprobs=None)
    assert result.cached_tokens == sum(len(s.tokens) for s in (sys_, doc_b, doc_c))
    repeat = complete(pic_server, flatten([sys_, doc_a, doc_c, question]), max_tokens=1, logprobs=None)
    assert repeat.cached_tokens == len(flatten([sys_, doc_a, doc_c, question])) // 16 * 16


def test_out_of_vocabulary_prompt_gets_400_and_server_keeps_serving(pic_server) -> None:
    response = httpx.post(
        pic_server.url + "/v1/completions",
        json={"model": pic_server.model, "prompt": [0, 12, 99999], "max_tokens": 2},
        timeout=60,
    )
    assert response.status_code == 400
    assert "99999" in response.text or "vocab" in response.text.lower()
    assert len(complete(pic_server, [0, 12, 13], max_tokens=2).token_ids) == 2


def test_markers_are_never_generated(pic_server) -> None:
    bias = {str(marker): 100 for marker in (5, 6, 7)}
    result = complete(pic_server, [0, 40, 41, 42], max_tokens=8, logprobs=None, logit_bias=bias)
    assert len(result.token_ids) == 8
    assert not {5, 6, 7} & set(result.token_ids)


def test_generated_text_is_the_prompts_decoded_continuation(pic_server, tiny_model_dir: Path) -> None:
    """The detokenizer, primed from the prompt's tail on a PIC server, writes what the whole
    prompt's decoding implies, streamed and not."""
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    texts = ("The harbour bridge was opened in 1932 and carries a railway line across the estuary. " * 6,
             "Die Brücke über den Fluss 🚂 wurde 1932 eröffnet. 東京の天気は晴れです。" * 4)  # fmt: skip
    for prompt in (tokenizer.encode(text).ids for text in texts):
        body = {"model": pic_server.model, "prompt": prompt, "max_tokens": 12, "temperature": 0.0,
                "return_token_ids": True}  # fmt: skip
        whole = httpx.post(pic_server.url + "/v1/completions", json=body, timeout=300).json()["choices"][0]
        with httpx.stream("POST", pic_server.url + "/v1/completions", json={**body, "stream": True},
                          timeout=300) as response:  # fmt: skip
            events = [json.loads(line[5:]) for line in response.iter_lines()
                      if line.startswith("data:") and line.strip() != "data: [DONE]"]  # fmt: skip
        streamed = "".join(choice["text"] for event in events for choice in event["choices"])
        prefix = tokenizer.decode(prompt)
        expected = tokenizer.decode(prompt + whole["token_ids"])[len(prefix) :]
        assert len(prompt) > 32 and whole["text"] == streamed == expected


def test_one_cached_document_at_sixteen_offsets_concurrently(pic_server) -> None:
    rng = random.Random(5)
    sys_, doc, task = system(random_tokens(rng, 10)), span(random_tokens(rng, 50)), random_tokens(rng, 9)
    fillers = [span(random_tokens(rng, 5 + 9 * i)) for i in range(16)]
    for part in (sys_, doc, *fillers):
        prefill(pic_server, list(part.tokens))
    prompts = [flatten([sys_, filler, doc, dependent(task)]) for filler in fillers]

    async def all_at_once():
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(*(acomplete(client, pic_server, p, max_tokens=6) for p in prompts))

    concurrent = asyncio.run(all_at_once())
    sequential = [complete(pic_server, p, max_tokens=6) for p in prompts]
    for prompt, a, b in zip(prompts, concurrent, sequential):
        assert a.cached_tokens == (len(prompt) - len(task) - 1) // 16 * 16
        assert a.token_ids == b.token_ids
        assert max_logprob_diff(a.top_logprobs, b.top_logprobs) < 1e-4


def test_document_twice_in_one_prompt_frees_cleanly(pic_server) -> None:
    rng = random.Random(6)
    sys_, doc = system(random_tokens(rng, 10)), span(random_tokens(rng, 40))
    probe = [0, *random_tokens(rng, 20)]
    prefill(pic_server, probe)
    idle_usage = metric(pic_server, "vllm:kv_cache_usage_perc")
    for part in (sys_, doc):
        prefill(pic_server, list(part.tokens))
    prompts = [flatten([sys_, doc, doc, dependent(random_tokens(rng, 8))]) for _ in range(200)]

    async def run_all():
        limit = asyncio.Semaphore(32)
        async with httpx.AsyncClient() as client:

            async def one(prompt):
                async with limit:
                    return await acomplete(client, pic_server, prompt, max_tokens=2, logprobs=None)

            return await asyncio.gather(*(one(p) for p in prompts))

    results = asyncio.run(run_all())
    assert all(len(r.token_ids) == 2 for r in results)
    assert all(r.cached_tokens == len(sys_.tokens) + 2 * len(doc.tokens) for r in results)
    prefill(pic_server, probe)
    assert metric(pic_server, "vllm:kv_cache_usage_perc") == pytest.approx(idle_usage, abs=1e-9)


def test_span_longer_than_the_step_budget(pic_server, reference) -> None:
    rng = random.Random(7)
    sys_, long_doc = system(random_tokens(rng, 12)), span(random_tokens(rng, 600))  # > 256 per step
    segments = [sys_, long_doc, span(random_tokens(rng, 30)), dependent(random_tokens(rng, 10))]
    assert_matches_reference(pic_server, reference, segments)  # computed in context, chunked
    prefill(pic_server, list(long_doc.tokens))
    moved = [sys_, span(random_tokens(rng, 45)), long_doc, dependent(random_tokens(rng, 10))]
    prefill(pic_server, list(moved[1].tokens))
    result = assert_matches_reference(pic_server, reference, moved)
    assert result.cached_tokens == cached_part(moved)


def test_epic_prompt_recomputes_document_heads_in_context(pic_server, reference) -> None:
    """EPIC/LegoLink: each document's first block follows PDep (in context), the rest is an SSep span."""
    rng = random.Random(8)
    k_blocks = 1
    sys_ = system(random_tokens(rng, 20))
    segments: list[Segment] = [sys_]
    tails = []
    for length in (50, 70):
        doc = random_tokens(rng, length)
        head_len = k_blocks * 16 - 1  # PDep + head fill exactly k blocks
        segments.append(dependent(doc[:head_len]))
        tails.append(span(doc[head_len:]))
        segments.append(tails[-1])
    segments.append(dependent(random_tokens(rng, 12)))
    for part in (sys_, *tails):
        prefill(pic_server, list(part.tokens))
    result = assert_matches_reference(pic_server, reference, segments)
    # The heads are computed in context; the tails after them are reused where they sit (gapped hits).
    assert result.cached_tokens == len(sys_.tokens) + sum(len(tail.tokens) for tail in tails)
    repeat = assert_matches_reference(pic_server, reference, segments)
    assert repeat.cached_tokens == len(padded(flatten(segments[:-1])))
