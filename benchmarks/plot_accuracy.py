"""Draw the accuracy study's figure from its JSON (``benchmarks/accuracy.py`` writes it).

    python benchmarks/plot_accuracy.py benchmarks/results/accuracy-smollm2-cpu.json docs/accuracy.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend choice)

BARS = (
    ("accuracy", "correct answers"),
    ("same_verdict_as_full", "same verdict as full attention"),
    ("cached_fraction", "prompt tokens cached (server)"),
    ("reusable_fraction", "prompt tokens in reusable segments"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("png", type=Path)
    args = parser.parse_args()
    report = json.loads(args.results.read_text(encoding="utf-8"))
    summary, meta = report["summary"], report["meta"]
    layouts = list(summary)
    width = 0.8 / len(BARS)
    fig, ax = plt.subplots(figsize=(11, 4.8), dpi=110)
    for n, (key, label) in enumerate(BARS):
        xs = [i + (n - (len(BARS) - 1) / 2) * width for i in range(len(layouts))]
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
    ax.legend(fontsize=8, ncols=len(BARS), loc="upper center", bbox_to_anchor=(0.5, -0.07), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
