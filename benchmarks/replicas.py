"""Two replicas on one machine: span-aware placement against round-robin (issue #24).

    python benchmarks/replicas.py --model MODEL_DIR --tokenizer TOKENIZER_DIR \
        --passages ../shared/data/2wiki_passages.json --out benchmarks/results/replicas-h200.json

(on the H200: ``bash benchmarks/h200.sh replicas``, docs/scale-out.md). Table 1's 2Wiki-like
workload (`served.table1_requests`, max_tokens 1) runs through one `SpanClient`:

1. two `minipic serve` replicas, started together, each publishing its KV events over
   ZMQ; between runs both reset their prefix cache (``VLLM_SERVER_DEV_MODE=1``), so one
   run's cache never helps the next (a reset rather than a fresh cache salt per run: KV
   events do not name a salt, so salted spans are not followed). Runs, ISPS each:
   ``placement`` (`SpanAffinity`, KV events followed), ``round-robin`` (`RoundRobin`: a
   balancer's, each request to the next replica), ``round-robin per job``
   (`RoundRobin(per_job=True)`: a job's prefills and final together) and ``one replica``
   (the first replica alone: the hit rate placement should reach);
2. two stock `vllm serve` replicas (served.py's ``stock-fa3``), plain prompts round-robin;
3. ``--parts eviction``: two `minipic serve` replicas whose KV cache holds about a quarter
   of the workload's distinct span tokens each, plus the blocks of ``--eviction-in-flight``
   final prompts, the client's limit there (``--num-gpu-blocks-override``, eager mode: only
   hit rates are compared), placement following KV events against placement without.
   Skipped when the deadline leaves too little time to start the pair and run both; run
   alone (``--parts eviction``) its size comes from the tokenizer (`estimated_span_tokens`).

Per run: samples/s, the span hit rate of the final prompts (`span_hits`: span tokens the
server reported cached over the span tokens the layouts promise), all prompt tokens
computed per sample (span prefills included), and per replica its finals, prefill
prompts and computed tokens. Duplicated prefills show as ``prefill_prompts`` above the
workload's ``distinct_spans``.

On one GPU the replicas share it, ``--gpu-memory-utilization`` each; the KV cache is a fixed
size (``--kv-cache-bytes``): vLLM's memory profiling reads the device's free memory, so a
replica starting beside another would otherwise get a KV cache of whatever the other
left during its profiling. On CPU (``--bind-cores``) replica i runs on core i.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import SERVERS, Server, add_server_arguments, reset_cache, table1_requests  # noqa: E402

from minipic_client import Endpoint, RagRequest, RagResult, RoundRobin, SpanAffinity, SpanClient  # noqa: E402
from minipic_client.placement import Placement  # noqa: E402
from minipic_client.prompt import PromptLayout  # noqa: E402
from minipic_client.scheduler import RequestEvent, Strategy  # noqa: E402
from minipic_server.launch import free_port, stop, wait_until_ready  # noqa: E402

from provenance import provenance  # noqa: E402

KV_CACHE_SIZE = re.compile(r"KV cache size: ([\d,]+) tokens")
GOAL = 0.95  # placement's span hit rate over one replica's


@dataclass
class Running:
    """One started replica."""

    url: str
    process: subprocess.Popen
    log: Path
    kv_events: str | None

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.url, kv_events=self.kv_events)

    def kv_cache_tokens(self) -> int | None:
        found = KV_CACHE_SIZE.findall(self.log.read_text(errors="replace"))
        return int(found[-1].replace(",", "")) if found else None


def distinct_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@contextmanager
def replica_pair(server: Server, args: argparse.Namespace, label: str, extra: Sequence[str] = (),
                 events: bool = True) -> Iterator[list[Running]]:  # fmt: skip
    """`args.replicas` servers of `server`'s kind, started at once, waited for, stopped together."""
    ports = distinct_ports(2 * args.replicas)
    replicas: list[Running] = []
    started = time.perf_counter()
    try:
        for i in range(args.replicas):
            port, event_port = ports[2 * i], ports[2 * i + 1]
            flags = [*args.server_arg, *extra]
            if args.gpu_memory_utilization:
                flags += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
            if args.kv_cache_bytes:
                flags += ["--kv-cache-memory-bytes", str(args.kv_cache_bytes)]
            if events:
                config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{event_port}"}
                flags += ["--kv-events-config", json.dumps(config)]
            env = server.env()
            if args.bind_cores:
                env["VLLM_CPU_OMP_THREADS_BIND"] = str(i)
            log = args.out.parent / f"{args.out.stem}-{label}-{i}.log"
            with log.open("wb") as sink:
                process = subprocess.Popen(
                    server.argv(args.model, args.tokenizer, port, flags), stdout=sink, stderr=subprocess.STDOUT,
                    env=env, start_new_session=True,
                )  # fmt: skip
            kv_events = f"tcp://127.0.0.1:{event_port}" if events else None
            replicas.append(Running(f"http://127.0.0.1:{port}", process, log, kv_events))
        for replica in replicas:
            wait_until_ready(replica.url, replica.process, replica.log, path="/v1/models",
                             timeout_s=args.start_timeout)  # fmt: skip
        args.last_start_s = time.perf_counter() - started
        print(f"[{label}] {len(replicas)} replicas ready after {args.last_start_s:.0f} s", flush=True)
        yield replicas
    finally:
        with ThreadPoolExecutor(len(replicas) or 1) as pool:
            list(pool.map(stop, [r.process for r in replicas]))


