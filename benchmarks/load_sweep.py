"""Latency under load: Poisson arrivals at a sweep of offered rates, stock against ISPS (issue #23).

    python benchmarks/load_sweep.py --model MODEL_DIR --tokenizer TOKENIZER_DIR \
        --passages ../shared/data/2wiki_passages.json --out benchmarks/results/load-h200.json \
        --rates 10 20 30 40 50 --seconds 15

(on the H200: ``bash benchmarks/h200.sh load ARGS``, docs/benchmarks.md "Latency under load").
Each server (``--servers``: served.py's ``stock-fa3``, plain prompts, and ``pic-256``, ISPS
with the SDK's default layout or ``--layout``) is started from scratch. For each offered
rate (samples/s) the prefix cache is reset, a fresh `SpanClient` connects and, with
``--warm-spans``, preloads the spans of the rate's samples (`SpanClient.preload`: the steady
state where documents recur; stock has no span cache, so nothing is preloaded there). Then
the samples of Table 1's 2Wiki-like workload (`served.table1_requests`, the first
``rate * --seconds`` of ``--samples``, or ``--samples-per-rate``) arrive with exponential
gaps (seeded), each sent at its arrival as one `SpanClient.rag_chunks` task (streamed; no
in-flight cap but the server's ``max_num_seqs``).

Per request, from its scheduled arrival: TTFT (the first token of the final answer, the
span prefills included), the gaps between streamed chunks (inter-token latency, measured
here from `rag_chunks`; the SDK needed no hook for it) and the end-to-end latency. Per rate
(``vllm bench serve``'s way): p50/p99/mean of TTFT, ITL (all gaps of all requests pooled),
TPOT ((e2e - TTFT) / (tokens - 1) per request) and E2E; achieved throughput (completed
samples over the time from the first arrival to the last completion); goodput (samples
whose TTFT met ``--slo-ttft``, per second of the same time). Requests still running
``--drain-timeout`` after the last arrival are cancelled and count as missing the SLO with
their waiting time so far as TTFT (a lower bound: ``censored``). Per server: the highest
swept rate whose p99 TTFT meets the SLO; across servers, ``goal``: the issue's two ratios
(at the lowest rate where stock's p99 TTFT passes the SLO, stock's p99 over MiniPIC's, goal
>= 5; MiniPIC's highest sustained rate over stock's, goal >= 1.4).

``--deadline`` (epoch seconds; h200.sh passes DEADLINE) splits the time left between the
servers still to run (each server's start included; the last gets all that is left): a
rate is skipped (and recorded so) when its arrivals would not end within its server's
share, and its drain is cut at the share's end, so one device call always finishes.
``--stop-after-miss N`` ends a stock sweep after N rates past the SLO (beyond them stock
only queues more), leaving the time to MiniPIC.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import (  # noqa: E402
    SERVERS,
    Server,
    add_server_arguments,
    connect,
    layout_name,
    reset_cache,
    running,
    table1_requests,
)

from minipic_client import RagRequest  # noqa: E402
from minipic_client.prompt import TECHNIQUES  # noqa: E402
from minipic_client.scheduler import RequestEvent, Strategy  # noqa: E402

from provenance import provenance  # noqa: E402

TTFT_RATIO_GOAL = 5.0  # stock's p99 TTFT over MiniPIC's, where stock's passes the SLO
RATE_RATIO_GOAL = 1.4  # MiniPIC's highest rate within the SLO over stock's
MIN_DRAIN_S = 5.0  # the shortest wait after a rate's last arrival, even near the deadline


# -- the pure parts (tests/test_load_sweep.py) ------------------------------------------------


def poisson_offsets(rate: float, count: int, seed: int) -> list[float]:
    """Arrival times (s) of `count` requests at `rate` per second: the first at 0, then
    exponential gaps of mean 1/rate, as `vllm bench serve --request-rate` sends them."""
    if rate <= 0 or count < 0:
        raise ValueError(f"rate must be positive and count not negative, got {rate}, {count}")
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for i in range(count):
        if i:
            t += rng.expovariate(rate)
        offsets.append(t)
    return offsets


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, linearly interpolated between ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    if rank == low or math.isinf(ordered[high]):  # an infinite neighbour: no finite interpolation
        return ordered[low] if rank == low else math.inf
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Sample:
    """One request's timeline, in seconds from its scheduled arrival."""

    arrival: float  # offset from the rate's start
    lag: float = 0.0  # how late the client sent it
    ttft: float | None = None
    e2e: float | None = None
    chunk_gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    waited: float | None = None  # cancelled at the drain timeout after waiting this long
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.e2e is not None and self.error is None


