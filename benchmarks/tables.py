"""Print the Markdown tables of docs/benchmarks.md from the JSON results.

    python benchmarks/tables.py served benchmarks/results/served-h200.json
    python benchmarks/tables.py attention benchmarks/results/attention-h200.json
    python benchmarks/tables.py concurrency benchmarks/results/client-concurrency-cpu.json
    python benchmarks/tables.py load benchmarks/results/load-h200-7139fcd.json
    python benchmarks/tables.py overhead benchmarks/results/request-overhead-cpu-619ca64.json
    python benchmarks/tables.py ttft benchmarks/results/cached-ttft-cpu-10ddac4.json
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator
from pathlib import Path

from engine_timeline import summarise
from gpu_profile import engine_steps, is_step, steps_of
from results_io import read_result


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def served(data: dict) -> Iterator[str]:
    rows = data["table1"]
    if rows:
        yield from _table1(rows)
    if data.get("span_prefills"):
        yield from _span_prefills(data["span_prefills"])
    if data.get("gpu_profiles"):
        yield from _gpu_profiles(data["gpu_profiles"], rows)
    if any("timeline" in r for r in rows):
        yield from _timelines(rows)
    yield from _figure2_and_others(data)


def table1_runs(rows: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """Table 1's rows grouped by (configuration, max_tokens): the runs of each."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["row"], r["max_tokens"]), []).append(r)
    return groups


def median_run(runs: list[dict]) -> dict:
    """The run whose samples/s is the median of the runs' (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r["samples_per_s"])[(len(runs) - 1) // 2]


def _table1(rows: list[dict]) -> Iterator[str]:
    """One line per (configuration, max_tokens): the median of its runs, their range beside it."""
    yield (_row("configuration", "layout", "max_tokens", "runs", "samples/s (median, range)", "vs stock FA3",
               "final prompt tokens/s", "computed prompt tokens/s", "requests", "cached (finals)",
               "of ceiling"))  # fmt: skip
    yield (_row(*["---"] * 11))
    groups = table1_runs(rows)
    median = {key: median_run(runs)["samples_per_s"] for key, runs in groups.items()}
    stock = {key[1]: median[key] for key in median if groups[key][0]["server"] == "stock-fa3"}
    for (name, max_tokens), runs in sorted(groups.items(), key=lambda g: (g[0][1], g[1][0]["server"] != "stock-fa3")):
        ratio = f"**{median[(name, max_tokens)] / stock[max_tokens]:.2f}x**" if max_tokens in stock else "no stock run"
        mid = median_run(runs)
        spread = [r["samples_per_s"] for r in runs]
        yield (_row(name, mid.get("layout", "-"), max_tokens, len(runs),
                   f"{median[(name, max_tokens)]:.1f} ({min(spread):.1f}-{max(spread):.1f})", ratio,
                   f"{mid['final_prompt_tokens_per_s']:,.0f}", f"{mid['computed_prompt_tokens_per_s']:,.0f}",
                   mid["requests"], f"{mid['final_cached_fraction']:.1%}",
                   f"{mid['fraction_of_unique_token_ceiling']:.0%}"))  # fmt: skip
    yield ""


def _span_prefills(rows: list[dict]) -> Iterator[str]:
    yield (_row("server", "passages", "prompt tokens sent", "seconds", "computed tokens/s", "vs stock",
               "passage tokens/s", "vs stock"))  # fmt: skip
    yield (_row(*["---"] * 8))
    stock = next((r for r in rows if not r["server"].startswith("pic")), None)
    for r in rows:
        computed = r["computed_tokens_per_s"] / stock["computed_tokens_per_s"] if stock else float("nan")
        passage = r["passage_tokens_per_s"] / stock["passage_tokens_per_s"] if stock else float("nan")
        yield (_row(r["server"], f"{r['passages']:,}", f"{r['sent_tokens']:,}", f"{r['elapsed_s']:.1f}",
                   f"{r['computed_tokens_per_s']:,.0f}", f"**{computed:.2f}x**", f"{r['passage_tokens_per_s']:,.0f}",
                   f"{passage:.2f}x"))  # fmt: skip
    yield ""


def _gpu_profiles(profiles: list[dict], table1: list[dict], top: int = 12) -> Iterator[str]:
    """Per profiled run (`gpu_profile.py`): the engine steps it caught, their GPU time per computed
    prompt token (all steps, and those that computed prompt tokens), the wall time per computed
    prompt token of the row's median run beside it, and the costliest operators."""
    runs = table1_runs(table1)
    for p in profiles:
        steps = engine_steps(p)
        prompts = sorted(s.prompt_tokens for s in steps_of(p) if s.prompt_tokens)
        rate = median_run(runs[(p["row"], p["max_tokens"])])["computed_prompt_tokens_per_s"]
        head = (f"{p['server']}, {p['row']}, max_tokens {p['max_tokens']}: {p['total_us'] / 1e3:,.1f} ms of "
                f"{p['device']}")  # fmt: skip
        if not prompts:  # a window of decode steps only, or a table without step ranges
            yield f"{head}, no engine step that computed prompt tokens"
        else:
            yield (f"{head} kernels in {steps['steps']} engine steps ({steps['gpu_us'] / 1e3:,.1f} ms) computing "
                   f"{steps['prompt_tokens']:,} prompt and {steps['generated_tokens']:,} generated tokens: "
                   f"{steps['gpu_us'] / steps['prompt_tokens']:.1f} us a prompt token; "
                   f"{steps['steps'] - steps['prefill_steps']} steps decode only, the other {steps['prefill_steps']} "
                   f"({steps['prefill_steps_gpu_us'] / steps['prompt_tokens']:.1f} us a prompt token) hold a median "
                   f"{statistics.median(prompts):,.0f} prompt tokens ({prompts[0]:,}-{prompts[-1]:,}); the median "
                   f"run: {1e6 / rate:.1f} us of wall time a computed prompt token")  # fmt: skip
        yield _row("operator", f"self {p['device']} (ms)", "share", "calls", "us a prompt token")
        yield _row(*["---"] * 5)
        for op in [op for op in p["ops"] if not is_step(op)][:top]:
            per_token = f"{op['self_us'] / steps['prompt_tokens']:.2f}" if prompts else "-"
            yield _row(f"`{op['name']}`", f"{op['self_us'] / 1e3:,.1f}", f"{op['self_us'] / p['total_us']:.1%}",
                       op["calls"], per_token)  # fmt: skip
        yield ""


