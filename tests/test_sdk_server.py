"""The client SDK against a real `minipic serve` (the tiny model, 16-token blocks)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import httpx
import pytest
from transformers import AutoTokenizer

from minipic_client import BlockAttention, RagRequest, RagResult, RequestEvent, SpanClient, SpanRAG, Strategy
from minipic_server.markers import PDEP_TOKEN, SSEP_TOKEN

from batch_signals import batch_command, batch_signalling_itself
from server_api import acomplete

pytestmark = pytest.mark.server

SYSTEM = "Answer from the documents."


def fresh_docs(n: int) -> list[str]:
    """Documents no earlier test put in this module's server cache, each different from its
    first token on (the default layout lays the first document out as text after the system
    prompt, where a block the documents' shared opening words fill would be cached)."""
    tag = uuid.uuid4().hex[:8]
    return [
        f"{i}. Report {tag}: the river runs past mill {i} and the old school.\n"
        for i in range(n)
    ]


async def test_rag_reports_documents_cached(pic_server):
    docs = fresh_docs(3)
    system = f"{SYSTEM} Case {uuid.uuid4().hex[:8]}."  # no earlier test's text after it
    async with SpanClient(pic_server.url) as client:
        first = await client.rag(system=system, docs=docs, task="Which mill?", max_tokens=4)
        reordered = RagRequest("Which school?", docs[::-1], system, max_tokens=4)
        second = await client.rag(
            system=system, docs=docs[::-1], task="Which school?", max_tokens=4
        )
        expected_first = client.rag_layout(RagRequest("Which mill?", docs, system)).cacheable_tokens
        expected_second = client.rag_layout(reordered).cacheable_tokens
    assert first.cached_tokens == expected_first > 0
    assert second.cached_tokens == expected_second == expected_first
    assert len(first.token_ids) == 4 and first.ttft_s > 0


async def test_each_call_reports_what_it_made_the_server_compute(pic_server):
    """Two identical calls: both find the spans cached in their final prompt, but only the
    first paid for them (before, both said cached=N/M and nothing else)."""
    docs = fresh_docs(3)
    async with SpanClient(pic_server.url, technique=BlockAttention()) as client:
        before = client.computed_tokens
        cold = await client.rag(system=SYSTEM, docs=docs, task="Which mill?", max_tokens=2)
        warm = await client.rag(system=SYSTEM, docs=docs, task="Which mill?", max_tokens=2)
        cacheable = client.rag_layout(RagRequest("Which mill?", docs, SYSTEM)).cacheable_tokens
        run = client.computed_tokens - before
    assert cold.cached_tokens == warm.cached_tokens == cacheable  # the final prompts alone look alike
    # The system prompt may be cached by an earlier test; the fresh documents are not.
    assert cold.prompt_tokens - cacheable < cold.computed_tokens <= cold.prompt_tokens
    assert warm.computed_tokens == warm.prompt_tokens - cacheable  # the question only
    assert warm.reused_tokens == cacheable and cold.reused_tokens == cold.prompt_tokens - cold.computed_tokens
    assert run == cold.computed_tokens + warm.computed_tokens


async def test_results_equal_the_same_tokens_sent_by_hand(pic_server):
    request = RagRequest("Where does the river run?", fresh_docs(2), SYSTEM, max_tokens=8)
    async with SpanClient(pic_server.url) as client:
        result = await client.rag(
            system=request.system,
            docs=request.docs,
            task=request.task,
            max_tokens=request.max_tokens,
        )
        layout = client.rag_layout(request)
    async with httpx.AsyncClient() as http:
        by_hand = await acomplete(http, pic_server, layout.token_ids, max_tokens=8, logprobs=None)
    assert result.token_ids == by_hand.token_ids
    assert result.text == AutoTokenizer.from_pretrained(pic_server.model).decode(by_hand.token_ids)
    assert result.prompt_tokens == by_hand.prompt_tokens == len(layout.token_ids)


async def test_concurrent_calls_prefill_each_document_once(pic_server):
    docs = fresh_docs(5)
    events: list[RequestEvent] = []
    async with SpanClient(pic_server.url, on_request=events.append) as client:
        results = await asyncio.gather(
            *(
                client.rag(
                    system=SYSTEM,
                    docs=[docs[i % 5], docs[(i + 2) % 5]],
                    task=f"Question {i}?",
                    max_tokens=2,
                )
                for i in range(50)
            )
        )
        expected = client.rag_layout(RagRequest("Question 0?", docs[:1], SYSTEM)).cacheable_tokens
    # One prefill per document and one for the system prefix, several per request.
    assert sum(e.prompts for e in events if e.kind != "final") == 6
    assert [e.kind for e in events].count("final") == 50
    assert all(r.cached_tokens is not None and r.cached_tokens > expected for r in results)


async def test_marker_literal_text_creates_no_span_boundary(pic_server):
    doc = f"Quoting {SSEP_TOKEN} and {PDEP_TOKEN} inside a document {uuid.uuid4().hex}.\n"
    request = RagRequest(f"What is {SSEP_TOKEN}?", [doc], SYSTEM, max_tokens=4)
    async with SpanClient(pic_server.url, technique=BlockAttention()) as client:
        result = await client.rag(system=SYSTEM, docs=[doc], task=request.task, max_tokens=4)
        layout = client.rag_layout(request)
        ssep = client.info.ssep_token_id
    assert layout.token_ids.count(ssep) == 1
    assert result.cached_tokens == layout.cacheable_tokens
    async with httpx.AsyncClient() as http:
        by_hand = await acomplete(http, pic_server, layout.token_ids, max_tokens=4, logprobs=None)
    assert result.token_ids == by_hand.token_ids


class RecordingTransport(httpx.AsyncHTTPTransport):
    """The real transport, noting when each completion request went out and was answered."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[float, float, dict]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        sent = time.monotonic()
        response = await super().handle_async_request(request)
        if request.url.path == "/v1/completions":
            # A prefill answers only when it is done; a final's stream starts at once.
            self.log.append((sent, time.monotonic(), json.loads(request.content)))
        return response


def contains_at_block(prompt: list[int], part: list[int], block_size: int) -> bool:
    return any(
        prompt[start : start + len(part)] == part for start in range(0, len(prompt), block_size)
    )


async def test_isps_sends_each_final_only_after_its_spans_are_cached(pic_server):
    docs = fresh_docs(6)
    requests = [
        RagRequest(f"Question {i}?", [docs[i % 6], docs[(i + 1) % 6], docs[(i + 3) % 6]], SYSTEM,
                   max_tokens=2)
        for i in range(12)
    ]
    transport = RecordingTransport()
    async with SpanClient(pic_server.url, transport=transport, max_in_flight=4) as client:
        outcomes = [outcome async for _, outcome in client.rag_many(requests)]
        block_size = client.info.block_size
    assert all(isinstance(o, RagResult) for o in outcomes)
    prefills = [  # a prefill request may carry several prompts
        (done, prompt)
        for _, done, body in transport.log
        if not body.get("stream")
        for prompt in (body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]])
    ]
    finals = [(sent, body["prompt"]) for sent, _, body in transport.log if body.get("stream")]
    assert len(finals) == 12 and len(prefills) == 7  # the prefix and six documents, once each
    for sent, prompt in finals:
        own = [done for done, part in prefills if contains_at_block(prompt, part, block_size)]
        assert len(own) == 4  # the prefix and this sample's three documents
        assert max(own) <= sent


async def test_inline_computes_each_cold_span_once_inside_the_finals_and_answers_as_isps(pic_server):
    """INLINE sends no prefill request: each cold span is computed in the first final that
    needs it (the others wait for that final), so the run computes exactly the tokens ISPS
    computes over the same cold spans, and every answer is ISPS's."""
    docs = fresh_docs(6)

    def requests(salt: str) -> list[RagRequest]:
        return [
            RagRequest(f"Question {i}?", [docs[i % 6], docs[(i + 1) % 6], docs[(i + 3) % 6]], SYSTEM,
                       max_tokens=4, cache_salt=salt)
            for i in range(12)
        ]

    async def run(strategy: Strategy, salt: str, transport: httpx.AsyncBaseTransport | None = None):
        async with SpanClient(pic_server.url, transport=transport, max_in_flight=4) as client:
            before = client.computed_tokens
            outcomes = dict([o async for o in client.rag_many(requests(salt), strategy=strategy)])
            return [outcomes[i] for i in range(12)], client.computed_tokens - before

    transport = RecordingTransport()
    inline, inline_computed = await run(Strategy.INLINE, "inline", transport)
    isps, isps_computed = await run(Strategy.ISPS, "isps")
    warm, warm_computed = await run(Strategy.INLINE, "isps")  # every span now cached
    assert all(isinstance(r, RagResult) for r in inline + isps + warm)
    assert all(body.get("stream") for _, _, body in transport.log) and len(transport.log) == 12
    assert inline_computed == isps_computed
    assert warm_computed == sum(r.prompt_tokens - r.cached_tokens for r in warm) < isps_computed / 2
    assert [r.token_ids for r in inline] == [r.token_ids for r in isps] == [r.token_ids for r in warm]


@dataclass
class _Doc:
    page_content: str


class _DuckRetriever:
    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    async def ainvoke(self, query: str) -> list[_Doc]:
        return [_Doc(t) for t in self.texts]


async def test_span_rag_answers_through_langchain_and_duck_typed_retrievers(pic_server):
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    class ListRetriever(BaseRetriever):
        texts: list[str]

        def _get_relevant_documents(self, query: str, *, run_manager) -> list[Document]:
            return [Document(page_content=t) for t in self.texts]

    docs = fresh_docs(2)
    async with SpanClient(pic_server.url, technique=BlockAttention()) as client:
        expected = client.rag_layout(RagRequest("Question: which mill?", docs, SYSTEM)).cacheable_tokens
        for retriever in (ListRetriever(texts=docs), _DuckRetriever(docs)):
            rag = SpanRAG(retriever, client, system=SYSTEM, task_template="Question: {question}",
                          max_tokens=3)
            result = await rag.ainvoke("which mill?")
            assert len(result.token_ids) == 3
            assert result.cached_tokens == expected

    # Blocking, streamed, through a new client that SpanRAG connects on its own loop thread.
    rag = SpanRAG(ListRetriever(texts=docs), SpanClient(pic_server.url, technique=BlockAttention()), system=SYSTEM,
                  task_template="Question: {question}", max_tokens=3)
    try:
        chunks = await asyncio.to_thread(lambda: list(rag.stream("which mill?")))
        invoked = await asyncio.to_thread(rag.invoke, "which mill?")
    finally:
        await asyncio.to_thread(rag.close)
    assert [len(c.token_ids) for c in chunks] == [1, 1, 1, 0]  # a chunk per token, then the usage
    whole = sum(chunks[1:], chunks[0])
    assert whole.token_ids == invoked.token_ids == result.token_ids and whole.text == invoked.text
    assert whole.cached_tokens == invoked.cached_tokens == expected
    # The new client sent its prefills again (vLLM recomputes a fully cached prompt's last
    # block); the second call sent none, so it reused every cached token.
    assert whole.computed_tokens > invoked.computed_tokens and invoked.reused_tokens == expected


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "minipic_client.cli", *args]


