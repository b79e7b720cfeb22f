"""Stock `vllm serve` against `minipic serve`, one after the other on one machine, same client.

    python benchmarks/served.py --model MODEL_DIR --tokenizer TOKENIZER_DIR \
        --passages ../shared/data/2wiki_passages.json --out benchmarks/results/served-h200.json

MODEL_DIR is anything `vllm serve` loads (the H200 runs use a folder holding only
Llama-3.1-8B's config.json with ``--load-format dummy``); TOKENIZER_DIR is the Llama 3
tokenizer; the passages are the 2WikiMultihopQA passages published with the HippoRAG data
(see ../shared/data/README.md). Every server is started from scratch, measured, and
stopped; every measurement resets the prefix cache first (``VLLM_SERVER_DEV_MODE=1``).

Measurements (each a list in the JSON, drawn by `benchmarks/plot.py`):

- ``table1``: the 2Wiki-like RAG workload (`workload.py`: system prompt, 10 passages, a
  question) through `SpanClient.rag_many` — plain prompts (``baseline``) against stock
  FlashAttention and TRITON_ATTN servers and against `minipic serve`, then ``batched``
  and ``isps`` span scheduling — at each ``--max-tokens``;
- ``figure2``: one request over k cached 1,000-token documents (TTFT), the time to
  preload them, the same prompt with its spans computed in context, and stock's uncached
  TTFT for the same text;
- ``long_spans``: 64 samples of 4 out of 8 documents of ~4,096 tokens plus a question;
- ``span_prefills``: every distinct passage of the workload prefilled once, as the SSep
  span prefills ISPS sends (`minipic serve`) or as plain prompts of the same text (stock),
  in requests of 32 prompts, 256 prompts in flight: prefill tokens/s;
- ``small_requests``: random 128-token prompts from a bare HTTP client (server capacity);
- ``jit``: lines of vLLM's JIT monitor logged after the server was ready (must be none).

A server's log goes next to the JSON; ``--profile`` attaches py-spy to each `minipic
serve` (API server and engine core) during its ISPS run; ``--gpu-profile`` adds to each
Table 1 row and max_tokens one more run, not counted, under vLLM's torch profiler
(`gpu_profile.py`): ``gpu_profiles`` in the JSON, each kernel's GPU time over a window of
engine steps, for stock and MiniPIC alike; ``--timeline`` samples each server's ``/metrics``
through every Table 1 run (`engine_timeline.py`): ``timeline`` in each row, the requests the
engine ran and held waiting and the tokens it finished, which say whether it had work
between its steps.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_timeline  # noqa: E402
import gpu_profile  # noqa: E402
from engine_timeline import stage_means  # noqa: E402
from workload import SYSTEM, draw_samples, question_for  # noqa: E402

from minipic_client import SpanClient  # noqa: E402
from minipic_client.client import RagRequest, pooled_transport  # noqa: E402
from minipic_client.prompt import TECHNIQUES  # noqa: E402
from minipic_client.scheduler import MAX_PROMPTS_PER_REQUEST, RequestEvent, Strategy  # noqa: E402
from minipic_server.launch import free_port, serve_argv, server_env, stop, wait_until_ready  # noqa: E402

from provenance import provenance  # noqa: E402

# A perfect PIC run on the H200 computes only unique tokens: about 66 samples/s of this
# workload (../shared/device/README.md: 55k tokens/s ceiling, ~830 computed tokens/sample).
UNIQUE_TOKEN_CEILING = 66.0
JIT_PATTERN = re.compile(r"JIT compilation during inference")


@dataclass(frozen=True)
class Server:
    """One server configuration: stock vLLM with an attention backend, or `minipic serve`."""

    name: str
    pic: bool
    max_num_seqs: int
    attention_backend: str | None = None
    flags: tuple[str, ...] = ()  # the server's own flags, after the run's ``--server-arg``s

    def argv(self, model: str, tokenizer: str, port: int, extra: list[str]) -> list[str]:
        backend = ["--attention-backend", self.attention_backend] if self.attention_backend else []
        flags = [
            "--tokenizer", tokenizer, "--max-num-seqs", str(self.max_num_seqs), "--enable-prefix-caching",
            "--enable-prompt-tokens-details", *extra, *backend, *self.flags,
        ]  # fmt: skip
        return serve_argv(model, port, flags, stock=not self.pic)

    def env(self) -> dict[str, str]:
        return dict(server_env(stock=not self.pic), VLLM_SERVER_DEV_MODE="1")


# The pic-N servers read pads and markers plainly (`--no-compact`), as every figure before the compact
# reading became `minipic serve`'s default; pic-256-compact serves that default (docs/accuracy.md),
# pic-256-span-bias that default with the span bias docs/accuracy.md measures.
PLAIN_READING = ("--no-compact",)
SPAN_BIAS = ("--compact", "--span-bias", "-0.5")
SERVERS = {
    "stock": Server("stock", False, 256),  # vLLM's default backend (FA3 on Hopper; the CPU one here)
    "stock-fa3": Server("stock-fa3", False, 256, "FLASH_ATTN"),
    "stock-triton": Server("stock-triton", False, 256, "TRITON_ATTN"),
    "pic-256": Server("pic-256", True, 256, flags=PLAIN_READING),
    "pic-256-compact": Server("pic-256-compact", True, 256, flags=("--compact",)),
    "pic-256-span-bias": Server("pic-256-span-bias", True, 256, flags=SPAN_BIAS),
    "pic-64": Server("pic-64", True, 64, flags=PLAIN_READING),
    "pic-1024": Server("pic-1024", True, 1024, flags=PLAIN_READING),
}
# Table 1: (server, row name, strategy). Figure 2 and long spans run on the first two.
ROWS = {
    "stock": [("stock, default backend", Strategy.BASELINE)],
    "stock-fa3": [("stock FA3", Strategy.BASELINE)],
    "stock-triton": [("stock TRITON_ATTN", Strategy.BASELINE)],
    "pic-256": [  # the headline row first: a run cut short by its deadline still has it
        ("minipic ISPS, max-num-seqs 256", Strategy.ISPS),
        ("minipic ISPS inline spans, max-num-seqs 256", Strategy.INLINE),
        ("minipic plain prompts", Strategy.BASELINE),
        ("minipic batched", Strategy.BATCHED),
    ],
    "pic-256-compact": [("minipic ISPS --compact, max-num-seqs 256", Strategy.ISPS)],
    "pic-256-span-bias": [("minipic ISPS --compact --span-bias -0.5, max-num-seqs 256", Strategy.ISPS)],
    "pic-64": [("minipic ISPS, max-num-seqs 64", Strategy.ISPS)],
    "pic-1024": [("minipic ISPS, max-num-seqs 1024", Strategy.ISPS)],
}


@contextmanager
def running(
    server: Server, args: argparse.Namespace, extra_flags: Sequence[str] = ()
) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    port = free_port()
    log = args.out.parent / f"{args.out.stem}-{server.name}.log"
    extra = [*args.server_arg, *extra_flags]
    started = time.perf_counter()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            server.argv(args.model, args.tokenizer, port, extra), stdout=sink,
            stderr=subprocess.STDOUT, env=server.env(), start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, log, path="/v1/models", timeout_s=args.start_timeout)
        print(f"[{server.name}] ready after {time.perf_counter() - started:.0f} s", flush=True)
        yield url, process, log
    finally:
        stop(process)


def profile_dir(server: Server, args: argparse.Namespace) -> Path:
    return args.out.parent / f"{args.out.stem}-{server.name}-torch-profile"


async def reset_cache(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        (await http.post("/reset_prefix_cache")).raise_for_status()


def connect(
    url: str, server: Server, args: argparse.Namespace, events: list[RequestEvent], layout: str | None
) -> SpanClient:
    """The SDK's client for `server`, laying documents out as `layout` (a `TECHNIQUES` name;
    None: the SDK's default)."""
    return SpanClient(
        url, tokenizer=args.tokenizer, max_in_flight=in_flight(server, args),
        on_request=events.append, allow_stock_server=not server.pic,
        technique=TECHNIQUES[layout] if layout else None,
    )  # fmt: skip


