"""``make demo``: a small RAG workload through a real `minipic serve`, three ways.

1. plain prompts, no markers (what vLLM's prefix cache does alone);
2. the PIC layout sent cold: every span computed inside its prompt;
3. the same samples through `SpanClient` with ISPS: spans prefilled once, then reused.

Runs 2 and 3 must produce identical tokens: a cached span answers exactly like an
uncached one. The embedded model has random weights, so the text is nonsense; the
token ids, TTFTs and cached-token counts are what to look at.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from minipic_client import RagRequest, RagResult, SpanClient, Strategy
from minipic_client.launch import local_server

SYSTEM = "You answer questions about a small town using the documents provided."
DOCS = [
    "The old mill was built in 1820 on the north bank of the river and ground wheat until 1954.",
    "The school opened in 1901 with four rooms; a library wing was added in 1933.",
    "The bridge over the river was rebuilt in stone after the flood of 1887 destroyed it.",
    "The market square hosts a fair every October, started by the guild of bakers in 1899.",
    "The railway station closed in 1962, and its building now houses the town museum.",
    "The church tower, 41 metres tall, is the highest point in town and holds six bells.",
]
SAMPLES = [
    ([0, 2, 4], "When was the mill built?"),
    ([4, 0, 1], "What is in the old station building?"),
    ([2, 5, 0], "What happened to the bridge in 1887?"),
    ([1, 3, 5], "Who started the October fair?"),
    ([5, 4, 3, 2], "How tall is the church tower?"),
]
MAX_TOKENS = 8
SERVER_ARGS = ("--dtype", "float32", "--block-size", "16", "--max-model-len", "2048",
               "--kv-cache-memory-bytes", str(64 << 20))

console = Console()


def requests() -> list[RagRequest]:
    return [RagRequest(task, [DOCS[i] for i in docs], SYSTEM, max_tokens=MAX_TOKENS) for docs, task in SAMPLES]


async def cold(client: SpanClient, url: str, request: RagRequest) -> RagResult:
    """The PIC prompt with no span prefilled: spans are computed inside it."""
    layout = client.rag_layout(request)
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        response = await http.post("/v1/completions", json={
            "model": client.info.model, "prompt": layout.token_ids, "max_tokens": MAX_TOKENS,
            "temperature": 0.0, "return_token_ids": True})
    response.raise_for_status()
    body = response.json()
    choice, usage = body["choices"][0], body["usage"]
    return RagResult(
        text=choice["text"], token_ids=choice["token_ids"], ttft_s=time.perf_counter() - started,
        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        prompt_tokens=usage["prompt_tokens"], finish_reason=choice.get("finish_reason"),
    )


async def run(url: str) -> bool:
    async with SpanClient(url) as client:
        plain = [await client.rag(**vars_of(r), strategy=Strategy.BASELINE) for r in requests()]
        cold_results = [await cold(client, url, r) for r in requests()]
        # Fresh documents never seen cold would be prefilled here; these hit what run 2 cached.
        warm: dict[int, RagResult] = {}
        async for index, outcome in client.rag_many(requests(), strategy=Strategy.ISPS):
            if isinstance(outcome, Exception):
                raise outcome
            warm[index] = outcome
    table = Table(title="5 RAG samples: plain | PIC without prefills | PIC with ISPS")
    # TTFT in ms; "hit" is usage.prompt_tokens_details.cached_tokens.
    for column in ("#", "plain ms", "hit", "no-prefill ms", "hit", "ISPS ms", "hit/prompt", "same"):
        table.add_column(column, justify="right")
    all_same = True
    for i, (p, c) in enumerate(zip(plain, cold_results)):
        w = warm[i]
        same = c.token_ids == w.token_ids
        all_same &= same
        table.add_row(str(i), f"{p.ttft_s * 1e3:.0f}", str(p.cached_tokens), f"{c.ttft_s * 1e3:.0f}",
                      str(c.cached_tokens), f"{w.ttft_s * 1e3:.0f}", f"{w.cached_tokens}/{w.prompt_tokens}",
                      "yes" if same else "NO")
    console.print(table)
    console.print(f"warm answer of sample 0: {warm[0].token_ids} {warm[0].text!r}")
    verdict = "identical" if all_same else "DIFFERENT"
    console.print(f"cached spans vs spans computed in context: [bold]{verdict}[/bold] tokens")
    return all_same


def vars_of(request: RagRequest) -> dict:
    return {"task": request.task, "docs": request.docs, "system": request.system,
            "max_tokens": request.max_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=Path(".tiny-model"))
    parser.add_argument("--log", type=Path, default=Path("demo-server.log"))
    args = parser.parse_args()
    console.print(f"starting minipic serve on {args.model} (about a minute on CPU; log: {args.log})")
    with local_server(args.model, SERVER_ARGS, args.log) as url:
        ok = asyncio.run(run(url))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