def span_hits(layout: PromptLayout, cached_tokens: int | None) -> tuple[int, int]:
    """(span tokens found cached, span tokens promised) of one final prompt. The server reports
    one cached count for the whole prompt; the shared prefix (the system prompt, its first
    promised tokens) is taken as cached first, so what the server reports past it is span
    hits. Exact whenever the prefix hit, as it does on every final but a replica's first."""
    prefix = sum(len(p.token_ids) for p in layout.prefills if p.kind == "prefix")
    spans = layout.cacheable_tokens - prefix
    return min(max((cached_tokens or 0) - prefix, 0), spans), spans


@dataclass
class Tally:
    """A run's final prompts and requests, summed."""

    span_cached: int = 0
    span_promised: int = 0
    cached: int = 0
    promised: int = 0
    prompt: int = 0
    final_cached: int = 0
    per_replica: dict[str, dict[str, int]] = field(default_factory=dict)

    def final(self, layout: PromptLayout, result: RagResult) -> None:
        hit, spans = span_hits(layout, result.cached_tokens)
        self.span_cached += hit
        self.span_promised += spans
        self.cached += min(result.cached_tokens or 0, layout.cacheable_tokens)
        self.promised += layout.cacheable_tokens
        self.prompt += result.prompt_tokens
        self.final_cached += result.cached_tokens or 0

    def request(self, event: RequestEvent) -> None:
        row = self.per_replica.setdefault(
            event.endpoint, {"finals": 0, "prefill_requests": 0, "prefill_prompts": 0, "computed_tokens": 0}
        )
        if event.kind == "final":
            row["finals"] += 1
        else:
            row["prefill_requests"] += 1
            row["prefill_prompts"] += event.prompts
        row["computed_tokens"] += event.prompt_tokens - (event.cached_tokens or 0)

    def as_dict(self, samples: int) -> dict:
        computed = sum(r["computed_tokens"] for r in self.per_replica.values())
        return {
            "span_hit_rate": self.span_cached / self.span_promised if self.span_promised else None,
            "promised_hit_rate": self.cached / self.promised if self.promised else None,
            "span_tokens_promised": self.span_promised, "span_tokens_cached": self.span_cached,
            "final_prompt_tokens": self.prompt,
            "final_cached_fraction": self.final_cached / self.prompt if self.prompt else None,
            "computed_tokens_per_sample": computed / samples if samples else None,
            "prefill_prompts": sum(r["prefill_prompts"] for r in self.per_replica.values()),
            "per_replica": self.per_replica,
        }  # fmt: skip