def spread(values: Sequence[float], prefix: str) -> dict[str, float | None]:
    mean = sum(values) / len(values) if values else None
    return {f"{prefix}_p50_s": percentile(values, 50), f"{prefix}_p99_s": percentile(values, 99),
            f"{prefix}_mean_s": mean}  # fmt: skip


def summarize(samples: Sequence[Sample], elapsed: float, slo_ttft: float) -> dict:
    """One rate's figures. TTFT percentiles count every sample: a cancelled one with the time
    it waited (a lower bound, flagged ``ttft_censored``), a failed one as infinitely late."""
    done = [s for s in samples if s.done]
    ttfts = [s.ttft if s.ttft is not None else s.waited if s.waited is not None else math.inf for s in samples]
    good = sum(1 for s in done if s.ttft is not None and s.ttft <= slo_ttft)
    tpots = [(s.e2e - s.ttft) / (s.tokens - 1) for s in done if s.tokens > 1 and s.ttft is not None]
    row = {
        "sent": len(samples), "completed": len(done),
        "failed": sum(1 for s in samples if s.error is not None),
        "cancelled": sum(1 for s in samples if s.waited is not None),
        "elapsed_s": elapsed, "throughput_per_s": len(done) / elapsed if elapsed > 0 else 0.0,
        "goodput_per_s": good / elapsed if elapsed > 0 else 0.0,
        "slo_met_fraction": good / len(samples) if samples else 0.0,
        **spread(ttfts, "ttft"),
        "ttft_censored": any(s.waited is not None and s.ttft is None for s in samples),
        **spread([g for s in done for g in s.chunk_gaps], "itl"),
        **spread(tpots, "tpot"),
        **spread([s.e2e for s in done], "e2e"),
        "output_tokens_mean": sum(s.tokens for s in done) / len(done) if done else None,
        "client_lag_max_s": max((s.lag for s in samples), default=0.0),
    }  # fmt: skip
    # JSON has no infinity: a p99 past every finite value is null, and missing the SLO.
    return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in row.items()}


def meets_slo(row: dict, slo_ttft: float) -> bool:
    return row.get("ttft_p99_s") is not None and row["ttft_p99_s"] <= slo_ttft and not row.get("failed")


def highest_sustained(rows: Sequence[dict], slo_ttft: float) -> float | None:
    """The highest swept rate whose p99 TTFT met the SLO (None: none did)."""
    return max((r["rate"] for r in rows if meets_slo(r, slo_ttft)), default=None)


def goal(stock: Sequence[dict], pic: Sequence[dict], slo_ttft: float) -> dict:
    """The issue's two ratios: p99 TTFT at the lowest rate where stock's passes the SLO
    (stock over MiniPIC), and the highest sustained rates (MiniPIC over stock)."""
    out: dict = {"slo_ttft_s": slo_ttft}
    missed = sorted((r for r in stock if not meets_slo(r, slo_ttft)), key=lambda r: r["rate"])
    if missed:
        rate = missed[0]["rate"]
        other = next((r for r in pic if r["rate"] == rate), None)
        out["stock_passes_slo_at_rate"] = rate
        out["stock_ttft_p99_s"] = missed[0]["ttft_p99_s"]
        out["pic_ttft_p99_s"] = other["ttft_p99_s"] if other else None
        if missed[0]["ttft_p99_s"] is not None and other and other["ttft_p99_s"]:
            out["ttft_p99_ratio"] = missed[0]["ttft_p99_s"] / other["ttft_p99_s"]
    stock_rate, pic_rate = highest_sustained(stock, slo_ttft), highest_sustained(pic, slo_ttft)
    out.update(stock_sustained_rate=stock_rate, pic_sustained_rate=pic_rate)
    if stock_rate and pic_rate:
        out["sustained_rate_ratio"] = pic_rate / stock_rate
    ttft_ratio, rate_ratio = out.get("ttft_p99_ratio"), out.get("sustained_rate_ratio")
    out["ttft_goal_met"] = None if ttft_ratio is None else ttft_ratio >= TTFT_RATIO_GOAL
    out["rate_goal_met"] = None if rate_ratio is None else rate_ratio >= RATE_RATIO_GOAL
    # The swept rates bound both: a server that met the SLO at the highest rate may sustain more.
    out["pic_met_slo_at_every_rate"] = bool(pic) and all(meets_slo(r, slo_ttft) for r in pic)
    return out