def _timelines(rows: list[dict]) -> Iterator[str]:
    """Per Table 1 configuration, its median run's engine timeline (`engine_timeline.py`) by tenth of the run."""
    for (name, max_tokens), runs in table1_runs(rows).items():
        run = median_run(runs)
        if "timeline" not in run:
            continue
        summary = summarise(run["timeline"])
        spent = summary["request_seconds"]
        yield (f"{name}, max_tokens {max_tokens}, repeat {run['repeat']}: {summary['seconds']:.1f} s, the engine "
               f"busy from {summary['first_busy_s']:.2f} s, no request waiting in {summary['nothing_waiting']:.0%} "
               f"of {len(run['timeline'])} samples; prompt-seconds: "
               f"{run['client_prompt_seconds']:,.0f} held by the client, {spent['server_s']:,.0f} on the server "
               f"({spent['queued_s']:,.0f} queued in the engine, {spent['inference_s']:,.0f} scheduled), "
               f"{run['client_prompt_seconds'] - spent['server_s']:,.0f} outside it")  # fmt: skip
        yield _row("tenth of the run", "computed prompt tokens/s", "generated tokens/s", "running", "waiting")
        yield _row(*["---"] * 5)
        for i, part in enumerate(summary["parts"], 1):
            yield _row(i, f"{part['computed_prompt_tokens_per_s']:,.0f}", f"{part['generated_tokens_per_s']:,.0f}",
                       f"{part['running']:.0f}", f"{part['waiting']:.0f}")  # fmt: skip
        yield ""


