"""SpanClient against the fake server: caching, dedup, ISPS/batched/baseline ordering, restarts."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from minipic_client import (
    BlockAttention,
    ConfigError,
    Dependent,
    Epic,
    InvalidDocumentError,
    LeadInContext,
    PromptError,
    PromptTooLongError,
    RagRequest,
    RagResult,
    RefreshedHeads,
    RequestError,
    RequestEvent,
    ServerInfo,
    Span,
    SpanClient,
    Strategy,
    Text,
)
from minipic_client.client import check_cache_salt
from minipic_protocol import PROTOCOL_VERSION, InfoError

if TYPE_CHECKING:
    from sdk_fixtures import FakeServer, Recorded

pytest_plugins = ["sdk_fixtures"]  # fake_server, fake_client, sdk_tokenizer

SYSTEM = "Answer from the documents."
DOCS = [f"Document {i}: the river {i} runs past mill number {i}.\n" for i in range(5)]


def _contains(haystack: list[int], needle: list[int]) -> bool:
    n = len(needle)
    # Segments start on block boundaries (the fake uses 16-token blocks).
    return any(haystack[i : i + n] == needle for i in range(0, len(haystack) - n + 1, 16))


async def test_rag_reports_prefix_and_documents_cached(fake_server, fake_client):
    async with fake_client(tokenizer=None) as client:  # loads the tokenizer the server names
        first = await client.rag(system=SYSTEM, docs=DOCS[:2], task="Which mill?", max_tokens=3)
        layout = client.rag_layout(RagRequest("Which mill?", DOCS[:2], SYSTEM))
        second = await client.rag(system=SYSTEM, docs=DOCS[1::-1], task="Other?", max_tokens=3)
    assert first.text == "t100 t101 t102 " and first.token_ids == [100, 101, 102]
    assert first.finish_reason == "length" and first.ttft_s > 0
    assert first.cached_tokens == layout.cacheable_tokens > 0
    assert first.prompt_tokens == len(layout.token_ids)
    assert second.cached_tokens == layout.cacheable_tokens  # same spans, other order
    assert [r.kind for r in fake_server.requests] == ["prefix", "span", "span", "final", "final"]


async def test_a_call_reports_the_tokens_it_made_the_server_compute(fake_server, fake_client):
    async with fake_client() as client:
        cold = await client.rag(system=SYSTEM, docs=DOCS[:2], task="q", max_tokens=1)
        warm = await client.rag(system=SYSTEM, docs=DOCS[:2], task="q", max_tokens=1)
        cacheable = client.rag_layout(RagRequest("q", DOCS[:2], SYSTEM)).cacheable_tokens
        assert client.computed_tokens == cold.computed_tokens + warm.computed_tokens
    assert cold.cached_tokens == warm.cached_tokens == cacheable  # what the final prompt alone says
    assert (cold.computed_tokens, cold.reused_tokens) == (cold.prompt_tokens, 0)  # prefills included
    assert (warm.computed_tokens, warm.reused_tokens) == (warm.prompt_tokens - cacheable, cacheable)


async def test_a_call_that_waited_on_anothers_prefill_did_not_pay_for_it(fake_server, fake_client):
    fake_server.delay_s = 0.005
    async with fake_client() as client:
        a, b = await asyncio.gather(*(client.rag(system=SYSTEM, docs=DOCS[:2], task=t, max_tokens=1)
                                      for t in ("qa", "qb")))
    assert sorted([a.reused_tokens, b.reused_tokens]) == [0, a.cached_tokens]


async def test_concurrent_calls_share_one_prefill_per_document(fake_server, fake_client):
    fake_server.delay_s = 0.005
    events: list[RequestEvent] = []
    async with fake_client(on_request=events.append) as client:
        results = await asyncio.gather(
            *(
                client.rag(
                    system=SYSTEM, docs=[DOCS[i % 5], DOCS[(i + 1) % 5]], task=f"q{i}", max_tokens=1
                )
                for i in range(50)
            )
        )
    assert len(fake_server.of_kind("span")) == 5
    assert len(fake_server.of_kind("prefix")) == 1
    # One prefill per document and one for the system prefix, several per request.
    assert sum(e.prompts for e in events if e.kind != "final") == 6
    assert [e.kind for e in events].count("final") == 50
    assert all(r.cached_tokens and r.cached_tokens >= r.prompt_tokens - 16 for r in results)
    assert fake_server.peak_in_flight <= fake_server.info["max_num_seqs"]


def many(n: int) -> list[RagRequest]:
    return [
        RagRequest(
            f"q{i}", [DOCS[i % 5], f"Private note {i} about the school.\n"], SYSTEM, max_tokens=2
        )
        for i in range(n)
    ]


async def run_many(
    server: FakeServer, make_client: Callable[..., SpanClient], strategy: Strategy, **options: Any
) -> list[RagResult]:
    server.delay_s = 0.002
    async with make_client(max_in_flight=3) as client:
        outcomes = [o async for o in client.rag_many(many(12), strategy=strategy, **options)]
    assert sorted(i for i, _ in outcomes) == list(range(12))
    assert server.peak_in_flight <= 3
    return [result for _, result in outcomes]


async def test_rag_many_sends_requests_while_it_builds_the_later_jobs(fake_server, fake_client):
    """The first prompts leave before the window's last job is built (tokenized): the server
    starts while the client still lays out the rest."""
    received_when_built: list[int] = []

    def requests():
        for request in many(12):  # fewer than one window (2 x max_in_flight)
            received_when_built.append(len(fake_server.requests))
            yield request

    async with fake_client() as client:
        outcomes = [o async for o in client.rag_many(requests())]
    assert len(outcomes) == 12 and all(isinstance(r, RagResult) for _, r in outcomes)
    assert received_when_built[0] == 0 and received_when_built[-1] > 0


async def test_isps_sends_a_final_only_after_its_own_spans_without_a_barrier(
    fake_server, fake_client
):
    results = await run_many(fake_server, fake_client, Strategy.ISPS)
    finals = fake_server.of_kind("final")
    for final in finals:
        needed = [
            r
            for r in fake_server.requests
            if r.kind in ("prefix", "span") and _contains(final.prompt, r.prompt)
        ]
        assert len(needed) == 3  # prefix and both documents
        assert all(r.completed is not None and r.completed < final.received for r in needed)
    # No global barrier: some final goes out before the last span prefill completes.
    last_span_done = max(r.completed for r in fake_server.of_kind("span"))
    assert min(f.received for f in finals) < last_span_done
    assert all(isinstance(r, RagResult) and r.cached_tokens for r in results)


async def test_inline_final_that_fails_hands_its_spans_to_the_sample_waiting_for_them(
    fake_server, fake_client
):
    """Fault injection: the first final claimed the shared spans and fails before its first
    token; the sample that waited for it computes them in its own final, and a later sample
    finds them cached."""
    fake_server.delay_s = 0.01
    fake_server.faults.append("400")
    async with fake_client() as client:
        first, second = await asyncio.gather(
            *(client.rag(system=SYSTEM, docs=DOCS[:2], task=t, max_tokens=1, strategy=Strategy.INLINE)
              for t in ("qa", "qb")),
            return_exceptions=True,
        )
        third = await client.rag(system=SYSTEM, docs=DOCS[1::-1], task="qc", max_tokens=1, strategy=Strategy.INLINE)
        cacheable = client.rag_layout(RagRequest("qc", DOCS[1::-1], SYSTEM)).cacheable_tokens
    assert isinstance(first, RequestError) and "injected 400" in str(first)
    assert isinstance(second, RagResult) and second.computed_tokens == second.prompt_tokens
    assert third.cached_tokens == cacheable and third.computed_tokens == third.prompt_tokens - cacheable
    assert {r.kind for r in fake_server.requests} == {"final"}
    assert fake_server.peak_in_flight == 1  # the second final went out only once the first had failed


async def test_batched_prefills_a_whole_batch_before_its_finals(
    fake_server, fake_client, sdk_tokenizer
):
    await run_many(fake_server, fake_client, Strategy.BATCHED, window=4)
    finals = fake_server.of_kind("final")
    groups: dict[int, list[Recorded]] = {}
    for final in finals:
        groups.setdefault(task_index(final, fake_server, sdk_tokenizer) // 4, []).append(final)
    assert sorted(groups) == [0, 1, 2] and all(len(g) == 4 for g in groups.values())
    for group in groups.values():
        spans = [
            s for f in group for s in fake_server.of_kind("span") if _contains(f.prompt, s.prompt)
        ]
        assert max(s.completed for s in spans) < min(f.received for f in group)


def task_index(final: Recorded, server: FakeServer, tokenizer: Any) -> int:
    """The ``i`` of the ``q<i>`` task a final prompt carries after its PDep."""
    tail = tokenizer.decode(final.prompt[final.prompt.index(server.pdep) + 1 :])
    return int(re.match(r"q(\d+)", tail).group(1))


async def test_baseline_sends_plain_prompts_only(fake_server, fake_client):
    results = await run_many(fake_server, fake_client, Strategy.BASELINE)
    assert {r.kind for r in fake_server.requests} == {"final"}
    markers = {fake_server.ssep, fake_server.pdep, fake_server.pad}
    assert all(not markers & set(r.prompt) for r in fake_server.requests)
    assert all(isinstance(r, RagResult) for r in results)


async def test_a_failing_sample_does_not_stop_the_others(fake_server, fake_client):
    requests = [*many(3), RagRequest("q", ["x " * 5000]), RagRequest("q", [""])]
    async with fake_client() as client:
        outcomes = dict([o async for o in client.rag_many(requests)])
    assert all(isinstance(outcomes[i], RagResult) for i in range(3))
    assert isinstance(outcomes[3], PromptTooLongError)
    assert isinstance(outcomes[4], InvalidDocumentError)


async def test_prompt_checks_fail_before_sending(fake_server, fake_client):
    async with fake_client() as client:
        with pytest.raises(PromptTooLongError, match="max_model_len is 2048"):
            await client.rag(docs=["water " * 3000], task="q")
        with pytest.raises(InvalidDocumentError, match="document 1 is empty"):
            await client.rag(docs=["fine", ""], task="q")
        with pytest.raises(PromptError, match="task"):
            await client.rag(docs=["fine"], task=" ")
        with pytest.raises(InvalidDocumentError, match=r"document 0 has a lone surrogate '\\udcff' at character 2"):
            await client.rag(docs=["ab\udcff"], task="q")
        with pytest.raises(PromptError, match=r"text 'Why\\udc80\?' has a lone surrogate"):
            await client.rag(docs=["fine"], task="Why\udc80?")
        with pytest.raises(PromptError, match="cache_salt must be a non-empty string"):
            await client.rag(docs=["fine"], task="q", cache_salt="")
    assert fake_server.requests == []
    with pytest.raises(ConfigError, match="max_in_flight must be at least 1"):
        fake_client(max_in_flight=0)


BAD_SALTS = ["alice@example.com", "a/b", "back\\slash", "nul\x00", "x" * 129]


@pytest.mark.parametrize("salt", BAD_SALTS)
async def test_a_salt_the_server_would_refuse_fails_once_before_sending(fake_server, fake_client, salt):
    with pytest.raises(PromptError, match=r"cache_salt .*a salt is 1-128 characters without '@', '/'"):
        fake_client(cache_salt=salt)
    async with fake_client() as client:
        with pytest.raises(PromptError, match="the server's rule"):
            await client.rag(docs=["fine"], task="q", cache_salt=salt)
    assert fake_server.requests == []


@pytest.mark.parametrize("salt", [*BAD_SALTS, "tenant-a", "x" * 128, "é:ok"])
def test_the_salt_rule_is_vllms(salt):
    from vllm.entrypoints.generate.base.protocol import validate_cache_salt

    def refused(check) -> bool:
        try:
            check(salt)
        except Exception:  # PromptError; vLLM's VLLMValidationError
            return True
        return False

    assert refused(check_cache_salt) == refused(validate_cache_salt)


async def test_cache_salts_go_with_every_request_and_keep_prefills_apart(fake_server, fake_client):
    async with fake_client(cache_salt="tenant-a") as client:
        await client.rag(system=SYSTEM, docs=DOCS[:2], task="q1", max_tokens=1)
        await client.rag(system=SYSTEM, docs=DOCS[:2], task="q2", max_tokens=1)  # prefills reused
        await client.rag(system=SYSTEM, docs=DOCS[:2], task="q3", max_tokens=1, cache_salt="tenant-b")
    salts = sorted((r.body.get("cache_salt"), r.kind) for r in fake_server.requests)
    a = [("tenant-a", "final")] * 2 + [("tenant-a", "prefix")] + [("tenant-a", "span")] * 2
    b = [("tenant-b", "final"), ("tenant-b", "prefix")] + [("tenant-b", "span")] * 2
    assert salts == a + b


async def test_rag_stream_yields_deltas(fake_server, fake_client):
    async with fake_client() as client:
        deltas = [
            d async for d in client.rag_stream(system=SYSTEM, docs=DOCS[:1], task="q", max_tokens=3)
        ]
    assert deltas == ["t100 ", "t101 ", "t102 "]
    assert [r.kind for r in fake_server.requests] == ["prefix", "span", "final"]


async def test_prompt_cache_modules_are_named_spans(fake_server, fake_client):
    async with fake_client() as client:
        client.add_module("policy", "Always cite the document number.\n")
        for doc in DOCS[:2]:
            result = await client.rag(modules=["policy"], docs=[doc], task="q", max_tokens=1)
            assert (
                result.cached_tokens
                == client.rag_layout(RagRequest("q", [doc], modules=["policy"])).cacheable_tokens
            )
        with pytest.raises(PromptError, match="unknown module 'fewshot'"):
            await client.rag(modules=["fewshot"], task="q")
        with pytest.raises(PromptError, match="cannot follow modules"):
            await client.rag(modules=["policy"], docs=DOCS[:1], task="q", technique=LeadInContext(as_text=True))
    assert len(fake_server.of_kind("span")) == 3  # the module once, two documents


async def test_epic_sends_heads_in_context_and_tails_as_spans(fake_server, fake_client):
    fake_server.gapped_hits = True
    doc = " ".join(["water light house"] * 20)
    async with fake_client() as client:
        result = await client.rag(
            system=SYSTEM, docs=[doc], task="q", technique=Epic(k=1), max_tokens=1
        )
    (final,) = fake_server.of_kind("final")
    assert final.prompt.count(fake_server.pdep) == 2  # the head and the task
    (tail,) = fake_server.of_kind("span")
    # The head is computed in context; the prefix before it and the tail after it are reused.
    assert result.cached_tokens == final.prompt.index(fake_server.pdep) + len(tail.prompt)


async def test_refreshed_heads_send_heads_in_context_and_whole_documents_as_hidden_head_spans(
    fake_server, fake_client
):
    doc = " ".join(["water light house"] * 20)
    async with fake_client() as client:
        await client.rag(system=SYSTEM, docs=[doc], task="q", technique=RefreshedHeads(), max_tokens=1)
    (final,) = fake_server.of_kind("final")
    (span,) = fake_server.of_kind("span")
    assert final.prompt.count(fake_server.pdep) == 2 and fake_server.ssep not in final.prompt
    assert span.prompt[0] == fake_server.hsep and _contains(final.prompt, span.prompt)


async def test_a_server_without_hsep_serves_everything_but_hidden_heads(fake_server, fake_client):
    fake_server.info["hsep_token_id"] = None
    async with fake_client() as client:
        assert client.info.hsep_token_id is None
        await client.rag(docs=DOCS[:1], task="q", max_tokens=1)
        with pytest.raises(ConfigError, match="publishes no hsep_token_id"):
            await client.rag(docs=DOCS[:1], task="q", technique=RefreshedHeads(), max_tokens=1)


def test_server_info_reads_hsep_when_published() -> None:
    base = {"block_size": 16, "ssep_token_id": 5, "pdep_token_id": 6, "pad_token_id": 7, "max_num_seqs": 4,
            "max_model_len": 2048, "model": "m", "tokenizer": "t", "vllm_version": "v", "minipic_version": "v",
            "instance_id": "i", "protocol_version": PROTOCOL_VERSION, "hsep_token_id": None}  # fmt: skip
    assert ServerInfo.from_json({**base, "hsep_token_id": 2048}).marker_ids == {5, 6, 7, 2048}
    assert ServerInfo.from_json(base).hsep_token_id is None
    assert ServerInfo.from_json(base).marker_ids == {5, 6, 7}
    assert ServerInfo.from_json(ServerInfo.from_json(base).to_json()) == ServerInfo.from_json(base)
    with pytest.raises(InfoError, match="'hsep_token_id' is 'x'"):
        ServerInfo.from_json({**base, "hsep_token_id": "x"})
    with pytest.raises(InfoError, match="'hsep_token_id' is None"):  # null is published, never left out
        ServerInfo.from_json({k: v for k, v in base.items() if k != "hsep_token_id"})


def test_server_info_reads_the_compact_reading_absent_from_older_servers() -> None:
    base = ServerInfo.stock(model="m", max_model_len=8, tokenizer="t", max_num_seqs=1).to_json()
    assert ServerInfo.from_json({**base, "compact": True}).compact
    assert not ServerInfo.from_json({k: v for k, v in base.items() if k != "compact"}).compact
    with pytest.raises(InfoError, match="'compact' is 'yes', expected bool"):
        ServerInfo.from_json({**base, "compact": "yes"})


def test_server_info_reads_the_span_bias_absent_from_older_servers() -> None:
    base = ServerInfo.stock(model="m", max_model_len=8, tokenizer="t", max_num_seqs=1).to_json()
    assert ServerInfo.from_json({**base, "span_bias": -1}).span_bias == -1.0
    assert ServerInfo.from_json({k: v for k, v in base.items() if k != "span_bias"}).span_bias == 0.0
    with pytest.raises(InfoError, match="'span_bias' is 'low', expected a number"):
        ServerInfo.from_json({**base, "span_bias": "low"})


@pytest.mark.parametrize("version", [None, PROTOCOL_VERSION + 1])
async def test_a_server_of_another_protocol_version_is_refused_in_one_line(fake_server, fake_client, version):
    fake_server.info["protocol_version"] = version
    fake_server.info["minipic_version"] = "9.9"
    with pytest.raises(ConfigError) as refused:
        async with fake_client():
            pass
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("http://fake/: the server speaks MiniPIC protocol ")
    assert f"(MiniPIC 9.9), this client speaks {PROTOCOL_VERSION}" in message


async def test_restarted_server_gets_its_spans_prefilled_again(fake_server, fake_client):
    async with fake_client(info_check_interval_s=0) as client:
        await client.rag(system=SYSTEM, docs=DOCS[:2], task="q", max_tokens=1)
        old = client.info.instance_id
        fake_server.restart()
        stale = await client.rag(system=SYSTEM, docs=DOCS[:2], task="q2", max_tokens=1)
        assert stale.cached_tokens == 0  # the client did not know yet
        assert client.info.instance_id != old
        fresh = await client.rag(system=SYSTEM, docs=DOCS[:2], task="q3", max_tokens=1)
        expected = client.rag_layout(RagRequest("q3", DOCS[:2], SYSTEM)).cacheable_tokens
    assert fresh.cached_tokens == expected
    # Forgotten on the new instance id, so both documents were prefilled again.
    assert [r.kind for r in fake_server.requests].count("span") == 4


async def test_restart_with_another_setup_needs_a_new_client(fake_server, fake_client):
    async with fake_client(info_check_interval_s=0) as client:
        await client.rag(docs=DOCS[:1], task="q", max_tokens=1)
        fake_server.restart()
        fake_server.info["block_size"] = 32
        with pytest.raises(ConfigError, match="create a new SpanClient"):
            await client.rag(docs=DOCS[:1], task="q2", max_tokens=1)


async def test_generate_sends_part_built_prompts(fake_server, fake_client, sdk_tokenizer):
    parts = [Text("Notes:"), Span(DOCS[0]), Span(DOCS[1]), Dependent("Summarise.")]
    async with fake_client() as client:
        result = await client.generate(parts, max_tokens=2)
        layout = client.layout(parts)
    (final,) = fake_server.of_kind("final")
    assert final.prompt == layout.token_ids and final.prompt[0] == sdk_tokenizer.bos_token_id
    assert [r.kind for r in fake_server.requests] == ["prefix", "span", "span", "final"]
    assert result.cached_tokens == layout.cacheable_tokens


async def test_a_calls_prefills_travel_in_one_request(fake_server, fake_client):
    async with fake_client() as client:
        await client.rag(system=SYSTEM, docs=DOCS[:3], task="q", max_tokens=1)
    assert [r.kind for r in fake_server.requests] == ["prefix", "span", "span", "span", "final"]
    assert fake_server.http_requests == 2


async def test_prefill_requests_hold_a_slot_per_prompt(fake_server, fake_client):
    # 20 documents and a prefix under max_num_seqs 8: requests of at most 8 prompts, and
    # never more than 8 prompts in flight at the server.
    docs = [f"Document number {i} is about the river.\n" for i in range(20)]
    async with fake_client() as client:
        await client.rag(system=SYSTEM, docs=docs, task="q", max_tokens=1)
    assert len(fake_server.of_kind("span")) == 20
    assert fake_server.http_requests == 3 + 1
    assert fake_server.peak_in_flight <= fake_server.info["max_num_seqs"]


async def test_a_batch_of_mixed_salts_sends_each_salts_prefills_apart(fake_server, fake_client):
    requests = [RagRequest(f"q{i}", DOCS[:2], SYSTEM, max_tokens=1, cache_salt=salt)
                for i, salt in enumerate(["a", "b", "a", None])]
    async with fake_client() as client:
        outcomes = [o async for _, o in client.rag_many(requests, strategy=Strategy.BATCHED)]
    assert all(isinstance(o, RagResult) for o in outcomes)
    prefills = sorted((r.body.get("cache_salt") or "", r.kind) for r in fake_server.requests if r.kind != "final")
    assert prefills == [(salt, kind) for salt in ("", "a", "b") for kind in ("prefix", "span", "span")]


async def test_evicted_spans_are_prefilled_again(fake_server, fake_client):
    async with fake_client() as client:
        await client.rag(system=SYSTEM, docs=DOCS[:2], task="q1", max_tokens=1)
        cacheable = client.rag_layout(RagRequest("q2", DOCS[:2], SYSTEM)).cacheable_tokens
        fake_server.evict()
        short = await client.rag(system=SYSTEM, docs=DOCS[:2], task="q2", max_tokens=1)
        again = await client.rag(system=SYSTEM, docs=DOCS[:2], task="q3", max_tokens=1)
    assert short.cached_tokens < cacheable
    assert again.cached_tokens == cacheable
    assert len(fake_server.of_kind("span")) == 4  # each document prefilled twice


async def test_calls_naming_no_layout_lead_with_text_then_refreshed_heads_or_block_attention_without_hidden_heads(
    fake_server, fake_client, caplog
) -> None:
    async with fake_client(technique=None) as client:
        assert client.default_technique == LeadInContext(RefreshedHeads(first=4), as_text=True, repeat=True,
                                                         hide_repeat=True)
        layout = client.rag_layout(RagRequest("q", [DOCS[0] * 3, DOCS[1] * 3], SYSTEM))
        assert fake_server.hsep in layout.token_ids
        refreshed = client.rag_layout(RagRequest("q", [DOCS[0] * 3, DOCS[1] * 3], SYSTEM, technique=RefreshedHeads()))
        # The first document once more, as text continuing the system prompt's prefix, which
        # is prefilled only up to it: every call shares the same prefix prefill.
        assert len(layout.token_ids) > len(refreshed.token_ids)
        swapped = client.rag_layout(RagRequest("q", [DOCS[1] * 3, DOCS[0] * 3], SYSTEM))
        prefix, swapped_prefix = ([p.key for p in x.prefills if p.kind == "prefix"] for x in (layout, swapped))
        assert prefix == swapped_prefix and len(prefix) == 1
        # Modules are spans before the documents: no document can continue the prefix there.
        client.add_module("policy", DOCS[2])
        with_modules = RagRequest("q", [DOCS[0] * 3], SYSTEM, modules=["policy"])
        by_rest = replace(with_modules, technique=RefreshedHeads(first=4))
        assert client.rag_layout(with_modules) == client.rag_layout(by_rest)
    # The plain prompt holds each document once, whatever the default adds to its PIC layout.
    async with fake_client(technique=None) as client:
        request = RagRequest("q", DOCS[:3], SYSTEM)
        plain = client.rag_layout(request, strategy=Strategy.BASELINE)
        assert plain == client.rag_layout(replace(request, technique=BlockAttention()), strategy=Strategy.BASELINE)
        assert not plain.prefills and len(plain.token_ids) < len(client.rag_layout(request).token_ids)
    fake_server.info["hsep_token_id"] = None
    async with fake_client(technique=None) as client:
        with caplog.at_level("WARNING", logger="minipic_client"):
            assert client.default_technique == BlockAttention()
            assert client.default_technique == BlockAttention()
        assert sum("no hidden-head marker" in r.message for r in caplog.records) == 1
    async with fake_client(technique=Epic(2)) as client:
        assert client.default_technique == Epic(2)


async def test_preload_prefills_spans_without_finals(fake_server, fake_client):
    requests = [RagRequest(f"q{i}", DOCS[i : i + 2], SYSTEM, max_tokens=2) for i in range(3)]
    async with fake_client() as client:
        await client.preload(requests)
        assert {r.kind for r in fake_server.requests} == {"prefix", "span"}
        assert len(fake_server.of_kind("span")) == 4  # DOCS[0..3], each once
        sent = len(fake_server.requests)
        result = await client.rag(task="q1", docs=DOCS[1:3], system=SYSTEM, max_tokens=2)
    assert [r.kind for r in fake_server.requests[sent:]] == ["final"]
    assert result.cached_tokens == client.rag_layout(requests[1]).cacheable_tokens
