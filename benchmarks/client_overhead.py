"""The client SDK's own time per `rag` call, with warm caches and no server.

Requests go to an httpx.MockTransport that answers from prebuilt bytes, so what
is measured is the SDK: layout from cached tokens, prefill dedup, the in-flight
semaphore, httpx request building and JSON encoding, SSE parsing and result
assembly. Target: p50 under 0.5 ms. Same-run baseline: a bare httpx streamed POST
of the same final prompt over the same transport (what any client pays).

    PYTHONPATH=server_patch:kernels:sdk python benchmarks/client_overhead.py
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

import httpx

from minipic_client import RagRequest, SpanClient
from minipic_server.markers import PAD_TOKEN, PDEP_TOKEN, SSEP_TOKEN
from minipic_server.tiny_model import make_tiny_model


def mock_server(model_dir: Path, vocab: dict[str, int], max_tokens: int) -> httpx.MockTransport:
    info = {
        "block_size": 16,
        "ssep_token_id": vocab[SSEP_TOKEN],
        "pdep_token_id": vocab[PDEP_TOKEN],
        "pad_token_id": vocab[PAD_TOKEN],
        "max_num_seqs": 64,
        "max_model_len": 8192,
        "model": "tiny",
        "tokenizer": str(model_dir),
        "vllm_version": "mock",
        "minipic_version": "mock",
        "instance_id": "bench",
    }
    events = [
        {"choices": [{"index": 0, "text": " word", "token_ids": [500 + i]}]}
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
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49] * 1e3, cuts[98] * 1e3


async def measure(model_dir: Path, args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    transport = mock_server(model_dir, tokenizer.get_vocab(), args.max_tokens)
    words = "the river runs past the old mill and the school near the water".split()
    docs = [
        " ".join(words[(i + j) % len(words)] for j in range(args.doc_words)) + "\n"
        for i in range(args.docs)
    ]
    request = RagRequest(
        "Which mill is by the river?",
        docs,
        "Answer from the documents.",
        max_tokens=args.max_tokens,
    )
    async with SpanClient("http://mock", tokenizer=str(model_dir), transport=transport) as client:
        layout = client.rag_layout(request)
        kwargs = {
            "system": request.system,
            "docs": docs,
            "task": request.task,
            "max_tokens": args.max_tokens,
        }
        for _ in range(args.warmup):
            await client.rag(**kwargs)
        body = {"model": "tiny", "prompt": layout.token_ids, "max_tokens": args.max_tokens,
                "stream": True, "stream_options": {"include_usage": True}}
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
    call_p50, call_p99 = percentiles(calls)
    layout_p50, layout_p99 = percentiles(layouts)
    bare_p50, bare_p99 = percentiles(bare)
    machine = platform.processor() or platform.machine()
    print(f"machine: {machine}, python {platform.python_version()}, httpx {httpx.__version__}")
    print(
        f"prompt: {len(layout.token_ids)} tokens ({args.docs} docs, {len(layout.prefills)} prefills), "
        f"{args.max_tokens} streamed tokens, {args.calls} calls after {args.warmup} warm-up"
    )
    print(f"rag call   p50 {call_p50:.3f} ms   p99 {call_p99:.3f} ms")
    print(f"layout     p50 {layout_p50:.3f} ms   p99 {layout_p99:.3f} ms")
    print(f"bare POST  p50 {bare_p50:.3f} ms   p99 {bare_p99:.3f} ms   (same prompt, httpx alone)")
    print(f"rag / bare POST at p50: {call_p50 / bare_p50:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", type=Path, help="model directory (default: build the tiny model)"
    )
    parser.add_argument("--docs", type=int, default=5)
    parser.add_argument("--doc-words", type=int, default=150)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    if args.model is not None:
        asyncio.run(measure(args.model, args))
        return
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(measure(make_tiny_model(tmp), args))


if __name__ == "__main__":
    main()