def in_flight(server: Server, args: argparse.Namespace) -> int:
    """Prompts the client keeps in flight: ``--in-flight-factor`` times the server's ``max_num_seqs``
    (1: the SDK's default, the running batch kept full without a queue on the server), for stock
    and MiniPIC alike."""
    return max(1, round(args.in_flight_factor * server.max_num_seqs))


def layout_name(client: SpanClient) -> str:
    """The client's default layout by its `TECHNIQUES` name (its class name if it has none)."""
    technique = client.default_technique
    return next((name for name, t in TECHNIQUES.items() if t == technique), type(technique).__name__)


async def table1_row(
    url: str, server: Server, name: str, strategy: Strategy, requests: list[RagRequest], args, repeat: int,
    layout: str | None = None,
) -> dict:
    events: list[RequestEvent] = []
    await reset_cache(url)
    async with connect(url, server, args, events, layout or args.layouts[0]) as client:
        layout = layout_name(client) if server.pic else "plain"
        sampler = engine_timeline.Sampler(url, args.timeline_interval) if args.timeline else None
        if sampler:
            await sampler.start()
        started = time.perf_counter()
        results = [r async for _, r in client.rag_many(requests, strategy=strategy)]
        elapsed = time.perf_counter() - started
        timeline = await sampler.stop() if sampler else None
    failed = [r for r in results if isinstance(r, Exception)]
    ok = [r for r in results if not isinstance(r, Exception)]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    computed = sum(e.prompt_tokens - (e.cached_tokens or 0) for e in events)
    row = {
        "row": name, "server": server.name, "strategy": strategy.value, "layout": layout, "repeat": repeat,
        "max_num_seqs": server.max_num_seqs, "max_in_flight": in_flight(server, args),
        "max_tokens": requests[0].max_tokens,
        "samples": len(ok), "failed": len(failed), "elapsed_s": elapsed,
        "samples_per_s": len(ok) / elapsed, "final_prompt_tokens_per_s": prompt / elapsed,
        "computed_prompt_tokens_per_s": computed / elapsed, "requests": len(events),
        "final_cached_fraction": cached / prompt if prompt else 0.0,
        "fraction_of_unique_token_ceiling": len(ok) / elapsed / UNIQUE_TOKEN_CEILING,
        "ttft_p50_s": statistics.median(r.ttft_s for r in ok) if ok else None,
    }  # fmt: skip
    if failed:
        row["first_error"] = repr(failed[0])
    print(json.dumps(row), flush=True)
    if timeline is not None:
        row["timeline"] = timeline
        row["client_prompt_seconds"] = sum(e.duration_s * e.prompts for e in events)  # each prompt's slot, held
    return row


