"""Draw the PNGs in docs/ from the JSON results under benchmarks/results/.

    python benchmarks/plot.py            # every figure whose JSON exists

Each figure is drawn only from its JSON file, so a figure always shows a measured run; every
``accuracy*.json`` of the family harness (benchmarks/accuracy.py) gets ``docs/<name>-pareto.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from results_io import read_result, result_stem  # noqa: E402
from tables import median_run, table1_runs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"


def served_table1(data: dict, out: Path) -> None:
    rows = data["table1"]
    names = list(dict.fromkeys(r["row"] for r in rows))
    tokens = sorted({r["max_tokens"] for r in rows})
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(tokens)
    groups = table1_runs(rows)
    for j, mt in enumerate(tokens):
        runs = [[r["samples_per_s"] for r in groups.get((n, mt), [])] for n in names]
        values = [median_run(groups[(n, mt)])["samples_per_s"] if (n, mt) in groups else None for n in names]
        spread = [[(v or 0) - min(r, default=0) for v, r in zip(values, runs)],
                  [max(r, default=0) - (v or 0) for v, r in zip(values, runs)]]  # fmt: skip
        xs = [i + j * width for i in range(len(names))]
        bars = ax.bar(xs, [v or 0 for v in values], width, yerr=spread, capsize=2, label=f"max_tokens {mt}")
        ax.bar_label(bars, labels=["not measured" if v is None else f"{v:.1f}" for v in values], fontsize=7)
    ax.axhline(data["unique_token_ceiling_samples_per_s"], color="grey", ls="--", lw=1, label="unique-token ceiling")
    ax.set_xticks([i + width * (len(tokens) - 1) / 2 for i in range(len(names))], names, rotation=20, ha="right",
                  fontsize=8)  # fmt: skip
    ax.set_ylabel("samples / s")
    unique = data.get("unique_document_fraction")
    reuse = f", {unique:.0%} of documents unique" if unique is not None else ""
    ax.set_title(f"2Wiki-like RAG through the served path: {data['samples']} samples{reuse}\n"
                 f"{data.get('device', '')}, {data['date'][:10]}", fontsize=10)  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def served_figure2(data: dict, out: Path) -> None:
    rows = data["figure2"]

    def median_by_k(key: str) -> tuple[list[int], list[float]]:
        ks = sorted({r["k"] for r in rows if key in r})
        values = []
        for k in ks:
            xs = sorted(r[key] for r in rows if r["k"] == k and key in r)
            values.append(xs[len(xs) // 2])
        return ks, values

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, style in (
        ("stock_uncached_ttft_s", "stock FA3, uncached", "o-"),
        ("stock_cached_ttft_s", "stock FA3, the same prompt from its prefix cache", "o:"),
        ("pic_spans_computed_ttft_s", "MiniPIC, spans computed in the prompt", "s-"),
        ("preload_s", "MiniPIC, preloading the k documents", "^--"),
        ("pic_cached_ttft_s", "MiniPIC, k documents cached", "D-"),
    ):
        ks, values = median_by_k(key)
        if ks:
            ax.plot(ks, values, style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("documents of ~1,000 tokens (k)")
    ax.set_ylabel("seconds (median)")
    ax.set_title("Time to first token of one request", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def attention(data: dict, out: Path) -> None:
    rows = data["times"]
    fig, ax = plt.subplots(figsize=(9, 4))
    bars = ax.bar([r["case"] for r in rows], [r["ratio"] for r in rows], color="tab:blue")
    ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(1.10, color="tab:red", ls="--", lw=1, label="target 1.10x")
    ax.set_ylabel("MiniPIC time / FA3 time")
    ax.set_title(f"Attention on {data['device']} (bf16, Llama-3-8B shape), {data['date']}", fontsize=10)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


ACCURACY_BARS = (
    ("accuracy", "correct answers"),
    ("same_verdict_as_full", "same verdict as full attention"),
    ("cached_fraction", "prompt tokens cached (server)"),
    ("reusable_fraction", "prompt tokens in reusable segments"),
)


def accuracy(data: dict, out: Path) -> None:
    summary, meta = data["summary"], data["meta"]
    layouts = list(summary)
    width = 0.8 / len(ACCURACY_BARS)
    fig, ax = plt.subplots(figsize=(11, 4.8), dpi=110)
    for n, (key, label) in enumerate(ACCURACY_BARS):
        xs = [i + (n - (len(ACCURACY_BARS) - 1) / 2) * width for i in range(len(layouts))]
        values = [summary[name][key] for name in layouts]
        bars = ax.bar(xs, values, width, label=label)
        if key == "accuracy":
            ax.bar_label(bars, labels=[f"{v:.0%}" for v in values], fontsize=8, padding=2)
    ax.set_xticks(range(len(layouts)), layouts)
    ax.set_ylim(0, 1.05)
    ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.set_title(
        f"{meta['model']}: {meta['questions']} questions over {meta['docs_per_question']} "
        f"2WikiMultihopQA passages each ({meta['server_args'][1]}, not fine-tuned for PIC)",
        fontsize=10,
    )
    ax.legend(fontsize=8, ncols=len(ACCURACY_BARS), loc="upper center", bbox_to_anchor=(0.5, -0.07), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)


def accuracy_pareto(data: dict, out: Path) -> None:
    """Per family: accuracy (Wilson 95%) against the prompt tokens the server computed, relative
    to full attention; the layouts nearest the top left trade least accuracy for most reuse."""
    families, meta = data["families"], data["meta"]
    fig, axes = plt.subplots(1, len(families), figsize=(4.2 * len(families), 4.4), dpi=110, squeeze=False)
    for ax, (family, info) in zip(axes[0], families.items()):
        for name, row in info["summary"].items():
            x, y = row["tokens"]["computed_vs_full"], row["accuracy"]
            low, high = row["accuracy_ci95"]
            ax.errorbar(x, y, yerr=[[y - low], [high - y]], fmt="o", capsize=3)
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.axhline(info["chance"], color="grey", ls=":", lw=1, label=f"chance {info['chance']:.0%}")
        ax.set_xlim(0, 1.2 * max(1.0, *(row["tokens"]["computed_vs_full"] for row in info["summary"].values())))
        ax.set_ylim(0, 1.02)
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.set_xlabel("prompt tokens computed / full attention's")
        ax.set_title(f"{family}: {info['summary']['full']['questions']} questions, "
                     f"{info['reuse']['repeat_slot_share']:.0%} passages repeated", fontsize=9)  # fmt: skip
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel("accuracy (95% interval)")
    commit = (meta.get("commit") or "?")[:7] + ("+dirty" if meta.get("dirty") else "")
    fig.suptitle(f"{meta['model']} on {meta['device']} (vLLM {meta['versions']['vllm']}, {commit})", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)


def client_concurrency(data: dict, out: Path) -> None:
    rows = data["rows"]
    xs = [r["in_flight"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [r["ideal_requests_per_s"] for r in rows], "k--", label="ideal (in flight / latency)")
    ax.plot(xs, [r["httpx_default_pool"] for r in rows], "o-", label="httpx, default pool (httpcore)")
    ax.plot(xs, [r["sdk_pooled_transport"] for r in rows], "s-", label="SDK: httpx over aiohttp's pool")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("requests / s")
    ax.set_title(f"One client, server latency {data['latency_ms']:.0f} ms ({data['cpus']} CPUs)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def replicas(data: dict, out: Path) -> None:
    """benchmarks/replicas.py: samples/s and span hit rate of each run."""
    rows = data["runs"]
    names = [r["mode"] for r in rows]
    fig, (speed, hits) = plt.subplots(1, 2, figsize=(11, 4.2))
    bars = speed.bar(range(len(rows)), [r["samples_per_s"] for r in rows], color="tab:blue")
    speed.bar_label(bars, labels=[f"{r['samples_per_s']:.1f}" for r in rows], fontsize=7)
    speed.set_ylabel("samples / s")
    rates = [r["span_hit_rate"] if r["span_hit_rate"] is not None else r["final_cached_fraction"] or 0 for r in rows]
    bars = hits.bar(range(len(rows)), rates, color="tab:green")
    hits.bar_label(bars, labels=[f"{v:.3f}" for v in rates], fontsize=7)
    hits.set_ylabel("span hit rate (stock: cached fraction)")
    hits.set_ylim(0, 1.05)
    for ax in (speed, hits):
        ax.set_xticks(range(len(rows)), names, rotation=25, ha="right", fontsize=7)
    meta = data["provenance"]
    commit = (meta.get("commit") or "?")[:7] + ("+dirty" if meta.get("dirty") else "")
    fig.suptitle(f"{data['replicas']} replicas, {data['samples']} samples, {data['unique_document_fraction']:.0%} of "
                 f"documents unique ({data['device']}, {commit}, {data['date'][:10]})", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def load_sweep(data: dict, out: Path) -> None:
    """benchmarks/load_sweep.py: p50 and p99 TTFT against the offered rate, one colour per server;
    a hollow marker is a lower bound (samples cancelled at the drain timeout), the SLO a line."""
    rows, slo = data["rates"], data["slo_ttft_s"]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, server in enumerate(dict.fromkeys(r["server"] for r in rows)):
        mine = sorted((r for r in rows if r["server"] == server), key=lambda r: r["rate"])
        colour = f"C{i}"
        warm = ", spans warm" if any(r.get("warm_spans") for r in mine) else ""
        for key, style, label in (("ttft_p50_s", "--", "p50"), ("ttft_p99_s", "-", "p99")):
            points = [(r["rate"], r[key], r.get("ttft_censored")) for r in mine if r.get(key) is not None]
            if not points:
                continue
            ax.plot([p[0] for p in points], [p[1] for p in points], style, color=colour,
                    label=f"{server} ({mine[0]['strategy']}{warm}) {label}")  # fmt: skip
            for rate, value, censored in points:
                ax.plot(rate, value, "o", color=colour, mfc="none" if censored else colour, ms=5)
        unbounded = [r["rate"] for r in mine if r.get("ttft_p99_s") is None]
        if unbounded:  # a failed sample: p99 has no bound
            ax.plot(unbounded, [ax.get_ylim()[1]] * len(unbounded), "x", color=colour)
    ax.axhline(slo, color="grey", ls=":", lw=1, label=f"SLO: TTFT {slo:g} s")
    ax.set_yscale("log")
    ax.set_xlabel("offered rate (samples / s, Poisson arrivals)")
    ax.set_ylabel("time to first token (s)")
    meta = data["provenance"]
    commit = (meta.get("commit") or "?")[:7] + ("+dirty" if meta.get("dirty") else "")
    work = data["workload"]
    ax.set_title(f"TTFT under load: 2Wiki-like RAG, max_tokens {work['max_tokens']} "
                 f"({data['device']}, {commit}, {data['date'][:10]})", fontsize=10)  # fmt: skip
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


FIGURES = (
    ("served-h200.json", "served-table1.png", served_table1),
    ("served-h200-refreshed-heads.json", "served-table1-refreshed-heads.png", served_table1),
    ("served-h200-no-reuse.json", "served-table1-no-reuse.png", served_table1),
    ("served-h200-table1-ae8e479.json", "served-table1-ae8e479.png", served_table1),
    ("served-h200-table1-8b98355.json", "served-table1-8b98355.png", served_table1),
    ("served-h200-table1-72ee0db-32-tokens.json", "served-table1-72ee0db-32-tokens.png", served_table1),
    ("served-h200-table1-4d50e12-32-tokens.json.gz", "served-table1-4d50e12-32-tokens.png", served_table1),
    ("served-h200-table1-0c72868-32-tokens.json.gz", "served-table1-0c72868-32-tokens.png", served_table1),
    ("served-h100-table1-c3c9f9e-default.json", "served-table1-c3c9f9e-default.png", served_table1),
    ("served-h200-table1-ddfd684-compact.json", "served-table1-ddfd684-compact.png", served_table1),
    ("served-h100-table1-c02c4f7-compact.json", "served-table1-c02c4f7-compact.png", served_table1),
    ("served-h100-table1-58114de-compact.json", "served-table1-58114de-compact.png", served_table1),
    ("served-h100-table1-a9f9d27-refreshed4.json", "served-table1-a9f9d27-refreshed4.png", served_table1),
    ("served-h100-table1-b5ffa0a-hidden-refreshed4.json", "served-table1-b5ffa0a-hidden-refreshed4.png", served_table1),
    ("served-h100-table1-cd7cd47-span-bias.json", "served-table1-cd7cd47-span-bias.png", served_table1),
    ("served-h200-spans.json", "served-figure2.png", served_figure2),
    ("attention-h200.json", "attention-kernel.png", attention),
    ("client-concurrency-cpu.json", "client-concurrency.png", client_concurrency),
    ("accuracy-smollm2-cpu.json.gz", "accuracy.png", accuracy),
    ("served-figure2-h200-7139fcd.json", "served-figure2-7139fcd.png", served_figure2),
    ("served-h200-figure2-516575e.json", "served-figure2-516575e.png", served_figure2),
    ("served-h100-figure2-df8727e.json", "served-figure2-df8727e.png", served_figure2),
    ("served-h100-figure2-67d6def.json", "served-figure2-67d6def.png", served_figure2),
    ("served-h200-figure2-2b161a0.json", "served-figure2-2b161a0.png", served_figure2),
    ("served-h100-figure2-641470f.json", "served-figure2-641470f.png", served_figure2),
    ("replicas-h200.json", "scale-out-replicas.png", replicas),
    ("replicas-h200-7139fcd.json", "scale-out-replicas-7139fcd.png", replicas),
    ("load-h200-7139fcd.json", "load-ttft.png", load_sweep),
    ("load-h200-block-7139fcd.json", "load-ttft-block.png", load_sweep),
    ("load-h200-warm-a4f782a.json", "load-ttft-warm.png", load_sweep),
    ("load-h200-inline-cdf8ae0.json", "load-ttft-inline.png", load_sweep),
    ("served-h200-inline-cdf8ae0.json", "served-table1-inline.png", served_table1),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--docs", type=Path, default=DOCS)
    args = parser.parse_args()
    for source, target, draw in FIGURES:
        path = args.results / source
        if path.exists():
            draw(read_result(path), args.docs / target)
            plt.close("all")  # one figure open at a time, however many results there are
            print(f"{path} -> {args.docs / target}")
    for path in sorted(args.results.glob("accuracy*.json*")):  # the family harness's results
        data = read_result(path)
        if str(data.get("schema", "")).startswith("minipic-accuracy"):
            target = args.docs / f"{result_stem(path)}-pareto.png"
            accuracy_pareto(data, target)
            plt.close("all")
            print(f"{path} -> {target}")


if __name__ == "__main__":
    main()