# -- the measurement ----------------------------------------------------------------------------


def rate_samples(pool: list[RagRequest], count: int) -> list[RagRequest]:
    """The first `count` samples of the pool (cycled past its end)."""
    return [pool[i % len(pool)] for i in range(count)]


async def one(client, request: RagRequest, strategy: Strategy, sample: Sample, start: float) -> None:
    arrival = start + sample.arrival
    sample.lag = time.perf_counter() - arrival
    last = None
    try:
        async with aclosing(client.rag_chunks(request, strategy=strategy)) as chunks:
            async for chunk in chunks:
                if not (chunk.text or chunk.token_ids):
                    continue
                now = time.perf_counter()
                if last is None:
                    sample.ttft = now - arrival
                else:
                    sample.chunk_gaps.append(now - last)
                last = now
                sample.tokens += len(chunk.token_ids) or 1
        sample.e2e = time.perf_counter() - arrival
    except asyncio.CancelledError:
        sample.waited = time.perf_counter() - arrival
        raise
    except Exception as exc:  # noqa: BLE001 (a failed sample is a result, not a crash)
        sample.error = repr(exc)


async def measure_rate(
    url: str, server: Server, rate: float, pool: list[RagRequest], args, share_end: float = math.inf
) -> dict:
    count = args.samples_per_rate or max(1, round(rate * args.seconds))
    requests = rate_samples(pool, count)
    strategy = Strategy(args.strategy) if server.pic else Strategy.BASELINE
    events: list[RequestEvent] = []
    await reset_cache(url)
    async with connect(url, server, args, events, args.layout) as client:
        layout = layout_name(client) if server.pic else "plain"
        warm_s = None
        if args.warm_spans and server.pic:
            began = time.perf_counter()
            await client.preload(requests, strategy=strategy)
            warm_s = time.perf_counter() - began
        events.clear()
        samples = [Sample(t) for t in poisson_offsets(rate, count, args.seed + int(rate * 1000))]
        tasks = []
        start = time.perf_counter() + 0.05
        for request, sample in zip(requests, samples):
            delay = start + sample.arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, request, strategy, sample, start)))
        drain = min(args.drain_timeout, max(share_end - time.time(), MIN_DRAIN_S))
        _, pending = await asyncio.wait(tasks, timeout=drain)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        ends = [start + s.arrival + s.e2e for s in samples if s.done]
        elapsed = (max(ends) if ends else time.perf_counter()) - start
        if pending:
            elapsed = time.perf_counter() - start
    documents = [d for r in requests for d in r.docs]
    row = {
        "server": server.name, "strategy": strategy.value, "layout": layout, "rate": rate,
        "warm_spans": bool(args.warm_spans and server.pic), "warm_s": warm_s,
        "offered_rate_achieved": (count - 1) / samples[-1].arrival if count > 1 and samples[-1].arrival else None,
        "arrival_window_s": samples[-1].arrival, "max_tokens": requests[0].max_tokens,
        "unique_document_fraction": len(set(documents)) / len(documents),
        **summarize(samples, elapsed, args.slo_ttft),
        "requests": len(events),
        "computed_prompt_tokens_per_sample": sum(e.prompt_tokens - (e.cached_tokens or 0) for e in events) / count,
    }  # fmt: skip
    row["meets_slo"] = meets_slo(row, args.slo_ttft)
    errors = [s.error for s in samples if s.error]
    if errors:
        row["first_error"] = errors[0]
    if pending:
        await asyncio.sleep(1.0)  # let the server abort the cancelled streams before the next reset
    return row


def expected_s(rate: float, args) -> float:
    """The least a rate needs: its arrivals, the shortest drain, the reset and connect (its
    drain is cut to what is left of the server's share, the samples still running cancelled)."""
    count = args.samples_per_rate or max(1, round(rate * args.seconds))
    return count / rate + MIN_DRAIN_S + 5.0