async def first_token_s(http: httpx.AsyncClient, model: str, token_ids: list[int]) -> tuple[float, dict]:
    """Seconds to the first streamed token of a completion, and its usage."""
    body = {"model": model, "prompt": token_ids, "max_tokens": 1, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    started = time.perf_counter()
    first, usage = None, {}
    async with http.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if first is None and event.get("choices"):
                first = time.perf_counter() - started
            usage = event.get("usage") or usage
    return first or time.perf_counter() - started, usage


async def sdk_ttft_s(url: str, server: Server, args, client: SpanClient, request: RagRequest) -> float:
    """TTFT of the same question through `SpanClient.rag`, the path a user takes, in the state the
    bare request met: for MiniPIC, a cache reset, then a new client that preloads the documents
    (so it knows they are cached and sends the final alone, its in-context heads computed); for
    stock, the plain prompt again from vLLM's prefix cache."""
    if not server.pic:
        return (await client.rag(task=request.task, docs=request.docs, system=request.system,
                                 max_tokens=request.max_tokens, strategy=Strategy.BASELINE)).ttft_s  # fmt: skip
    await reset_cache(url)
    async with connect(url, server, args, [], args.layouts[0]) as fresh:
        await fresh.preload([request])
        return (await fresh.rag(task=request.task, docs=request.docs, system=request.system,
                                max_tokens=request.max_tokens)).ttft_s  # fmt: skip


async def figure2(url: str, server: Server, docs_1k: list[str], args) -> list[dict]:
    """TTFT of one request against k documents of ~1,000 tokens: cached, computed, stock (uncached,
    and the same plain prompt again from vLLM's prefix cache: the floor of the serving path), each
    cached one also through the SDK (`sdk_ttft_s`)."""
    rows = []
    events: list[RequestEvent] = []
    http = httpx.AsyncClient(base_url=url, timeout=600, transport=pooled_transport())
    async with connect(url, server, args, events, args.layouts[0]) as client, http:
        model = client.info.model
        for k in args.figure2_docs:
            for rep in range(args.figure2_reps + 1):  # the first repetition warms up
                docs = random.Random(k * 100 + rep).sample(docs_1k, k)
                request = RagRequest(task="Which document mentions a river?", docs=docs, system=SYSTEM, max_tokens=1)
                await reset_cache(url)
                if server.pic:
                    layout = client.rag_layout(request, strategy=Strategy.ISPS)
                    computed_s, _ = await first_token_s(http, model, layout.token_ids)
                    await reset_cache(url)
                    started = time.perf_counter()
                    await asyncio.gather(*(first_token_s(http, model, list(p.token_ids)) for p in layout.prefills))
                    preload_s = time.perf_counter() - started
                    final = layout.token_ids
                    (cached_s, usage), cached_stages = await stage_means(http, first_token_s(http, model, final))
                    # The same request once more: what the first after a preload pays that a repeat does not,
                    # and where (vLLM's request-time histograms of each).
                    (again_s, _), again_stages = await stage_means(http, first_token_s(http, model, final))
                    row = {"k": k, "rep": rep, "pic_cached_ttft_s": cached_s, "pic_cached_again_ttft_s": again_s,
                           "pic_cached_stages": cached_stages, "pic_cached_again_stages": again_stages,
                           "preload_s": preload_s,
                           "pic_spans_computed_ttft_s": computed_s,
                           "pic_cached_ttft_sdk_s": await sdk_ttft_s(url, server, args, client, request),
                           "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                           "prompt_tokens": usage.get("prompt_tokens")}  # fmt: skip
                else:
                    layout = client.rag_layout(request, strategy=Strategy.BASELINE)
                    ttft, usage = await first_token_s(http, model, layout.token_ids)
                    # The same prompt again, all but its last block in vLLM's prefix cache: what the
                    # serving path costs a prompt of this length when nothing is left to compute.
                    cached_s, again = await first_token_s(http, model, layout.token_ids)
                    row = {"k": k, "rep": rep, "stock_uncached_ttft_s": ttft, "stock_cached_ttft_s": cached_s,
                           "stock_cached_ttft_sdk_s": await sdk_ttft_s(url, server, args, client, request),
                           "cached_tokens": (again.get("prompt_tokens_details") or {}).get("cached_tokens"),
                           "prompt_tokens": usage.get("prompt_tokens")}  # fmt: skip
                if rep:
                    rows.append({"server": server.name, **row})
            print(json.dumps(rows[-1]), flush=True)
    return rows


async def long_spans(url: str, server: Server, docs_4k: list[str], args) -> dict:
    rng = random.Random(7)
    requests = [
        RagRequest(task="Summarise what these documents say about " + rng.choice(["rivers", "films", "towns"])
                   + " in one short phrase, citing the document." + " Answer briefly." * 8,
                   docs=rng.sample(docs_4k, 4), system=SYSTEM, max_tokens=1)
        for _ in range(64)
    ]  # fmt: skip
    strategy = Strategy.ISPS if server.pic else Strategy.BASELINE
    row = await table1_row(url, server, f"long spans {server.name}", strategy, requests, args)
    return row


async def small_requests(url: str, vocab: int, n: int = 600, in_flight: int = 256) -> dict:
    """Random 128-token prompts, max_tokens 1, from a bare client (httpx over the SDK's
    transport): requests/s the server completes. Ids come from the middle of the vocabulary
    (special tokens sit at its ends)."""
    rng = random.Random(3)
    prompts = [[rng.randrange(vocab // 4, vocab - 512) for _ in range(128)] for _ in range(n)]
    elapsed, _ = await prefill_all(url, None, prompts, in_flight)
    row = {"requests": n, "in_flight": in_flight, "elapsed_s": elapsed, "requests_per_s": n / elapsed}
    print(json.dumps(row), flush=True)
    return row


async def prefill_all(url: str, model: str | None, prompts: list, in_flight: int) -> tuple[float, int]:
    """Send each prompt (token ids, or a list of them: one multi-prompt request) with
    max_tokens 1 from a bare client over the SDK's transport, `in_flight` requests at a
    time, after a prefix-cache reset: seconds taken and prompt tokens computed (not cached)."""
    computed = 0
    async with httpx.AsyncClient(base_url=url, timeout=600, transport=pooled_transport()) as http:
        model = model or (await http.get("/v1/models")).json()["data"][0]["id"]
        gate = asyncio.Semaphore(in_flight)

        async def one(prompt: list) -> None:
            nonlocal computed
            async with gate:
                response = await http.post("/v1/completions", json={
                    "model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0})  # fmt: skip
                response.raise_for_status()
            usage = response.json()["usage"]
            computed += usage["prompt_tokens"] - ((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)

        await reset_cache(url)
        started = time.perf_counter()
        await asyncio.gather(*map(one, prompts))
        return time.perf_counter() - started, computed


async def span_prefills(url: str, server: Server, texts: list[str], args) -> dict:
    """Prefill rate of the workload's distinct passages: span prefills (SSep, passage, padding
    to a block) on `minipic serve`, the passage's own tokens on stock; both sent as the
    SDK's scheduler sends span prefills (`MAX_PROMPTS_PER_REQUEST` prompts a request,
    max_tokens 1), ``server.max_num_seqs`` prompts in flight."""
    async with connect(url, server, args, [], args.layouts[0]) as client:
        if server.pic:
            layouts = (client.rag_layout(RagRequest(task="?", docs=[t], raw=True)) for t in texts)
            prompts = [list(p.token_ids) for layout in layouts for p in layout.prefills if p.kind == "span"]
        else:
            prompts = [client.tokenizer.encode(t) for t in texts]
        model = client.info.model
        passage_tokens = sum(len(client.tokenizer.encode(t)) for t in texts)
    groups = [prompts[i : i + MAX_PROMPTS_PER_REQUEST] for i in range(0, len(prompts), MAX_PROMPTS_PER_REQUEST)]
    elapsed, computed = await prefill_all(url, model, groups, max(1, server.max_num_seqs // MAX_PROMPTS_PER_REQUEST))
    row = {"server": server.name, "passages": len(texts), "prompts": len(prompts), "elapsed_s": elapsed,
           "passage_tokens": passage_tokens, "sent_tokens": sum(map(len, prompts)), "computed_tokens": computed,
           "computed_tokens_per_s": computed / elapsed, "passage_tokens_per_s": passage_tokens / elapsed}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def jit_lines_after_ready(log: Path, ready_at: int) -> list[str]:
    text = log.read_text(errors="replace").splitlines()
    return [line for line in text[ready_at:] if JIT_PATTERN.search(line)]


PYSPY_RATE = 100  # py-spy's samples per second (`profiled`)
PYSPY_GRACE_S = 30  # how long past its duration py-spy may take to write its profile


def require_py_spy(parser: argparse.ArgumentParser) -> None:
    """Refuse a profiling run before any server starts where py-spy is missing (on the device it
    comes from `.whl-profile`, carried only for profiling runs)."""
    if shutil.which("py-spy") is None:
        parser.error("py-spy is not installed: carry .whl-profile (bash tools/device-carry.sh) or profile nothing")


@contextmanager
def profiled(process: subprocess.Popen, path: Path, seconds: int, enabled: bool) -> Iterator[None]:
    """py-spy over the server and its engine process while the block runs."""
    spy = None
    if enabled:
        spy = subprocess.Popen(
            # --nonblocking: sampling without pausing the process, which slowed MiniPIC's server 3-4x.
            ["py-spy", "record", "--nonblocking", "--pid", str(process.pid), "--subprocesses", "--rate",
             str(PYSPY_RATE), "--duration", str(seconds), "--format", "raw", "--output", str(path)],
            stdout=path.with_suffix(".log").open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        time.sleep(1.0)
    try:
        yield
    finally:
        if spy is not None:
            try:
                spy.wait(timeout=seconds + PYSPY_GRACE_S)
            except subprocess.TimeoutExpired:
                # Seen on the H100 (2026-12-06): py-spy falling hundreds of seconds behind in a window
                # and never ending it, which held the whole run until the device call's limit.
                spy.kill()
                spy.wait()
                print(f"py-spy did not finish {seconds} s of sampling in {seconds + PYSPY_GRACE_S} s: stopped, "
                      f"its profile ({path.name}) is lost", file=sys.stderr)  # fmt: skip


def passages_as_docs(passages: list[dict], tokenizer, target_tokens: int, count: int) -> list[str]:
    """`count` texts of about `target_tokens` tokens, each passages concatenated."""
    docs, current, tokens, i = [], [], 0, 0
    while len(docs) < count:
        text = f"{passages[i % len(passages)]['title']}\n{passages[i % len(passages)]['text']}\n\n"
        i += 1
        current.append(text)
        tokens += len(tokenizer.encode(text, add_special_tokens=False))
        if tokens >= target_tokens:
            docs.append("".join(current))
            current, tokens = [], 0
    return docs


def table1_requests(
    passages: list[dict], samples: int, max_tokens: list[int]
) -> tuple[list[list[int]], list[str], dict[int, list[RagRequest]]]:
    """Table 1's workload (`workload.py`): each sample's passage indices, every passage's
    text, and the samples as `RagRequest`s at each max_tokens."""
    picks = draw_samples(len(passages), samples, 10, seed=0)
    rng = random.Random(1)
    texts = [f"{p['title']}\n{p['text']}\n\n" for p in passages]
    questions = [question_for([passages[i]["title"] for i in s], rng) for s in picks]
    requests_by_tokens = {
        mt: [RagRequest(task=q, docs=[texts[i] for i in s], system=SYSTEM, max_tokens=mt)
             for s, q in zip(picks, questions)]
        for mt in max_tokens
    }  # fmt: skip
    return picks, texts, requests_by_tokens


async def measure_server(
    server: Server, args, requests_by_tokens, distinct_passages, docs_1k, docs_4k, result: dict
) -> None:
    def save() -> None:
        args.out.write_text(json.dumps(result, indent=2))

    profiler_flags = []
    if args.gpu_profile:
        profile_dir(server, args).mkdir(parents=True, exist_ok=True)
        profiler_flags = gpu_profile.server_flags(profile_dir(server, args), args.gpu_profile_delay,
                                                  args.gpu_profile_steps)  # fmt: skip
    with running(server, args, profiler_flags) as (url, process, log):
        ready_at = len(log.read_text(errors="replace").splitlines())
        if "small" in args.parts:
            path = args.out.parent / f"{args.out.stem}-{server.name}-small-pyspy.txt"
            with profiled(process, path, args.profile_seconds, args.profile):
                row = await small_requests(url, args.vocab, n=args.small_requests)
            result["small_requests"].append({"server": server.name, **row})
        if "spans" in args.parts:
            result["span_prefills"].append(await span_prefills(url, server, distinct_passages, args))
            save()
        if "table1" in args.parts:
            # Several layouts on one minipic server: a row each, named with its layout.
            layouts = args.layouts if server.pic else [None]
            for (name, strategy), layout in itertools.product(ROWS[server.name], layouts):
                if server.pic and strategy.value not in args.strategies:
                    continue
                row_name = f"{name}, {layout}" if len(layouts) > 1 else name
                for max_tokens, requests in requests_by_tokens.items():
                    for repeat in range(args.repeats):
                        profile = args.profile and server.pic and strategy is Strategy.ISPS and max_tokens == 1
                        path = args.out.parent / f"{args.out.stem}-{server.name}-{layout or 'default'}-pyspy.txt"
                        with profiled(process, path, args.profile_seconds, profile and repeat == 0):
                            row = await table1_row(url, server, row_name, strategy, requests, args, repeat, layout)
                        result["table1"].append(row)
                        save()
                    if args.gpu_profile:
                        await gpu_profile.start(url)
                        await table1_row(url, server, row_name, strategy, requests, args, args.repeats, layout)
                        table = await gpu_profile.stop_and_read(url, profile_dir(server, args))
                        result["gpu_profiles"].append({"server": server.name, "row": row_name,
                                                       "max_tokens": max_tokens, **table})  # fmt: skip
                        save()
        if server.name in ("stock", "stock-fa3", "pic-256"):
            if "figure2" in args.parts:
                result["figure2"] += await figure2(url, server, docs_1k, args)
                save()
            if "long" in args.parts:
                result["long_spans"].append(await long_spans(url, server, docs_4k, args))
                save()
        jit = jit_lines_after_ready(log, ready_at)
        result["jit"].append({"server": server.name, "compilations_after_ready": len(jit), "lines": jit[:10]})


async def main_async(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    # SIGTERM (a timeout) cancels the run, so every server is stopped on the way out.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    args.vocab = len(tokenizer)
    passages = json.loads(args.passages.read_text())
    picks, texts, requests_by_tokens = table1_requests(passages, args.samples, args.max_tokens)
    docs_1k = passages_as_docs(passages, tokenizer, 1000, 5 * max(args.figure2_docs))
    docs_4k = passages_as_docs(passages[3000:], tokenizer, args.long_doc_tokens, 8)
    documents = [i for s in picks for i in s]
    distinct_passages = [texts[i] for i in dict.fromkeys(documents)]
    if len(set(documents)) == len(documents):
        # workload.py uses every passage at least once: up to ~600 samples of 10, each exactly once.
        print(f"note: no passage repeats in {args.samples} samples: span reuse cannot pay off "
              "(the paper's workload is 1,000 samples, 61% of passage uses distinct)", flush=True)  # fmt: skip
    result: dict = {
        "provenance": provenance(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(sys.argv),
        "samples": args.samples,
        "unique_document_fraction": len(set(documents)) / len(documents),
        "unique_token_ceiling_samples_per_s": UNIQUE_TOKEN_CEILING,
        "table1": [], "span_prefills": [], "figure2": [], "long_spans": [], "small_requests": [], "jit": [],
        "gpu_profiles": [],
    }  # fmt: skip
    try:
        import torch

        result["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        pass
    for name in args.servers:
        await measure_server(SERVERS[name], args, requests_by_tokens, distinct_passages, docs_1k, docs_4k, result)
        args.out.write_text(json.dumps(result, indent=2))
    # Stock TRITON_ATTN compiles during inference on its own; only MiniPIC's servers must not.
    compiled = sum(j["compilations_after_ready"] for j in result["jit"] if SERVERS[j["server"]].pic)
    if compiled:
        print(f"FAIL: {compiled} kernel compilations after a minipic server was ready", flush=True)
        return 1
    return 0


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments `running`, `connect` and the workload read: model, tokenizer, passages, output,
    server flags, the client's prompts in flight."""
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--passages", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra argument for every server, e.g. --server-arg=--load-format=dummy")  # fmt: skip
    parser.add_argument("--in-flight-factor", type=float, default=1.0,
                        help="prompts the client keeps in flight, times the server's max-num-seqs (stock and "
                             "MiniPIC alike; above 1, requests queue on the server)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--servers", nargs="+", choices=list(SERVERS),
                        default=["stock-fa3", "stock-triton", "pic-256", "pic-64", "pic-1024"])  # fmt: skip
    parser.add_argument("--parts", nargs="+", default=["spans", "table1", "figure2", "long", "small"],
                        choices=["spans", "table1", "figure2", "long", "small"])  # fmt: skip
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--strategies", nargs="+", choices=[s.value for s in Strategy],
                        default=[s.value for s in Strategy if s is not Strategy.INLINE],
                        help="minipic rows to run (stock rows always send plain prompts; inline only when named)")
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=1,
                        help="table1: runs of each row, back to back on the same server, cache reset before each")
    parser.add_argument("--layout", nargs="+", choices=list(TECHNIQUES), default=[None], dest="layouts",
                        help="the minipic rows' layouts, Table 1 rows for each (default: the SDK's default); "
                             "the other parts use the first")
    parser.add_argument("--figure2-reps", type=int, default=3)
    parser.add_argument("--figure2-docs", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--long-doc-tokens", type=int, default=4096)
    parser.add_argument("--profile", action="store_true", help="py-spy the ISPS run of each minipic server")
    parser.add_argument("--profile-seconds", type=int, default=20)
    parser.add_argument("--gpu-profile", action="store_true",
                        help="one more run per Table 1 row and max_tokens under vLLM's torch profiler")
    parser.add_argument("--gpu-profile-delay", type=int, default=20, help="engine steps skipped first")
    parser.add_argument("--gpu-profile-steps", type=int, default=100, help="engine steps profiled")
    parser.add_argument("--timeline", action="store_true",
                        help="sample each server's /metrics during every Table 1 run (engine_timeline.py): requests "
                             "running and waiting, prompt and generated tokens finished; `timeline` in each row")
    parser.add_argument("--timeline-interval", type=float, default=0.25, help="seconds between samples")
    parser.add_argument("--small-requests", type=int, default=600)
    args = parser.parse_args()
    if args.profile:
        require_py_spy(parser)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