def _figure2_and_others(data: dict) -> Iterator[str]:
    by_k: dict[int, dict[str, list[float]]] = {}
    for r in data["figure2"]:
        for key, value in r.items():
            if key.endswith("_s"):
                by_k.setdefault(r["k"], {}).setdefault(key, []).append(value)
    if by_k:
        # Runs since 2026-12-03 also time stock's plain prompt from its own prefix cache.
        floor = any("stock_cached_ttft_s" in r for r in data["figure2"])
        sdk = any("pic_cached_ttft_sdk_s" in r for r in data["figure2"])  # runs since 2026-12-05
        again = any("pic_cached_again_ttft_s" in r for r in data["figure2"])  # runs since 67d6def
        extra = (*(("stock, same prompt cached (s)",) if floor else ()),
                 *(("MiniPIC cached, through the SDK (s)", "stock cached, through the SDK (s)") if sdk else ()),
                 *(("MiniPIC cached, the same request again (s)",) if again else ()))
        yield (_row("k documents", "stock uncached TTFT (s)", "MiniPIC cached TTFT (s)", "speed-up",
                   "preload k documents (s)", "MiniPIC spans computed in prompt (s)", *extra))  # fmt: skip
        yield (_row(*["---"] * (6 + len(extra))))
        for k in sorted(by_k):
            m = {key: statistics.median(v) for key, v in by_k[k].items()}
            stock_s, cached = m.get("stock_uncached_ttft_s"), m.get("pic_cached_ttft_s")
            speedup = f"{stock_s / cached:.0f}x" if stock_s and cached else "-"
            cells = (*((_fmt(m.get("stock_cached_ttft_s")),) if floor else ()),
                     *((_fmt(m.get("pic_cached_ttft_sdk_s")), _fmt(m.get("stock_cached_ttft_sdk_s"))) if sdk else ()),
                     *((_fmt(m.get("pic_cached_again_ttft_s")),) if again else ()))
            yield (_row(k, _fmt(stock_s), _fmt(cached), speedup, _fmt(m.get("preload_s")),
                       _fmt(m.get("pic_spans_computed_ttft_s")), *cells))  # fmt: skip
        yield ""
    for r in data["long_spans"]:
        yield (f"- long spans, {r['server']}: {r['samples_per_s']:.2f} samples/s, "
              f"{r['final_cached_fraction']:.1%} of final prompt tokens cached")  # fmt: skip
    for r in data["small_requests"]:
        yield (f"- small requests, {r['server']}: {r['requests_per_s']:.0f} requests/s "
              f"({r['requests']} random 128-token prompts, {r['in_flight']} in flight)")  # fmt: skip
    for r in data["jit"]:
        yield (f"- {r['server']}: {r['compilations_after_ready']} JIT-monitor warnings after the server was ready")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def attention(data: dict) -> Iterator[str]:
    if data.get("times"):
        yield (_row("case", "MiniPIC (ms)", "FA3 (ms)", "MiniPIC / FA3", "moved requests on the tile kernel (ms)",
                   "CPU dispatch per call (µs)"))  # fmt: skip
        yield (_row(*["---"] * 6))
    for r in data.get("times", []):
        yield (_row(r["case"], f"{r['ours_ms']:.4f}", f"{r['fa3_ms']:.4f}", f"**{r['ratio']:.2f}**",
                   f"{r['ours_in_kernel_ms']:.4f}", f"{r['ours_cpu_us']:.0f}"))  # fmt: skip
    if data.get("correctness"):
        worst = max(data["correctness"], key=lambda r: r["rel_l2"])
        yield (f"\nCorrectness: {len(data['correctness'])} checks against the fp32 reference, worst rel. L2 "
               f"{worst['rel_l2']:.1e} ({worst['case']}, {worst['path']}), NaN in none: "
               f"{not any(r['nan'] for r in data['correctness'])}.")  # fmt: skip
    if data.get("kv_write"):
        yield ("\n" + _row("cache write", "MiniPIC (ms)", "vLLM's Triton write (ms)", "MiniPIC / vLLM"))
        yield (_row(*["---"] * 4))
        for r in data["kv_write"]:
            yield (_row(r["case"], f"{r['ours_ms']:.4f}", f"{r['vllm_ms']:.4f}", f"{r['ratio']:.2f}"))
    if data.get("prefill_parts"):
        yield ("\n" + _row("short prefill", "context", "MiniPIC (ms)", "FA3 (ms)", "/ FA3", "moving pass alone (ms)"))
        yield (_row(*["---"] * 6))
        for r in data["prefill_parts"]:
            move = f"{r['move_pass_ms']:.4f}" if "move_pass_ms" in r else "-"
            yield (_row(r["case"], "moved" if r["moved"] else "at origin", f"{r['whole_ms']:.4f}", f"{r['fa3_ms']:.4f}",
                       f"{r['ratio']:.2f}", move))  # fmt: skip
    if data.get("decode_variants"):
        yield ("\n" + _row("decode launch alone", "keys", "BLOCK_N / warps / stages / splits", "ms", "/ FA3", "GB/s"))
        yield (_row(*["---"] * 6))
        for r in data["decode_variants"]:
            c = r["config"]
            launch = f"{c['block_n']} / {c['num_warps']} / {c['num_stages']} / {c['num_splits'] or 'auto'}"
            yield (_row(r["case"], r["variant"], launch, f"{r['ms']:.4f}", f"{r['ratio']:.2f}",
                       f"{r['gb_per_s']:,.0f}"))  # fmt: skip
    if data.get("dispatch"):
        yield ("\n" + _row("one layer's piece", "documents", "host (µs a call)", "GPU (µs a call)"))
        yield (_row(*["---"] * 4))
        for r in data["dispatch"]:
            if "cpu_us" in r:
                gpu = f"{r['gpu_ms'] * 1e3:.1f}" if "gpu_ms" in r else "- (syncs the host)"
                yield (_row(r["piece"], str(r["docs"]), f"{r['cpu_us']:.0f}", gpu))
        for r in data["dispatch"]:
            if "equals_write_kv" in r:
                equal = r["equals_write_kv"]
                yield f"- {r['docs']} documents: vLLM's CUDA write into MiniPIC's layout equals write_kv: {equal}"
    if data.get("decode_configs"):
        yield ("\n" + _row("decode call", "BLOCK_N / warps / stages", "ms", "FA3 (ms)", "/ FA3"))
        yield (_row(*["---"] * 5))
        for r in data["decode_configs"]:
            c = r["config"]
            yield (_row(r["case"], f"{c['block_n']} / {c['num_warps']} / {c['num_stages']}", f"{r['ms']:.4f}",
                       f"{r['fa3_ms']:.4f}", f"{r['ratio']:.2f}"))  # fmt: skip
    jit = data.get("jit")
    if jit:
        yield (f"JIT: warm-up {jit['warm_up_s']:.1f} s, then {jit['compilations_after_warm_up']} compilations over "
              f"{jit['steps']} random steps.")  # fmt: skip