def test_rag_command(pic_server, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(fresh_docs(1)[0], encoding="utf-8")
    done = subprocess.run(
        cli(
            "rag",
            "--server",
            pic_server.url,
            "--system",
            SYSTEM,
            "--doc",
            str(doc),
            "--task",
            "Which mill?",
            "--max-tokens",
            "4",
        ),
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert re.search(r"\d+ prompt tokens: (\d+) computed \(span prefills included\), (\d+) from the cache", done.stderr)


def test_batch_killed_mid_run_resumes_with_every_id_once(pic_server, tmp_path):
    docs = fresh_docs(5)
    samples = [
        {
            "id": f"s{i}",
            "system": SYSTEM,
            "docs": [docs[i % 5], docs[(i + 1) % 5]],
            "task": f"Question {i}?",
        }
        for i in range(80)
    ]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    args = (str(inp), "--server", pic_server.url, "--output", str(out), "--max-tokens", "16", "--max-in-flight", "2")

    killed = subprocess.run(
        batch_signalling_itself(*args, after_results=5, signum=signal.SIGKILL),
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    written = out.read_text().count("\n")
    assert written == 5
    with out.open("a", encoding="utf-8") as f:
        f.write('{"id": "s79", "te')  # what a kill during a write leaves

    done = subprocess.run(batch_command(*args), capture_output=True, text=True, timeout=600, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert f"{written} of {len(samples)} samples done" in done.stderr
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(s["id"] for s in samples)
    assert "samples/s" in done.stderr and "TTFT p50" in done.stderr
    assert re.search(r"[\d,]+ prompt tokens computed \(span prefills included\), [\d.]+% of [\d,]+ from the cache",
                     done.stderr)


async def test_load_at_the_concurrency_cap_has_no_failures(pic_server):
    """CI's short version of `make reliability`: 300 calls, max_num_seqs in flight."""
    pool = fresh_docs(40)
    requests = [RagRequest(f"Question {i}?", [pool[(i * 7 + k) % 40] for k in range(3)], SYSTEM, max_tokens=4)
                for i in range(300)]
    async with SpanClient(pic_server.url) as client:
        outcomes = [outcome async for _, outcome in client.rag_many(requests)]
    failures = [o for o in outcomes if not isinstance(o, RagResult)]
    assert not failures, failures[:3]
    cached = sum(o.cached_tokens for o in outcomes) / sum(o.prompt_tokens for o in outcomes)
    assert cached > 0.8


async def test_cache_salts_isolate_spans_and_equal_salts_share_them(pic_server):
    docs = [d * 3 for d in fresh_docs(2)]  # several blocks each, so a hit shows in cached_tokens

    async def cached_in_prefills(salt: str) -> int:
        """Tokens the server found cached in a fresh client's prefills (the prefix and two spans)."""
        events: list[RequestEvent] = []
        async with SpanClient(pic_server.url, cache_salt=salt, on_request=events.append) as client:
            await client.rag(system=SYSTEM, docs=docs, task="Which mill?", max_tokens=1)
        prefills = [e for e in events if e.kind != "final"]
        assert sum(e.prompts for e in prefills) == 3
        return sum(e.cached_tokens or 0 for e in prefills)

    assert await cached_in_prefills("alice") == 0
    assert await cached_in_prefills("bob") == 0  # bob does not hit alice's prefix or spans
    assert await cached_in_prefills("alice") >= 3 * 16  # alice's second client does
