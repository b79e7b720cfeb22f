"""Table 1's prompts under each layout, counted without a server: what a final prompt holds,
what it should find cached, what the span and prefix prefills add, and how many distinct
tokens one run writes to the KV cache; with ``--kv-cache-tokens``, what a run computes when
the cache holds only that many tokens (with ``--lookahead``, also in the order ISPS starts the
samples).

A served run (`served.py --parts table1`) reports the share of its final prompts' tokens that
the server found cached; this says what the layouts promise, so a shortfall shows the cache
losing blocks (evicted before a later sample used them again) rather than the layout. The
SDK's own `SpanClient.rag_layout` lays the samples out, against a stand-in for `/minipic/info`
with `minipic serve`'s markers for the Llama 3 tokenizer (the ids the H200 runs log). A leading
document as text counts as cached where an earlier sample opened with the same one, as
vLLM's prefix cache finds it.

    .venv/bin/python benchmarks/table1_layout_tokens.py --passages ../shared/data/2wiki_passages.json \\
        --tokenizer ../shared/data/llama3-tokenizer --layout refreshed-heads lead-text-repeat-refreshed-heads \\
        --out benchmarks/results/table1-layout-tokens.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from pathlib import Path

import httpx
from accuracy_layout_shares import steady_cached_tokens
from served import table1_requests

from minipic_client import SpanClient
from minipic_client.prompt import TECHNIQUES
from minipic_client.scheduler import LookAhead
from minipic_protocol.info import ServerInfo

from provenance import provenance

# `minipic serve`'s markers for the Llama 3 tokenizer (its reserved special tokens), in `--markers` order.
LLAMA3_MARKERS = (128020, 128021, 128022, 128023)
MARKER_KEYS = ("ssep_token_id", "pdep_token_id", "pad_token_id", "hsep_token_id")


def info_transport(tokenizer: Path, block_size: int, markers: dict[str, int]) -> httpx.MockTransport:
    """Answers `/minipic/info` only: laying a prompt out asks the server nothing else."""
    info = ServerInfo(block_size=block_size, **markers, max_num_seqs=256, max_model_len=40960, model="table1",
                      tokenizer=str(tokenizer), vllm_version="none", minipic_version="none",
                      instance_id="offline").to_json()  # fmt: skip
    return httpx.MockTransport(lambda request: httpx.Response(200, json=info))


class LruCache:
    """A KV cache of `capacity` tokens that evicts the least recently used entry first, as vLLM's
    free-block queue does; entries are whole spans (a span's blocks are used together)."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.used = capacity, 0
        self.entries: OrderedDict[Hashable, int] = OrderedDict()

    def hit(self, key: Hashable, tokens: int) -> bool:
        """Whether `key` is cached (and now most recently used); if not, it is written."""
        if key in self.entries:
            self.entries.move_to_end(key)
            return True
        self.entries[key] = tokens
        self.used += tokens
        while self.used > self.capacity:
            self.used -= self.entries.popitem(last=False)[1]
        return False


def computed_with_cache(layouts: Sequence, capacity: int) -> float:
    """Prompt tokens computed per sample when the samples run one after another over a cache of
    `capacity` tokens: a span prefill computes only when its span was evicted (or never written);
    a final prompt computes, and writes, all that is not a span: a leading document as text
    always, where the steady count takes it as cached if an earlier sample opened with it."""
    cache, computed = LruCache(capacity), 0
    for index, layout in enumerate(layouts):
        computed += sum(len(p.token_ids) for p in layout.prefills if not cache.hit(p.key, len(p.token_ids)))
        own = len(layout.token_ids) - layout.cacheable_tokens
        cache.hit(("final", index), own)
        computed += own
    return computed / len(layouts)


def in_isps_order(layouts: Sequence, lookahead: int) -> list:
    """The samples in the order ISPS starts them, each picked among the next `lookahead` built."""
    return [layout for _, layout in LookAhead(enumerate(layouts), lookahead)]


async def count(layout_name: str, args: argparse.Namespace, requests: list) -> dict:
    markers = dict(zip(MARKER_KEYS, args.markers))
    transport = info_transport(args.tokenizer, args.block_size, markers)
    async with SpanClient("http://offline", technique=TECHNIQUES[layout_name], transport=transport) as client:
        layouts = [client.rag_layout(request) for request in requests]
    final = sum(len(layout.token_ids) for layout in layouts)
    cached = steady_cached_tokens(layouts, markers)
    prefills = {p.key: len(p.token_ids) for layout in layouts for p in layout.prefills}
    prefilled, n = sum(prefills.values()), len(requests)
    return {
        "final_tokens_per_sample": round(final / n, 1),
        "final_cached_fraction": round(cached / final, 4),
        "final_computed_per_sample": round((final - cached) / n, 1),
        "prefill_tokens_per_sample": round(prefilled / n, 1),
        "computed_per_sample": round((final - cached + prefilled) / n, 1),
        "distinct_tokens_written": final - cached + prefilled,
        "computed_per_sample_with_cache": {str(capacity): round(computed_with_cache(layouts, capacity), 1)
                                           for capacity in args.kv_cache_tokens},  # fmt: skip
        "computed_per_sample_with_cache_lookahead": {
            str(size): {str(capacity): round(computed_with_cache(in_isps_order(layouts, size), capacity), 1)
                        for capacity in args.kv_cache_tokens}
            for size in args.lookahead
        },  # fmt: skip
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=Path, required=True, help="2wiki_passages.json")
    parser.add_argument("--tokenizer", type=Path, required=True, help="the Llama 3 tokenizer's folder")
    parser.add_argument("--layout", nargs="+", choices=list(TECHNIQUES), default=["refreshed-heads"], dest="layouts")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--markers", type=int, nargs=4, default=LLAMA3_MARKERS, metavar=("SSEP", "PDEP", "PAD", "HSEP"),
                        help="the server's marker ids (default: minipic serve's for the Llama 3 tokenizer)")
    parser.add_argument("--kv-cache-tokens", type=int, nargs="*", default=[], metavar="TOKENS",
                        help="KV cache sizes to replay the run over (the served runs log theirs: 460592 on the "
                             "H100, 917472 on the H200)")  # fmt: skip
    parser.add_argument("--lookahead", type=int, nargs="*", default=[], metavar="JOBS",
                        help="also replay each cache size in `scheduler.LookAhead`'s order over that many jobs")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    _, _, by_tokens = table1_requests(json.loads(args.passages.read_bytes()), args.samples, [1])
    rows = {name: asyncio.run(count(name, args, by_tokens[1])) for name in args.layouts}
    for name, row in rows.items():
        print(name, row)
    result = {"provenance": provenance(), "samples": args.samples, "block_size": args.block_size, "layouts": rows}
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