def concurrency(data: dict) -> Iterator[str]:
    yield (_row("requests in flight", "ideal (req/s)", "httpx default pool (req/s)", "SDK transport (req/s)"))
    yield (_row(*["---"] * 4))
    for r in data["rows"]:
        yield (_row(r["in_flight"], f"{r['ideal_requests_per_s']:,.0f}", f"{r['httpx_default_pool']:,.0f}",
                   f"{r['sdk_pooled_transport']:,.0f}"))  # fmt: skip


def load(data: dict) -> Iterator[str]:
    """benchmarks/load_sweep.py: one row per server and offered rate, as `vllm bench serve` reports."""
    yield (_row("server (layout)", "offered (samples/s)", "TTFT p50 (s)", "TTFT p99 (s)", "ITL p50 (ms)",
                "E2E p99 (s)", "throughput (samples/s)", "goodput (samples/s)", "computed prompt tokens / sample"))
    yield (_row(*["---"] * 9))
    for r in data["rates"]:
        censored = "+" if r.get("ttft_censored") else ""
        scheduling = ", inline spans" if r.get("strategy") == "inline" else ""
        yield (_row(f"{r['server']} ({r['layout']}{scheduling})", f"{r['rate']:g}", f"{r['ttft_p50_s']:.3f}",
                    f"{r['ttft_p99_s']:.3f}{censored}", f"{r['itl_p50_s'] * 1000:.1f}", f"{r['e2e_p99_s']:.2f}",
                    f"{r['throughput_per_s']:.1f}", f"{r['goodput_per_s']:.1f}",
                    f"{r['computed_prompt_tokens_per_sample']:,.0f}"))  # fmt: skip


