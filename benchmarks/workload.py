"""A 2WikiMultihopQA-like RAG workload: a system prompt, 10 passages and a question per sample.

The shared data has passages but no question-to-passage lists, so samples draw
passages such that each appears 1.63 times on average (61% of document tokens
unique), as in the 1,000-question dev subset. Output is pre-tokenized (Llama 3
chat layout) so device runs need no tokenizer:

    python benchmarks/workload.py --passages ../shared/data/2wiki_passages.json \
        --tokenizer ../shared/data/llama3-tokenizer --out .devdata/workload.json
    python benchmarks/workload.py ... --jsonl samples.jsonl   # text, for `minipic batch`
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SYSTEM = (
    "You are a helpful assistant. Answer the question using only the passages the user "
    "provides. Reply with a short phrase."
)


def draw_samples(num_passages: int, num_samples: int, docs_per_sample: int, seed: int) -> list[list[int]]:
    """Passage indices per sample: every passage at least once, the rest drawn uniformly."""
    rng = random.Random(seed)
    slots = list(range(num_passages))
    slots += [rng.randrange(num_passages) for _ in range(num_samples * docs_per_sample - num_passages)]
    rng.shuffle(slots)
    samples = []
    for i in range(num_samples):
        chosen = list(dict.fromkeys(slots[i * docs_per_sample : (i + 1) * docs_per_sample]))
        while len(chosen) < docs_per_sample:  # a rare duplicate inside one sample
            extra = rng.randrange(num_passages)
            if extra not in chosen:
                chosen.append(extra)
        samples.append(chosen)
    return samples


def question_for(titles: list[str], rng: random.Random) -> str:
    a, b = rng.sample(titles, 2)
    return f"Which is mentioned earlier in history, {a} or {b}?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", required=True, type=Path)
    parser.add_argument("--tokenizer", type=Path, help="Hugging Face tokenizer dir (for --out)")
    parser.add_argument("--out", type=Path, help="pre-tokenized JSON for device benchmarks")
    parser.add_argument("--jsonl", type=Path, help="text samples for `minipic batch`")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--docs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    passages = json.loads(args.passages.read_text())
    texts = [f"{p['title']}\n{p['text']}\n\n" for p in passages]
    samples = draw_samples(len(passages), args.samples, args.docs, args.seed)
    rng = random.Random(args.seed + 1)
    questions = [question_for([passages[i]["title"] for i in s], rng) for s in samples]

    if args.jsonl:
        with args.jsonl.open("w") as out:
            for n, (docs, question) in enumerate(zip(samples, questions)):
                record = {"id": f"q{n}", "system": SYSTEM, "docs": [texts[i] for i in docs], "task": question}
                out.write(json.dumps(record) + "\n")
    if args.out:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer)

        def encode(text: str) -> list[int]:
            return tok.encode(text, add_special_tokens=False)

        prefix = [tok.bos_token_id or 128000] + encode(
            f"<|start_header_id|>system<|end_header_id|>\n\n{SYSTEM}<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n"
        )
        workload = {
            "prefix": prefix,
            "passages": [encode(t) for t in texts],
            "samples": [
                {"docs": docs, "question": encode(
                    f"Question: {q}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")}
                for docs, q in zip(samples, questions)
            ],
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(workload, separators=(",", ":")))


if __name__ == "__main__":
    main()
