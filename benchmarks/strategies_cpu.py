"""ISPS vs batched vs baseline through a real `minipic serve` on the CPU (tiny model).

Same server, same samples, one run: baseline (plain prompts, PIC off) first, then the
two PIC policies on a cleared cache each (a server restart between strategies), so each
strategy pays for its own span prefills. Reports samples/s as ratios to the baseline,
the cached fraction of final-prompt tokens and TTFT p50/p99.

    python benchmarks/workload.py --passages ../shared/data/2wiki_passages.json --jsonl samples.jsonl
    python benchmarks/strategies_cpu.py samples.jsonl --model .tiny-model --samples 200 --docs 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from minipic_client import SpanClient, Strategy
from minipic_client.batch import BatchSummary, read_samples, run_batch
from minipic_server.launch import local_server

SERVER_ARGS = ("--dtype", "float32", "--block-size", "16", "--max-model-len", "4096",
               "--kv-cache-memory-bytes", str(1 << 30), "--max-num-seqs", "64")


async def run_strategy(url: str, samples, strategy: Strategy, out_dir: Path) -> BatchSummary:
    async with SpanClient(url) as client:
        return await run_batch(client, samples, out_dir / f"{strategy.value}.jsonl", strategy=strategy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples_jsonl", type=Path)
    parser.add_argument("--model", type=Path, default=Path(".tiny-model"))
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--docs", type=int, default=5, help="documents kept per sample")
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()

    samples = read_samples(args.samples_jsonl, max_tokens=args.max_tokens)[: args.samples]
    samples = [replace(s, request=replace(s.request, docs=s.request.docs[: args.docs])) for s in samples]
    results: dict[str, BatchSummary] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in (Strategy.BASELINE, Strategy.ISPS, Strategy.BATCHED):
            with local_server(args.model, SERVER_ARGS, Path(tmp) / "server.log") as url:
                results[strategy.value] = asyncio.run(run_strategy(url, samples, strategy, Path(tmp)))
    base = results["baseline"].samples_per_s
    table = Table(title=f"{len(samples)} samples x {args.docs} documents, tiny model, CPU")
    for column in ("strategy", "samples/s", "vs baseline", "cached fraction", "TTFT p50 s", "TTFT p99 s"):
        table.add_column(column, justify="right")
    figures = {}
    for name, s in results.items():
        figures[name] = {"samples_per_s": s.samples_per_s, "vs_baseline": s.samples_per_s / base,
                         "cached_fraction": s.cached_fraction, "ttft_p50_s": s.ttft_percentile(50),
                         "ttft_p99_s": s.ttft_percentile(99), "failed": s.failed}
        table.add_row(name, f"{s.samples_per_s:.2f}", f"{s.samples_per_s / base:.2f}x",
                      f"{s.cached_fraction:.1%}", f"{s.ttft_percentile(50):.3f}", f"{s.ttft_percentile(99):.3f}")
    Console().print(table)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