# request_overhead.py's stages, in the order of a request, and their column headers.
OVERHEAD_STAGES = {
    "body_httpx": "client body, httpx json=", "body_sdk": "client body, SDK", "json_ids": "server: JSON ids",
    "route_vllm": "server: body to request, vLLM's route", "route_minipic": "server: body to request, MiniPIC's route",
    "detokenizer_vllm": "detokenizer, vLLM's priming", "detokenizer_tail": "detokenizer, tail priming",
    "hasher_vllm": "vLLM's hasher (plain)", "hasher_minipic": "MiniPIC's hasher (PIC)",
    "account": "MiniPIC's account", "block_records": "MiniPIC's block records",
}


def overhead(data: dict) -> Iterator[str]:
    """benchmarks/request_overhead.py: one row per number of cached documents, milliseconds per request
    (the stages the file has: older runs lack the route columns)."""
    stages = [s for s in OVERHEAD_STAGES if f"{s}_ms" in data["rows"][0]]
    yield _row("k documents", "prompt tokens (plain / PIC)", *(OVERHEAD_STAGES[s] for s in stages))
    yield _row(*["---"] * (2 + len(stages)))
    for r in data["rows"]:
        yield _row(r["k"], f"{r['plain_tokens']:,} / {r['pic_tokens']:,}", *(f"{r[f'{s}_ms']:.2f}" for s in stages))


def ttft(data: dict) -> Iterator[str]:
    """benchmarks/cached_ttft.py: per number of cached documents, the client's TTFT and the
    server's stages (means of vLLM's request-time histograms), milliseconds; then, where the
    GPU was profiled, each k's engine steps and costliest kernels. Results of several servers
    (stock's fully cached floor beside MiniPIC) name each row's server."""
    servers = len({r.get("server") for r in data["rows"]}) > 1

    def label(r: dict) -> list[str]:
        return [r["server"]] if servers else []

    yield _row(*(["server"] if servers else []), "k documents", "prompt tokens (cached)", "client TTFT (ms)",
               "API arrival to first token (ms)", "queued (ms)", "scheduled to first token (ms)")  # fmt: skip
    yield _row(*["---"] * (6 + servers))
    for r in data["rows"]:
        yield _row(*label(r), r["docs"], f"{r['prompt_tokens']:,} ({r['cached_tokens']:,})",
                   f"{r['ttft_median_s'] * 1e3:.1f}", f"{r['server_first_token_s'] * 1e3:.1f}",
                   f"{r['server_queued_s'] * 1e3:.2f}", f"{r['server_prefill_s'] * 1e3:.1f}")  # fmt: skip
    for r in data["rows"]:
        if "gpu_profile" not in r:
            continue
        table = r["gpu_profile"]
        steps = engine_steps(table)
        per_step = max(1, steps["steps"])
        yield ""
        prefill_step_ms = steps["prefill_steps_gpu_us"] / 1e3 / max(1, steps["prefill_steps"])
        yield (f"{' '.join([*label(r), str(r['docs'])])} documents: {steps['steps']} engine steps spanning "
               f"{steps['gpu_us'] / 1e3:,.1f} ms of the {table['device']} timeline (idle gaps included), "
               f"{prefill_step_ms:.2f} ms a step that computed prompt tokens; self {table['device']} time "
               f"{table['total_us'] / 1e3 / per_step:.2f} ms a step")  # fmt: skip
        yield _row("operator", f"self {table['device']} (us) a step", "calls a step")
        yield _row("---", "---", "---")
        for op in [op for op in table["ops"] if not is_step(op)][:12]:
            yield _row(f"`{op['name']}`", f"{op['self_us'] / per_step:,.1f}", f"{op['calls'] / per_step:.1f}")


# The printers by kind: each yields the lines (or blocks of lines) of its Markdown tables.
TABLES = {"served": served, "attention": attention, "concurrency": concurrency, "load": load, "overhead": overhead,
          "ttft": ttft}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=list(TABLES))
    parser.add_argument("path", type=Path)
    args = parser.parse_args()
    for text in TABLES[args.kind](read_result(args.path)):
        print(text)


if __name__ == "__main__":
    main()
