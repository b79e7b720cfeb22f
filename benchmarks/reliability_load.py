"""Load at the concurrency cap: many `rag` calls through one client, failures and memory.

Starts `minipic serve` on the tiny model (or uses --server), then for each
--calls N sends N `rag` samples through `rag_many` with `max_num_seqs` requests
in flight: documents drawn from a pool, so spans are prefilled once and reused.
Reports failures, the cached fraction of prompt tokens, TTFT p50/p99 and the
resident memory of the server (API server, engine and workers) and of this
client before and after each run. Bounded: each run stops after its N calls.

    flock /tmp/minipic-test-server.lock python benchmarks/reliability_load.py --calls 2000 5000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import psutil

from minipic_client import RagRequest, RagResult, SpanClient
from minipic_server.launch import local_server

SERVER_ARGS = ("--dtype", "float32", "--block-size", "16", "--max-model-len", "4096",
               "--kv-cache-memory-bytes", str(256 << 20), "--max-num-seqs", "64")
SYSTEM = "Answer from the documents."


def server_rss_mb(port: int) -> float:
    """Resident memory of the process listening on `port` and all of its children."""
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            root = psutil.Process(conn.pid)
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20
    raise RuntimeError(f"no process listens on port {port}")


def samples(n: int, rng: random.Random) -> list[RagRequest]:
    pool = [f"Report {i}: the ferry to island {i} leaves at {i % 12 + 1} o'clock from pier {i % 7}.\n"
            for i in range(200)]
    return [RagRequest(f"When does ferry {i} leave?", rng.sample(pool, 4), SYSTEM, max_tokens=8) for i in range(n)]


async def run(url: str, calls: int, seed: int) -> dict[str, float]:
    port = httpx.URL(url).port
    client_process = psutil.Process()
    async with SpanClient(url) as client:
        before = {"server_rss_mb": server_rss_mb(port), "client_rss_mb": client_process.memory_info().rss / 2**20}
        results, failures, started = [], [], time.perf_counter()
        async for _, outcome in client.rag_many(samples(calls, random.Random(seed))):
            (results if isinstance(outcome, RagResult) else failures).append(outcome)
        elapsed = time.perf_counter() - started
        after = {"server_rss_mb": server_rss_mb(port), "client_rss_mb": client_process.memory_info().rss / 2**20}
        in_flight = client.info.max_num_seqs
    ttfts = sorted(r.ttft_s for r in results)
    cuts = statistics.quantiles(ttfts, n=100, method="inclusive")
    return {
        "calls": calls, "in_flight": in_flight, "failures": len(failures), "seconds": round(elapsed, 1),
        "calls_per_s": round(calls / elapsed, 1),
        "cached_fraction": round(sum(r.cached_tokens or 0 for r in results) / sum(r.prompt_tokens for r in results), 4),
        "ttft_p50_ms": round(cuts[49] * 1e3, 1), "ttft_p99_ms": round(cuts[98] * 1e3, 1),
        **{f"{k}_before": round(v, 1) for k, v in before.items()},
        **{f"{k}_after": round(v, 1) for k, v in after.items()},
        "first_failure": str(failures[0]) if failures else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path(".tiny-model"))
    parser.add_argument("--server", help="an already running `minipic serve` (default: start one)")
    parser.add_argument("--calls", type=int, nargs="+", default=[2000, 5000])
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    figures = []
    with ExitStack() as stack:
        url = args.server
        if url is None:
            log = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "server.log"
            url = stack.enter_context(local_server(args.model, SERVER_ARGS, log))
        for seed, calls in enumerate(args.calls):
            figures.append(asyncio.run(run(url, calls, seed)))
            print(json.dumps(figures[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))
    if any(f["failures"] for f in figures):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
