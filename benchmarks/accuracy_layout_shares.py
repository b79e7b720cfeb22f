"""What each layout's final prompts take from the cache once their spans are cached (no server).

The accuracy run (`accuracy.py`) starts every pass from a cold cache, so its computed tokens
include each distinct passage's span prefill. In steady serving the spans are already
cached and a final prompt computes only what its layout puts in context: the question, the
chat template's tail, and the in-context heads of EPIC and refreshed heads. This lays out the
harness's questions with the SDK's own prompt builder and counts exactly that. A prefix that
holds a document (`LeadInContext(as_text=True)`, which the client does not prefill) counts as
cached where an earlier question of the family opened with the same one, as vLLM's prefix
cache finds it: the first prompt it opens computes it.

    .venv/bin/python benchmarks/accuracy_layout_shares.py --passages ../shared/data/2wiki_passages.json \\
        --out benchmarks/results/accuracy-layout-shares-smollm2.json
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterable, Mapping
from pathlib import Path

from minipic_client import RefreshedHeads, Tokenizer
from minipic_client.prompt import TECHNIQUES as SDK_TECHNIQUES
from minipic_client.prompt import ChatTemplate, PromptBuilder, PromptLayout
from minipic_client.tokens import TokenCache

from accuracy_families import Corpus, build_family, extract_facts
from accuracy_layouts import HEADER_REPEAT, SYSTEM
from provenance import provenance

# SmolLM2-135M-Instruct's markers as `minipic serve` picks them (docs/accuracy.md), block size 16.
MARKERS = {"hsep_token_id": 13, "ssep_token_id": 14, "pdep_token_id": 15, "pad_token_id": 16}
# The SDK's layouts by the harness's names (`--layout refreshed-heads` is `refreshed_heads`), and one more.
TECHNIQUES = {name.replace("-", "_"): technique for name, technique in SDK_TECHNIQUES.items()}
TECHNIQUES["refreshed_heads_joined"] = RefreshedHeads(join_prefix=True)
TECHNIQUES["lead_text_leadin_repeat_refreshed_heads"] = HEADER_REPEAT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=Path, required=True)
    parser.add_argument("--model", type=Path, default=Path.home() / ".cache/minipic/models/SmolLM2-135M-Instruct")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--questions", type=int, default=300)
    args = parser.parse_args()
    tokenizer = Tokenizer.from_pretrained(args.model)
    passages = json.loads(args.passages.read_bytes())
    corpus = Corpus.of(passages, set())
    lengths = [len(tokenizer.encode(t, special_tokens_as_text=False)) for t in corpus.texts]
    corpus.usable = {i for i, n in enumerate(lengths) if n <= 300}  # as accuracy.py's defaults
    facts = extract_facts(passages)
    builder = PromptBuilder(TokenCache(tokenizer, MARKERS.values()), block_size=16, **MARKERS)
    chat = ChatTemplate(tokenizer)
    result: dict = {"provenance": provenance(), "markers": MARKERS, "block_size": 16, "families": {}}
    for family in ("single", "bridge", "synthetic"):
        questions = build_family(family, facts, corpus, args.questions, 6, 150, random.Random(f"0:{family}"))
        rows = result["families"][family] = {}
        for name, technique in TECHNIQUES.items():
            plain = 0
            laid_out = []
            for q in questions:
                parts = chat.parts(SYSTEM, technique.documents([corpus.texts[i] for i in q.passages]), q.question)
                laid_out.append(builder.build(parts, add_special_tokens=False))
                plain += len(builder.build(parts, pic=False, add_special_tokens=False).token_ids)
            cached, total = steady_cached_tokens(laid_out, MARKERS), sum(len(x.token_ids) for x in laid_out)
            rows[name] = {
                "from_cache": round(cached / total, 4),
                "computed_vs_plain": round((total - cached) / plain, 4),
                "plain_tokens_per_question": round(plain / len(questions), 1),
            }
            print(family, name, rows[name], flush=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


def steady_cached_tokens(layouts: Iterable[PromptLayout], markers: Mapping[str, int]) -> int:
    """The tokens of `layouts`, sent in turn once their spans are cached, that come from the
    cache: each one's cacheable tokens, plus its opening (the tokens before its first marker
    other than the pad, which only fills a segment: the system turn and any document continuing
    it) past the prefix prefill wherever an earlier prompt opened the same way, as vLLM's prefix
    cache finds it."""
    openers = {token for key, token in markers.items() if key != "pad_token_id"}
    cached = 0
    openings: set[tuple[int, ...]] = set()
    for layout in layouts:
        end = next((i for i, token in enumerate(layout.token_ids) if token in openers), len(layout.token_ids))
        opening = tuple(layout.token_ids[:end])
        if opening in openings:
            cached += len(opening) - sum(len(p.token_ids) for p in layout.prefills if p.kind == "prefix")
        openings.add(opening)
        cached += layout.cacheable_tokens
    return cached


if __name__ == "__main__":
    main()
