"""Where a layout's wrong single-fact years come from: another passage, the answering one, or nowhere.

An accuracy run (`accuracy.py`) records every answer. For the questions that ask a person's
year of birth or death, a wrong answer either names a year some other passage of the prompt
holds (the model read a distractor), names the answering passage's other year (birth for
death: it found the passage and misread it), names a year no passage holds, or names none.
Counting these per layout says whether a layout loses answers by hiding the passage or by
changing how the model reads it. Director questions are counted as wrong, not split.

    .venv/bin/python benchmarks/accuracy_errors.py --passages ../shared/data/2wiki_passages.json \\
        --result benchmarks/results/accuracy-families-smollm2-h100-ranked.json.gz \\
        --out benchmarks/results/accuracy-errors-smollm2-h100-ranked.json
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from results_io import read_result, write_result

from accuracy_families import Corpus
from provenance import provenance

YEAR = re.compile(r"\b(1\d{3}|20\d{2})\b")
CAUSES = ("another passage's year", "the answering passage's other year", "a year in no passage", "no year")


def years(text: str) -> set[str]:
    return set(YEAR.findall(text))


def cause(answer: str, gold: Sequence[str], others: Sequence[str]) -> str:
    """Why a wrong answer to a year question is wrong, the first of `CAUSES` that fits."""
    named = years(answer)
    if not named:
        return CAUSES[3]
    if named & set().union(*map(years, others)):
        return CAUSES[0]
    if named & set().union(*map(years, gold)):
        return CAUSES[1]
    return CAUSES[2]


def wrong_years(questions: Sequence[dict], texts: Sequence[str], layout: str) -> dict[str, int]:
    """Per cause, the layout's wrong answers to year questions; plus all wrong answers."""
    causes: Counter[str] = Counter()
    wrong = 0
    for question in questions:
        if question["answers"][layout]["correct"]:
            continue
        wrong += 1
        if question["kind"] not in ("born", "died"):
            continue
        passages = [texts[i] for i in question["passages"]]
        gold = [passages[p] for p in question["gold_positions"]]
        others = [t for p, t in enumerate(passages) if p not in question["gold_positions"]]
        causes[cause(question["answers"][layout]["text"], gold, others)] += 1
    return {"wrong": wrong, **{c: causes[c] for c in CAUSES}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=Path, required=True, help="2wiki_passages.json, as the run read it")
    parser.add_argument("--result", type=Path, required=True, help="an accuracy.py result")
    parser.add_argument("--family", default="single")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    texts = Corpus.of(json.loads(args.passages.read_bytes()), set()).texts  # as the run's prompts held them
    family = read_result(args.result)["families"][args.family]
    questions = family["questions"]
    if any(i >= len(texts) for q in questions for i in q["passages"]):
        raise SystemExit(f"{args.result}: the {args.family} family holds passages that {args.passages} lacks")
    layouts = {layout: wrong_years(questions, texts, layout) for layout in family["summary"]}
    for layout, row in layouts.items():
        print(layout, row)
    write_result(args.out, {"provenance": provenance(), "result": args.result.name, "family": args.family,
                            "questions": len(questions), "layouts": layouts})  # fmt: skip


if __name__ == "__main__":
    main()
