"""``make demo``: questions over a town's passages through a real `minipic serve`, plain and with PIC.

Each question is asked three ways on one server (SmolLM2-135M-Instruct by default):

1. plain prompts, no markers: vLLM's prefix cache alone, which reuses only the system prompt
   because every question puts its passages in another order;
2. the PIC layout with nothing cached (a fresh ``cache_salt`` per request): every span is
   computed inside its prompt;
3. the PIC layout after the passages were ingested once: spans come from the cache at
   whatever offset they now sit.

Runs 2 and 3 must give identical tokens (a cached span answers exactly like one computed in
context); the exit status says whether they did. Plain and PIC answers may differ: with PIC
the passages do not attend to each other, and this model was not trained for that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from minipic_client import RagRequest, RagResult, SpanClient, Strategy
from minipic_server.demo_passages import PASSAGES, QUESTIONS
from minipic_server.launch import local_server

SYSTEM = "Answer the question in a few words, using only the passages."
MAX_TOKENS = 12
# Eager mode starts in a third of the time on CPU and prefills as fast.
SERVER_ARGS = ("--dtype", "float32", "--block-size", "16", "--max-model-len", "4096",
               "--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager")

console = Console(width=None if sys.stdout.isatty() else 160)


def requests() -> list[RagRequest]:
    return [RagRequest(task, [PASSAGES[i] for i in docs], SYSTEM, max_tokens=MAX_TOKENS)
            for docs, task, _ in QUESTIONS]


async def uncached(client: SpanClient, http: httpx.AsyncClient, request: RagRequest) -> RagResult:
    """The PIC prompt under a new cache salt: no block of it can come from the cache."""
    layout = client.rag_layout(request)
    body = {"model": client.info.model, "prompt": layout.token_ids, "max_tokens": request.max_tokens,
            "temperature": 0.0, "return_token_ids": True, "cache_salt": uuid.uuid4().hex, "stream": True,
            "stream_options": {"include_usage": True}}
    started, first, text, token_ids, usage = time.perf_counter(), None, "", [], {}
    async with http.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or ():
                if first is None and choice.get("token_ids"):
                    first = time.perf_counter()
                text += choice.get("text") or ""
                token_ids += choice.get("token_ids") or []
            usage = event.get("usage") or usage
    return RagResult(text=text, token_ids=token_ids, ttft_s=(first or time.perf_counter()) - started,
                     cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                     prompt_tokens=usage.get("prompt_tokens", len(layout.token_ids)), finish_reason=None)


async def run(url: str) -> bool:
    async with SpanClient(url) as client, httpx.AsyncClient(base_url=url, timeout=300) as http:
        plain = [await client.rag(**vars_of(r), strategy=Strategy.BASELINE) for r in requests()]
        cold = [await uncached(client, http, r) for r in requests()]
        started = time.perf_counter()
        # Ingest every passage once: one span prefill each (this call's answer is not used).
        await client.rag(task="List the topics.", docs=PASSAGES, system=SYSTEM, max_tokens=1)
        ingest_s = time.perf_counter() - started
        warm = [await client.rag(**vars_of(r)) for r in requests()]
    table = Table(title=f"{len(QUESTIONS)} questions, each over 6 of {len(PASSAGES)} passages "
                        f"(~1,300 prompt tokens; {Path(client.info.model).name})")
    for column in ("question", "plain answer", "PIC answer", "same", "plain s", "PIC cold s", "PIC warm s",
                   "cached"):
        table.add_column(column, justify="left" if "answer" in column or column == "question" else "right")
    exact = True
    for (_, task, expected), p, c, w in zip(QUESTIONS, plain, cold, warm):
        exact &= c.token_ids == w.token_ids
        table.add_row(f"{task} [dim]({expected})[/dim]", short(p.text), short(w.text),
                      "yes" if p.text == w.text else "no", f"{p.ttft_s:.2f}", f"{c.ttft_s:.2f}",
                      f"{w.ttft_s:.2f}", f"{w.cached_tokens}/{w.prompt_tokens}")
    console.print(table)
    console.print(
        f"question (expected answer); answers: greedy, first {MAX_TOKENS} tokens; same: plain and PIC "
        "answers identical; plain s: time to first token (TTFT) without markers, where the prefix cache "
        "holds only the system prompt; PIC cold s: TTFT of the PIC prompt with nothing cached (all passages "
        "computed, plus padding); PIC warm s: TTFT with the passages cached (the default layout computes the "
        "first passage as text, each passage's first block and the question in context); "
        "cached: prompt tokens served from the cache.",
        style="dim",
    )
    console.print(f"ingesting all {len(PASSAGES)} passages as spans took {ingest_s:.1f} s, once.")
    verdict = "identical" if exact else "DIFFERENT"
    console.print(f"PIC answers with passages cached vs computed in the prompt: [bold]{verdict}[/bold] tokens")
    return exact


def short(text: str) -> str:
    return " ".join(text.split())


def vars_of(request: RagRequest) -> dict:
    return {"task": request.task, "docs": request.docs, "system": request.system,
            "max_tokens": request.max_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="the folder `minipic fetch-model smollm2` prints")
    parser.add_argument("--log", type=Path, default=Path("demo-server.log"))
    args = parser.parse_args()
    console.print(f"starting minipic serve on {args.model} (about 30 s on CPU; log: {args.log})")
    started = time.perf_counter()
    with local_server(args.model, SERVER_ARGS, args.log) as url:
        console.print(f"server ready in {time.perf_counter() - started:.0f} s; asking {len(QUESTIONS)} questions "
                      "three ways (about 2 minutes on 2 cores)")
        ok = asyncio.run(run(url))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