async def run_mode(
    name: str, replicas: list[Running], endpoints: list[Endpoint], placement: Placement, strategy: Strategy,
    requests: list[RagRequest], server: Server, args: argparse.Namespace, max_in_flight: int | None = None,
) -> tuple[dict, list[PromptLayout]]:  # fmt: skip
    await asyncio.gather(*(reset_cache(r.url) for r in replicas))
    events: list[RequestEvent] = []
    async with SpanClient(
        endpoints, tokenizer=args.tokenizer, placement=placement, on_request=events.append,
        allow_stock_server=not server.pic, max_in_flight=max_in_flight or (None if server.pic else server.max_num_seqs),
    ) as client:  # fmt: skip
        if any(e.kv_events for e in endpoints):
            await asyncio.sleep(1.0)  # ZMQ subscriptions are up before the first block is stored
        started = time.perf_counter()
        results = {i: r async for i, r in client.rag_many(requests, strategy=strategy)}
        elapsed = time.perf_counter() - started
        layouts = [client.rag_layout(r, strategy=strategy) for r in requests]  # after the clock: tokens cached
    tally = Tally()
    for event in events:
        tally.request(event)
    ok = {i: r for i, r in results.items() if isinstance(r, RagResult)}
    for i, result in ok.items():
        tally.final(layouts[i], result)
    row = {
        "mode": name, "server": server.name, "strategy": strategy.value, "replicas": len(endpoints),
        "kv_events": any(e.kv_events for e in endpoints), "placement": type(placement).__name__,
        "samples": len(ok), "failed": len(results) - len(ok), "elapsed_s": elapsed,
        "samples_per_s": len(ok) / elapsed, **tally.as_dict(len(ok)),
    }  # fmt: skip
    failed = [r for r in results.values() if not isinstance(r, RagResult)]
    if failed:
        row["first_error"] = repr(failed[0])
    print(json.dumps({k: v for k, v in row.items() if k != "per_replica"}), flush=True)
    return row, layouts


def distinct_spans(layouts: list[PromptLayout]) -> dict[bytes, int]:
    return {p.key: len(p.token_ids) for layout in layouts for p in layout.prefills if p.kind == "span"}


def server_flag(server_args: list[str], flag: str) -> int | None:
    """An integer flag's last value among server arguments (``--flag=N`` or ``--flag N``)."""
    value = None
    for i, arg in enumerate(server_args):
        if arg.startswith(flag + "="):
            value = int(arg.split("=", 1)[1])
        elif arg == flag and i + 1 < len(server_args):
            value = int(server_args[i + 1])
    return value


def estimated_span_tokens(tokenizer_dir: str, texts: list[str], block_size: int) -> dict[str, int]:
    """Each text's span tokens as a span prefill lays it out (an SSep token, the text, padding
    to a block), from the tokenizer alone: the eviction pair's size when no run measured them."""
    from minipic_client.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    return {t: math.ceil((len(tokenizer.encode(t)) + 1) / block_size) * block_size for t in texts}


def eviction_blocks(
    span_tokens: int, block_size: int, share: float, in_flight: int, prompt_tokens: int, model_len: int | None
) -> int:
    """KV blocks for a replica holding `share` of the span tokens besides `in_flight` final
    prompts of `prompt_tokens` (their working set), and at least one max-model-len prompt."""
    blocks = math.ceil(span_tokens * share / block_size) + in_flight * math.ceil(prompt_tokens / block_size)
    return max(blocks, math.ceil(model_len / block_size) + 1) if model_len else blocks


