"""Where the time of one request over k cached documents goes: TTFT and a py-spy profile.

    python benchmarks/cached_ttft.py --model MODEL_DIR --tokenizer TOKENIZER_DIR \\
        --passages ../shared/data/2wiki_passages.json --docs 32 \\
        --out benchmarks/results/cached-ttft-cpu.json [--server-arg=...]

Starts `minipic serve`, preloads k documents of ~1,000 tokens as spans, then sends the
same final prompt (all k documents cached, a few new tokens) again and again, one at a
time, while py-spy samples the API server and the engine core (``--no-profile``: without).
The JSON holds the TTFTs and, per process, the share of samples in which each function was
on the stack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import SERVERS, add_server_arguments, first_token_s, passages_as_docs, profiled, running  # noqa: E402
from workload import SYSTEM  # noqa: E402

from minipic_client import RagRequest, SpanClient, Strategy  # noqa: E402
from minipic_client.client import pooled_transport  # noqa: E402

from provenance import provenance  # noqa: E402


def inclusive_shares(raw: Path, top: int) -> dict[str, list[tuple[str, float]]]:
    """Per process: the functions most often on the stack (py-spy's raw format), share of samples."""
    totals: Counter[str] = Counter()
    seen: dict[str, Counter[str]] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        # py-spy nests a child's stack under its parents' process frames: the last one is the sampled process.
        process = next((f.split(":", 1)[1].strip('"')[:60] for f in reversed(frames) if f.startswith("process ")), "?")
        totals[process] += int(count)
        for name in {f.split(" (")[0] for f in frames if not f.startswith(("process ", "thread "))}:
            seen.setdefault(process, Counter())[name] += int(count)
    return {
        process: [(name, round(n / totals[process], 3)) for name, n in seen[process].most_common(top)]
        for process in totals
    }


async def measure(url: str, args: argparse.Namespace, docs: list[str], process, profile: Path) -> dict:
    request = RagRequest(task="Which document mentions a river?", docs=docs, system=SYSTEM, max_tokens=1)
    async with SpanClient(url) as client, httpx.AsyncClient(
        base_url=url, timeout=600, transport=pooled_transport()
    ) as http:
        model = client.info.model
        layout = client.rag_layout(request, strategy=Strategy.ISPS)
        await asyncio.gather(*(first_token_s(http, model, list(p.token_ids)) for p in layout.prefills))
        warm = [(await first_token_s(http, model, layout.token_ids))[0] for _ in range(3)]
        ttfts, usage = [], {}
        with profiled(process, profile, args.profile_seconds, not args.no_profile):
            deadline = time.perf_counter() + args.profile_seconds
            while time.perf_counter() < deadline:
                ttft, usage = await first_token_s(http, model, layout.token_ids)
                ttfts.append(ttft)
    return {
        "docs": len(docs), "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "warm_up_ttft_s": warm, "requests_profiled": len(ttfts), "ttft_median_s": statistics.median(ttfts),
        "ttft_quartiles_s": statistics.quantiles(ttfts, n=4),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--docs", type=int, default=32)
    parser.add_argument("--profile-seconds", type=int, default=20)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--no-profile", action="store_true", help="time the requests without py-spy attached")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    passages = json.loads(args.passages.read_text())
    docs = passages_as_docs(passages, AutoTokenizer.from_pretrained(args.tokenizer), 1000, args.docs)
    server = SERVERS["pic-256"]
    profile = args.out.with_suffix(".pyspy.txt")
    with running(server, args) as (url, process, _log):
        row = asyncio.run(measure(url, args, docs, process, profile))
    report = {"provenance": provenance(), **row}
    if not args.no_profile:
        report["stack_shares"] = inclusive_shares(profile, args.top)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
