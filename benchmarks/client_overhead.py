"""The client SDK's own time per `rag` call, with warm caches and no server.

Requests go to an httpx.MockTransport that answers from prebuilt bytes, so what
is measured is the SDK: layout from cached tokens, prefill dedup, the in-flight
semaphore, httpx request building and JSON encoding, SSE parsing and result
assembly. Target: p50 under 0.5 ms for a few documents. Same-run baseline: a bare
httpx streamed POST of the same final prompt over the same transport (what any client
pays). ``--docs 5 32`` runs both sizes docs/client.md quotes: five short documents, and
32 of ~1,000 tokens (Figure 2's largest prompt), whose share of a cached request's TTFT
this is.

    PYTHONPATH=server_patch:kernels:sdk python benchmarks/client_overhead.py --docs 5 32 \\
        --doc-words 150 800 --out benchmarks/results/client-overhead-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from results_io import write_result

from minipic_client import RagRequest, SpanClient
from minipic_protocol.info import ServerInfo
from minipic_server.markers import HSEP_TOKEN, PAD_TOKEN, PDEP_TOKEN, SSEP_TOKEN
from minipic_server.tiny_model import make_tiny_model

from provenance import provenance


def mock_server(model_dir: Path, vocab: dict[str, int], max_tokens: int) -> httpx.MockTransport:
    info = ServerInfo(
        block_size=16,
        ssep_token_id=vocab[SSEP_TOKEN],
        pdep_token_id=vocab[PDEP_TOKEN],
        pad_token_id=vocab[PAD_TOKEN],
        hsep_token_id=vocab[HSEP_TOKEN],
        max_num_seqs=64,
        max_model_len=65536,
        model="tiny",
        tokenizer=str(model_dir),
        vllm_version="mock",
        minipic_version="mock",
        instance_id="bench",
    ).to_json()
    events = [
        {"choices": [{"index": 0, "text": " word", "token_ids": [500 + i],
                      "finish_reason": "length" if i == max_tokens - 1 else None}]}
        for i in range(max_tokens)
    ]
    usage = {
        "prompt_tokens": 0,
        "completion_tokens": max_tokens,
        "prompt_tokens_details": {"cached_tokens": 8192},
    }
    events.append({"choices": [], "usage": usage})
    stream = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
    prefill = json.dumps({"choices": [{"index": 0, "text": "x"}], "usage": usage}).encode()
    sse, js = {"content-type": "text/event-stream"}, {"content-type": "application/json"}

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/minipic/info":
            return httpx.Response(200, json=info)
        if b'"stream":true' in request.content:
            return httpx.Response(200, content=stream, headers=sse)
        return httpx.Response(200, content=prefill, headers=js)

    return httpx.MockTransport(handle)


def percentiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds."""
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49] * 1e3, cuts[98] * 1e3


async def measure(model_dir: Path, docs_count: int, doc_words: int, args: argparse.Namespace) -> dict[str, Any]:
    """One prompt size: the SDK's `rag` call, its layout alone and a bare httpx POST of the
    same final prompt, timed in turn `args.calls` times after `args.warmup` calls."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    transport = mock_server(model_dir, tokenizer.get_vocab(), args.max_tokens)
    words = "the river runs past the old mill and the school near the water".split()
    docs = [" ".join(words[(i + j) % len(words)] for j in range(doc_words)) + "\n" for i in range(docs_count)]
    request = RagRequest("Which mill is by the river?", docs, "Answer from the documents.", max_tokens=args.max_tokens)
    async with SpanClient("http://mock", tokenizer=str(model_dir), transport=transport) as client:
        layout = client.rag_layout(request)
        kwargs = {"system": request.system, "docs": docs, "task": request.task, "max_tokens": args.max_tokens}
        for _ in range(args.warmup):
            await client.rag(**kwargs)
        body = {"model": "tiny", "prompt": layout.token_ids, "max_tokens": args.max_tokens,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        calls, layouts, bare = [], [], []
        async with httpx.AsyncClient(base_url="http://mock", transport=transport) as http:
            for _ in range(args.calls):
                start = time.perf_counter()
                await client.rag(**kwargs)
                calls.append(time.perf_counter() - start)
                start = time.perf_counter()
                client.rag_layout(request)
                layouts.append(time.perf_counter() - start)
                start = time.perf_counter()
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    async for _ in response.aiter_lines():
                        pass
                bare.append(time.perf_counter() - start)
    timings = {"rag_call": calls, "layout": layouts, "bare_post": bare}
    shape = {"docs": docs_count, "doc_words": doc_words, "prompt_tokens": len(layout.token_ids),
             "prefills": len(layout.prefills)}  # fmt: skip
    return shape | {f"{name}_{cut}_ms": value for name, samples in timings.items()
                    for cut, value in zip(("p50", "p99"), percentiles(samples))}  # fmt: skip


def report(row: dict[str, Any], args: argparse.Namespace) -> str:
    return "\n".join([
        f"prompt: {row['prompt_tokens']} tokens ({row['docs']} docs, {row['prefills']} prefills), "
        f"{args.max_tokens} streamed tokens, {args.calls} calls after {args.warmup} warm-up",
        f"rag call   p50 {row['rag_call_p50_ms']:.3f} ms   p99 {row['rag_call_p99_ms']:.3f} ms",
        f"layout     p50 {row['layout_p50_ms']:.3f} ms   p99 {row['layout_p99_ms']:.3f} ms",
        f"bare POST  p50 {row['bare_post_p50_ms']:.3f} ms   p99 {row['bare_post_p99_ms']:.3f} ms   "
        "(same prompt, httpx alone)",
        f"rag / bare POST at p50: {row['rag_call_p50_ms'] / row['bare_post_p50_ms']:.2f}x",
    ])  # fmt: skip


async def measure_all(model_dir: Path, args: argparse.Namespace) -> None:
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}, "
          f"httpx {httpx.__version__}")  # fmt: skip
    rows = []
    for docs_count, doc_words in zip(args.docs, args.doc_words * len(args.docs) if len(args.doc_words) == 1
                                     else args.doc_words):  # fmt: skip
        rows.append(await measure(model_dir, docs_count, doc_words, args))
        print(report(rows[-1], args))
    if args.out is not None:
        write_result(args.out, {"provenance": provenance(), "httpx": httpx.__version__, "calls": args.calls,
                                "warmup": args.warmup, "max_tokens": args.max_tokens, "rows": rows})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="model directory (default: build the tiny model)")
    parser.add_argument("--docs", type=int, nargs="+", default=[5], help="documents per prompt, one run each")
    parser.add_argument("--doc-words", type=int, nargs="+", default=[150],
                        help="words per document: one for every run, or one per --docs")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--out", type=Path, help="also write the figures as a results JSON")
    args = parser.parse_args()
    if len(args.doc_words) not in (1, len(args.docs)):
        parser.error(f"--doc-words takes one value or one per --docs ({len(args.docs)}), got {len(args.doc_words)}")
    if args.model is not None:
        asyncio.run(measure_all(args.model, args))
        return
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(measure_all(make_tiny_model(tmp), args))


if __name__ == "__main__":
    main()