async def measure_server(server: Server, args, pool: list[RagRequest], result: dict, share_end: float) -> None:
    rows = result["rates"]
    with running(server, args) as (url, _process, _log):
        for rate in args.rates:
            if time.time() + expected_s(rate, args) > share_end:
                left = share_end - time.time()
                result["skipped"].append({"server": server.name, "rate": rate,
                                          "reason": f"{left:.0f} s left of its share, up to "
                                                    f"{expected_s(rate, args):.0f} s needed"})  # fmt: skip
                print(f"[{server.name}] rate {rate}: skipped ({result['skipped'][-1]['reason']})", flush=True)
                continue
            row = await measure_rate(url, server, rate, pool, args, share_end)
            rows.append(row)
            keys = ("rate", "completed", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "e2e_p99_s", "throughput_per_s",
                    "goodput_per_s", "meets_slo")  # fmt: skip
            print(f"[{server.name}] " + json.dumps({k: row[k] for k in keys}), flush=True)
            args.out.write_text(json.dumps(result, indent=2))
            if args.stop_after_miss and not row["meets_slo"] and not server.pic:
                # Past the SLO stock only queues more; MiniPIC runs every rate (the goal reads it there).
                misses = [r for r in rows if r["server"] == server.name and not r["meets_slo"]]
                if len(misses) >= args.stop_after_miss:
                    print(f"[{server.name}] stopping: {len(misses)} rates past the SLO", flush=True)
                    break


async def main_async(args: argparse.Namespace) -> int:
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    passages = json.loads(args.passages.read_text())
    _, _, by_tokens = table1_requests(passages, args.samples, [args.max_tokens])
    pool = by_tokens[args.max_tokens]
    result: dict = {
        "provenance": provenance(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(sys.argv),
        "device": provenance()["device"],
        "workload": {"samples": args.samples, "max_tokens": args.max_tokens, "seconds": args.seconds,
                     "samples_per_rate": args.samples_per_rate, "seed": args.seed},  # fmt: skip
        "slo_ttft_s": args.slo_ttft, "drain_timeout_s": args.drain_timeout,
        "warm_spans": args.warm_spans, "layout": args.layout or "default",
        "rates": [], "skipped": [], "sustained": {},
    }  # fmt: skip
    for i, name in enumerate(args.servers):
        share_end = time.time() + (args.deadline - time.time()) / (len(args.servers) - i) - 5.0
        await measure_server(SERVERS[name], args, pool, result, share_end)
        rows = [r for r in result["rates"] if r["server"] == name]
        result["sustained"][name] = highest_sustained(rows, args.slo_ttft)
        args.out.write_text(json.dumps(result, indent=2))
    stock = [r for r in result["rates"] if not SERVERS[r["server"]].pic]
    pic = [r for r in result["rates"] if SERVERS[r["server"]].pic]
    if stock and pic:
        result["goal"] = goal(stock, pic, args.slo_ttft)
        print("goal: " + json.dumps(result["goal"]), flush=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--servers", nargs="+", choices=list(SERVERS), default=["stock-fa3", "pic-256"])
    parser.add_argument("--rates", type=float, nargs="+", required=True, help="offered rates, samples/s")
    parser.add_argument("--seconds", type=float, default=15.0, help="arrival window per rate")
    parser.add_argument("--samples-per-rate", type=int, help="instead of rate x --seconds")
    parser.add_argument("--samples", type=int, default=1000, help="the workload pool (Table 1's 1,000)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--slo-ttft", type=float, default=2.0, help="seconds")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds after the last arrival before the rest are cancelled")  # fmt: skip
    parser.add_argument("--warm-spans", action="store_true",
                        help="preload the spans of each rate's samples first (minipic servers)")  # fmt: skip
    parser.add_argument("--stop-after-miss", type=int, default=0,
                        help="stop a stock server's sweep after this many rates past the SLO (0: never)")  # fmt: skip
    parser.add_argument("--layout", choices=list(TECHNIQUES), help="the minipic servers' layout (default: the SDK's)")
    parser.add_argument("--strategy", choices=[Strategy.ISPS.value, Strategy.INLINE.value], default=Strategy.ISPS.value,
                        help="the minipic servers' span scheduling")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=float, default=float(os.environ.get("DEADLINE", "inf")),
                        help="epoch seconds by which the run must end (default: $DEADLINE, else none)")  # fmt: skip
    args = parser.parse_args()
    args.layouts = [args.layout]  # as served.connect reads it
    args.rates = sorted(args.rates)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
