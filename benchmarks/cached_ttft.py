"""Where the time of one request over k cached documents goes: TTFT, the server's stages, and profiles.

    python benchmarks/cached_ttft.py --model MODEL_DIR --tokenizer TOKENIZER_DIR \\
        --passages ../shared/data/2wiki_passages.json --docs 1 32 [--layout block] [--gpu-profile] \\
        [--servers pic-256 stock-fa3] --out benchmarks/results/cached-ttft-cpu.json [--server-arg=...]

Starts each server of ``--servers`` in turn (`minipic serve` by default) and, for each k of
``--docs``, sends the same prompt over k documents of ~1,000 tokens again and again, one at a
time, all but its last few tokens cached: on `minipic serve` the final prompt after its
documents were preloaded as spans; on stock vLLM the plain prompt, cached by the first of
them (what vLLM's serving path costs a prompt of that length with nothing left to compute):

* ``--timed-requests`` of them unobserved: the TTFT, and from vLLM's request-time histograms
  (``/metrics``) where each request's time went on the server: from the API server's
  arrival to the first token, queued in the engine, from scheduled to the first token; the
  rest of the client's TTFT is HTTP and JSON;
* for ``--profile-seconds`` under py-spy (the API server and the engine core; ``--no-profile``:
  not), the milliseconds of samples per request in which each function was on the stack;
* with ``--gpu-profile``, ``--gpu-profile-steps`` of them under vLLM's torch profiler: its
  operator table (`gpu_profile.read_table`), which ``tables.py ttft`` prints per engine step.
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
import gpu_profile  # noqa: E402
from engine_timeline import stage_means  # noqa: E402
from pyspy_summary import raw_stacks  # noqa: E402
from served import (  # noqa: E402
    PYSPY_RATE,
    SERVERS,
    Server,
    add_server_arguments,
    connect,
    first_token_s,
    passages_as_docs,
    profile_dir,
    profiled,
    require_py_spy,
    running,
)
from workload import SYSTEM  # noqa: E402

from minipic_client import RagRequest, Strategy  # noqa: E402
from minipic_client.client import pooled_transport  # noqa: E402
from minipic_client.prompt import TECHNIQUES  # noqa: E402

from provenance import provenance  # noqa: E402


def inclusive_samples(raw: Path) -> dict[str, Counter[str]]:
    """Per process: in how many samples each function was on the stack (py-spy's raw format)."""
    seen: dict[str, Counter[str]] = {}
    for frames, count in raw_stacks(raw.read_text(errors="replace")):
        # py-spy nests a child's stack under its parents' process frames: the last one is the sampled process.
        process = next((f.split(":", 1)[1].strip('"')[:60] for f in reversed(frames) if f.startswith("process ")), "?")
        for name in {f.split(" (")[0] for f in frames if not f.startswith(("process ", "thread "))}:
            seen.setdefault(process, Counter())[name] += count
    return seen


def ms_per_request(samples: dict[str, Counter[str]], requests: int, top: int) -> dict[str, list[tuple[str, float]]]:
    """Per process, the functions most often on the stack, as milliseconds of samples per request
    (the requests were served one at a time): what each costs a request where it runs, idle
    threads that spin included (py-spy samples every thread that is not asleep)."""
    scale = 1e3 / PYSPY_RATE / max(1, requests)
    return {process: [(name, round(n * scale, 2)) for name, n in counts.most_common(top)]
            for process, counts in samples.items()}  # fmt: skip


async def stages(http: httpx.AsyncClient, model: str, token_ids: list[int], requests: int) -> dict:
    """TTFTs of ``requests`` sent one at a time, and the server's mean stage times per request."""

    async def send() -> list[float]:
        return [(await first_token_s(http, model, token_ids))[0] for _ in range(requests)]

    ttfts, mean = await stage_means(http, send(), requests)
    return {"ttft_median_s": statistics.median(ttfts), "ttft_quartiles_s": statistics.quantiles(ttfts, n=4), **mean}


async def measure_k(
    url: str, server: Server, args: argparse.Namespace, docs: list[str], process, position: int
) -> dict:
    """One row: ``docs`` cached, then timed; ``position`` (the row's place in ``--docs``) names
    its py-spy file, so a repeated k (``--docs 1 32 1``) keeps both profiles."""
    request = RagRequest(task="Which document mentions a river?", docs=docs, system=SYSTEM, max_tokens=1)
    async with connect(url, server, args, [], args.layout) as client, httpx.AsyncClient(
        base_url=url, timeout=600, transport=pooled_transport()
    ) as http:
        model = client.info.model
        layout = client.rag_layout(request, strategy=Strategy.ISPS if server.pic else Strategy.BASELINE)
        await asyncio.gather(*(first_token_s(http, model, list(p.token_ids)) for p in layout.prefills))
        token_ids = list(layout.token_ids)
        warm = [(await first_token_s(http, model, token_ids))[0] for _ in range(3)]
        _, usage = await first_token_s(http, model, token_ids)
        row = {"server": server.name, "docs": len(docs), "prompt_tokens": usage.get("prompt_tokens"),
               "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
               "warm_up_ttft_s": warm, **await stages(http, model, token_ids, args.timed_requests)}  # fmt: skip
        if not args.no_profile:
            raw = args.out.with_name(f"{args.out.stem}-{server.name}-row{position}-{len(docs)}-docs.pyspy.txt")
            profiled_ttfts = []
            with profiled(process, raw, args.profile_seconds, True):
                deadline = time.perf_counter() + args.profile_seconds
                while time.perf_counter() < deadline:
                    profiled_ttfts.append((await first_token_s(http, model, token_ids))[0])
            stacks = ms_per_request(inclusive_samples(raw), len(profiled_ttfts), args.top) if raw.is_file() else None
            row |= {"requests_profiled": len(profiled_ttfts),
                    "profiled_ttft_median_s": statistics.median(profiled_ttfts),
                    "stack_ms_per_request": stacks}  # None: py-spy was stopped (`profiled`)
        if args.gpu_profile:
            await gpu_profile.start(url)
            for _ in range(args.gpu_profile_steps):
                await first_token_s(http, model, token_ids)
            row["gpu_profile"] = await gpu_profile.stop_and_read(url, profile_dir(server, args))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--docs", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--servers", nargs="+", choices=list(SERVERS), default=["pic-256"],
                        help="each in turn: stock ones answer the plain prompt from their prefix cache")  # fmt: skip
    parser.add_argument("--layout", choices=list(TECHNIQUES), default=None, help="default: the SDK's default")
    parser.add_argument("--timed-requests", type=int, default=20)
    parser.add_argument("--profile-seconds", type=int, default=20)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--no-profile", action="store_true", help="no py-spy window")
    parser.add_argument("--gpu-profile", action="store_true", help="a window of engine steps under torch's profiler")
    parser.add_argument("--gpu-profile-steps", type=int, default=10)
    args = parser.parse_args()
    if not args.no_profile:
        require_py_spy(parser)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    passages = json.loads(args.passages.read_text())
    docs = passages_as_docs(passages, AutoTokenizer.from_pretrained(args.tokenizer), 1000, max(args.docs))
    rows, record = [], provenance()
    for server in (SERVERS[name] for name in args.servers):
        flags = []
        if args.gpu_profile:
            profile_dir(server, args).mkdir(parents=True, exist_ok=True)
            flags = gpu_profile.server_flags(profile_dir(server, args), 0, args.gpu_profile_steps)
        with running(server, args, flags) as (url, process, _log):
            for position, k in enumerate(args.docs, start=1):
                rows.append(asyncio.run(measure_k(url, server, args, docs[:k], process, position)))
                print(json.dumps({key: v for key, v in rows[-1].items() if not key.startswith(("stack", "gpu"))}))
                # Written after every row: a run cut short by the device call's limit keeps what it measured.
                result = {"provenance": record, "layout": args.layout, "rows": rows}
                args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