def summarise(result: dict) -> dict:
    rows = {r["mode"]: r for r in result["runs"]}
    summary: dict = {}
    placed, alone = rows.get("placement"), rows.get("one replica")
    if placed and alone and alone["span_hit_rate"]:
        ratio = placed["span_hit_rate"] / alone["span_hit_rate"]
        summary["placement_over_one_replica_hit_rate"] = ratio
        summary["goal_met"] = ratio >= GOAL
    for baseline, key in (("round-robin", "round_robin"), ("round-robin per job", "round_robin_per_job"),
                          ("stock round-robin", "stock")):  # fmt: skip
        if placed and baseline in rows:
            summary[f"placement_over_{key}_samples_per_s"] = placed["samples_per_s"] / rows[baseline]["samples_per_s"]
    with_events, without = rows.get("eviction: placement, KV events"), rows.get("eviction: placement, no events")
    if with_events and without:
        summary["eviction_hit_rate_with_events"] = with_events["span_hit_rate"]
        summary["eviction_hit_rate_without_events"] = without["span_hit_rate"]
    return summary


async def main_async(args: argparse.Namespace) -> int:
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    passages = json.loads(args.passages.read_text())
    if args.passage_pool:
        passages = passages[: args.passage_pool]
    picks, _, by_tokens = table1_requests(passages, args.samples, [1])
    requests = by_tokens[1]
    documents = [i for s in picks for i in s]
    pic, stock = SERVERS["pic-256"], SERVERS[args.stock]
    result: dict = {
        "provenance": provenance(), "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(sys.argv),
        "device": provenance()["device"], "samples": len(requests), "replicas": args.replicas,
        "distinct_documents": len(set(documents)), "unique_document_fraction": len(set(documents)) / len(documents),
        "gpu_memory_utilization": args.gpu_memory_utilization, "kv_cache_bytes": args.kv_cache_bytes,
        "goal": f"placement's span hit rate >= {GOAL:.0%} of one replica's", "runs": [], "pairs": [], "skipped": [],
    }  # fmt: skip

    def save() -> None:
        result["summary"] = summarise(result)
        args.out.write_text(json.dumps(result, indent=2))

    def pair_record(label: str, replicas: list[Running], extra: Sequence[str]) -> None:
        result["pairs"].append({"label": label, "server": label.split()[0], "start_s": args.last_start_s,
                                "extra_args": list(extra), "kv_cache_tokens": [r.kv_cache_tokens() for r in replicas]})
        save()  # fmt: skip

    block_size = server_flag(args.server_arg, "--block-size") or 16
    span_tokens = longest_prompt = None
    longest = 0.0
    if "pic" in args.parts:
        with replica_pair(pic, args, "pic") as replicas:
            pair_record("pic", replicas, [])
            endpoints = [r.endpoint for r in replicas]
            modes = [("placement", endpoints, SpanAffinity()),  # round-robin reads no events: none followed
                     ("round-robin", [Endpoint(r.url) for r in replicas], RoundRobin()),
                     ("round-robin per job", [Endpoint(r.url) for r in replicas], RoundRobin(per_job=True)),
                     ("one replica", endpoints[:1], SpanAffinity())]  # fmt: skip
            for name, chosen, placement in modes:
                row, layouts = await run_mode(name, replicas, chosen, placement, Strategy.ISPS, requests, pic, args)
                result["runs"].append(row)
                longest = max(longest, row["elapsed_s"])
                save()
            spans = distinct_spans(layouts)
        span_tokens = sum(spans.values())
        longest_prompt = max(len(layout.token_ids) for layout in layouts)
        result["distinct_spans"] = len(spans)
        result["distinct_span_tokens"] = span_tokens
    if "stock" in args.parts:
        with replica_pair(stock, args, "stock", args.stock_server_arg, events=False) as replicas:
            pair_record("stock", replicas, args.stock_server_arg)
            row, _ = await run_mode("stock round-robin", replicas, [r.endpoint for r in replicas], RoundRobin(),
                                    Strategy.BASELINE, requests, stock, args)  # fmt: skip
            result["runs"].append(row)
            save()
    if "eviction" in args.parts:
        if span_tokens is None or longest_prompt is None:
            sizes = estimated_span_tokens(args.tokenizer, list(dict.fromkeys(d for r in requests for d in r.docs)),
                                          block_size)  # fmt: skip
            span_tokens = sum(sizes.values())
            longest_prompt = max(sum(sizes[d] for d in r.docs) for r in requests) + 256  # system prompt, question
            result["distinct_span_tokens_estimated"] = span_tokens
        blocks = args.eviction_blocks or eviction_blocks(
            span_tokens, block_size, args.eviction_share, args.eviction_in_flight, longest_prompt,
            server_flag(args.server_arg, "--max-model-len"),
        )  # fmt: skip
        # A pair's start (measured, else 3 minutes) and both runs (as long as the longest so far, else 1 minute).
        starts = [p["start_s"] for p in result["pairs"]] or [180.0]
        needed = max(starts) + 2 * 1.5 * (longest or 60.0) + 30
        left = args.deadline - time.time()
        if left < needed:
            reason = f"eviction: {left:.0f} s left before the deadline, about {needed:.0f} s needed"
            print(f"skipped {reason}", flush=True)
            result["skipped"].append(reason)
        else:
            extra = ["--num-gpu-blocks-override", str(blocks), *args.eviction_server_arg]
            with replica_pair(pic, args, "eviction", extra) as replicas:
                pair_record("eviction", replicas, extra)
                result["eviction_blocks_per_replica"] = blocks
                result["eviction_in_flight_per_replica"] = args.eviction_in_flight
                runs = (("eviction: placement, KV events", True), ("eviction: placement, no events", False))
                for name, events in runs:
                    endpoints = [r.endpoint if events else Endpoint(r.url) for r in replicas]
                    row, _ = await run_mode(name, replicas, endpoints, SpanAffinity(), Strategy.ISPS, requests, pic,
                                            args, max_in_flight=args.eviction_in_flight)  # fmt: skip
                    result["runs"].append(row)
                    save()
    save()
    print(json.dumps(result["summary"]), flush=True)
    try:
        from plot import replicas as draw
    except ImportError:  # no matplotlib on the device
        return 0
    draw(result, args.out.with_suffix(".png"))
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parts = ["pic", "stock", "eviction"]
    parser.add_argument("--parts", nargs="+", choices=parts, default=parts)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--passage-pool", type=int, default=0,
                        help="draw samples from the first N passages only (small runs that still reuse passages)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--stock", choices=[name for name, s in SERVERS.items() if not s.pic], default="stock-fa3")
    parser.add_argument("--stock-server-arg", action="append", default=[],
                        help="extra arguments of the stock replicas (CPU: --stock-server-arg=--block-size=32)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.45, help="each replica's; 0: not passed")
    parser.add_argument("--kv-cache-bytes", type=int, default=36 << 30, help="each replica's KV cache; 0: not passed")
    parser.add_argument("--eviction-share", type=float, default=0.25,
                        help="share of the workload's distinct span tokens an eviction replica's KV cache holds")
    parser.add_argument("--eviction-in-flight", type=int, default=32,
                        help="final prompts in flight per eviction replica (their blocks are added to its KV cache)")
    parser.add_argument("--eviction-blocks", type=int, default=0, help="KV blocks per eviction replica (0: computed)")
    parser.add_argument("--eviction-server-arg", action="append", default=None,
                        help="extra arguments of the eviction replicas (default: --enforce-eager)")
    parser.add_argument("--bind-cores", action="store_true", help="CPU: replica i on core i")
    parser.add_argument("--deadline", type=float, default=float(os.environ.get("DEADLINE", "inf")),
                        help="epoch seconds: the eviction part is skipped if it would not finish by then")
    args = parser.parse_args()
    if args.eviction_server_arg is None:
        args.eviction_server_arg = ["--enforce-eager"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
