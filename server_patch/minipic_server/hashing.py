"""Block hashing with SSep, HSep and PDep markers (engine-core process).

vLLM chains every full block's hash on the block before it, so a document only
hits the cache after an identical prefix. Markers change the parent of a block,
by the rule of `minipic_protocol.blocks`:

- an SSep or HSep block (the marker as its first *prompt* token) hashes as if it
  had no parent (plus the request's ``cache_salt``), so the span starting there is
  reusable after any prefix (an HSep block is also hidden from everything outside
  its span, which only removes context: no hash changes for it);
- the other blocks of a span chain on the block before them, so a multi-block
  span stays one unit;
- a block outside any span (a PDep block, or any block before the first SSep)
  hashes over *every* token before it, so a question after detached documents
  only hits when all of them match. Before the first span that is vLLM's own
  unbroken chain; after spans, the chain takes the spans' block hashes (which
  name their tokens) as one link, instead of hashing every span block a second
  time on the unbroken chain: a prompt over k cached documents hashes each of
  its blocks once.

A span's block hashes depend only on the span's own tokens (and the request's
extra keys), so a span seen before is not hashed again: `_SpanRuns` keeps them by
content, and a prompt over k cached documents costs a lookup per document, not a
hash per block. A block never hashes over less context than its attention window.
Generated tokens never act as markers (the markers are also banned from sampling).
Multimodal requests are refused: their extra keys would need vLLM's own
bookkeeping of which images a block overlaps.

A server that reads markers otherwise than by their own embedding rows
(``embed_markers_as``) or reads pads and markers compactly (the default, ``--compact``:
read by no token, no position) computes other KV for the same tokens, so its chains
start from a root of their own naming that reading: no block computed under one
reading is found by a server reading another through a shared CPU offload or KV
connector store. So does a span bias (``--span-bias``). The plain reading (``--no-compact``,
no span bias) keeps vLLM's root (a marker-free prompt hashes as stock).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from minipic_protocol.blocks import BlockKind, in_span, marker_runs, opens_span
from minipic_server.boundary import (
    CHAIN_STATE,
    BlockHash,
    Request,
    generate_block_hash_extra_keys,
    hash_block_tokens,
    kv_cache_utils,
    patch_instance,
)
from minipic_server.config import MiniPICConfigError, PicConfig


@dataclass
class _ChainState:
    """Per-request hashing state carried between hasher calls."""

    root: BlockHash  # the parent of the prompt's first block and of every detached span's
    # The hash of the last block outside spans: with `span_hashes`, it names every token so far.
    prefix_hash: BlockHash
    # The hashes of the span blocks after it, in order; each names its block's tokens.
    span_hashes: list[BlockHash] = field(default_factory=list)
    in_span: bool = False  # the last hashed block belongs to a span

    def prefix_through_spans(self, hash_fn: Callable[[Any], bytes]) -> BlockHash:
        """The parent of a block outside spans: the last such block's hash, linked once to
        the span blocks' hashes since (their digest goes where a block's tokens go). The
        digest is of their bytes joined: a tuple of them would serialize differently when
        two spans are one kept object (`_SpanRuns`) than when they are equal copies."""
        if self.span_hashes:
            digest = hash_fn(b"".join(self.span_hashes))
            self.prefix_hash = hash_block_tokens(hash_fn, self.prefix_hash, (digest,), None)
            self.span_hashes = []
        return self.prefix_hash


# Mixed into the root of a reading other than the plain one (bump it if a reading's KV changes).
_READING = b"minipic reading v1"


def _salted(request: Request, start: int, extra_keys: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """vLLM salts only the block at token 0; a detached span root must carry the salt itself."""
    if start == 0 or not request.cache_salt:
        return extra_keys
    return (*(extra_keys or ()), ("cache_salt", request.cache_salt))


class _SpanRuns:
    """Block hashes of spans by content: a span's tokens, its blocks' extra keys and the
    root it hashes from name its hashes exactly (a dict compares keys in full, so no
    collision can return another span's hashes). Least recently used spans go first once
    more than ``capacity`` blocks are kept (about 220 bytes a block: 14 MB for 65,536)."""

    def __init__(self, capacity: int) -> None:
        self._runs: OrderedDict[tuple[Any, ...], list[BlockHash]] = OrderedDict()
        self._blocks = 0
        self._capacity = capacity

    def hashes(self, key: tuple[Any, ...], compute: Callable[[], list[BlockHash]]) -> list[BlockHash]:
        """The hashes kept under ``key``, else ``compute()``'s, kept."""
        runs = self._runs
        if key in runs:
            runs.move_to_end(key)
            return runs[key]
        hashes = runs[key] = compute()
        self._blocks += len(hashes)
        while self._blocks > self._capacity and len(runs) > 1:
            self._blocks -= len(runs.popitem(last=False)[1])
        return hashes


def make_pic_block_hasher(
    block_size: int, hash_fn: Callable[[Any], bytes], pic: PicConfig, *, span_blocks_kept: int = 1 << 16
) -> Callable[[Request], list[BlockHash]]:
    """A drop-in for ``get_request_block_hasher`` that understands the markers; it keeps the
    hashes of up to ``span_blocks_kept`` span blocks for the next request with those spans."""
    kinds = pic.block_kinds
    span_runs = _SpanRuns(span_blocks_kept)

    # A span bias changes the KV of every block read after a span outside spans (questions, refreshed
    # heads); at 0 it changes nothing and leaves the reading's root as it was.
    reading = (pic.compact, pic.embed_markers_as, *((float(pic.span_bias),) if pic.span_bias else ()))

    def root() -> BlockHash:
        """vLLM's root (set after the hasher is made: read per request), or the server's reading's."""
        none = kv_cache_utils.NONE_HASH
        return none if reading == (False, None) else hash_fn((_READING, *reading, none))

    def extra_keys_of(request: Request, first: int, end: int) -> list[tuple[Any, ...] | None]:
        """vLLM's extra keys of blocks ``first`` to ``end`` (exclusive), as vLLM computes them per
        block. Whatever gives a block extra keys (a LoRA, a multimodal input or prompt embeddings
        overlapping it, the salt at token 0) gives them to a run holding it, so a run with none
        needs one call, not one a block (a 35k-token prompt's blocks took 1.3 ms of 1.9 here)."""
        if generate_block_hash_extra_keys(request, first * block_size, end * block_size, 0)[0] is None:
            return [None] * (end - first)
        return [generate_block_hash_extra_keys(request, b, b + block_size, 0)[0]
                for b in range(first * block_size, end * block_size, block_size)]  # fmt: skip

    def chain(
        request: Request, parent: BlockHash | None, first: int, end: int, extra_keys: list[tuple[Any, ...] | None]
    ) -> list[BlockHash]:
        """Blocks ``first`` to ``end`` (exclusive), each on the one before, the first on ``parent``."""
        hashes = []
        tokens = request.all_token_ids
        for start, keys in zip(range(first * block_size, end * block_size, block_size), extra_keys):
            parent = hash_block_tokens(hash_fn, parent, tokens[start : start + block_size], keys)
            hashes.append(parent)
        return hashes

    def span(request: Request, root: BlockHash, first: int, end: int) -> list[BlockHash]:
        """A span opening at block ``first``, through block ``end``: from the root, salted."""
        start, stop = first * block_size, end * block_size
        extra_keys = extra_keys_of(request, first, end)
        extra_keys[0] = _salted(request, start, extra_keys[0])
        content = array("q", request.all_token_ids[start:stop]).tobytes()
        return span_runs.hashes(
            (root, content, tuple(extra_keys)), lambda: chain(request, root, first, end, extra_keys)
        )

    def hash_new_full_blocks(request: Request) -> list[BlockHash]:
        if request.mm_features:
            raise MiniPICConfigError("MiniPIC does not support multimodal inputs: send text or token ids")
        state: _ChainState | None = getattr(request, CHAIN_STATE.attribute, None)
        if state is None:
            start = root()
            state = _ChainState(root=start, prefix_hash=start)
            patch_instance(CHAIN_STATE, request, state)
        done, full = len(request.block_hashes), request.num_tokens // block_size
        new_hashes: list[BlockHash] = []
        for first, kind, end in _segments(request, done, full, block_size, kinds):
            state.in_span = in_span(kind, state.in_span)
            if opens_span(kind):
                hashes = span(request, state.root, first, end)
            else:
                parent = (
                    (new_hashes or request.block_hashes)[-1] if state.in_span else state.prefix_through_spans(hash_fn)
                )
                hashes = chain(request, parent, first, end, extra_keys_of(request, first, end))
                if not state.in_span:
                    state.prefix_hash = hashes[-1]
            if state.in_span:
                state.span_hashes.extend(hashes)
            new_hashes.extend(hashes)
        return new_hashes

    return hash_new_full_blocks


def _segments(
    request: Request, done: int, full: int, block_size: int, kinds: dict[int, BlockKind]
) -> list[tuple[int, BlockKind, int]]:
    """Blocks ``done`` to ``full`` as ``(first block, kind, end block)`` runs in which every
    block has the first one's spanning state: a run starts at each marker block (only prompt
    tokens are markers), and the blocks before the first marker continue as plain blocks."""
    if full <= done:
        return []
    prompt_blocks = min(full, -(-request.num_prompt_tokens // block_size))
    first_tokens: Sequence[int] = request.all_token_ids[done * block_size : prompt_blocks * block_size : block_size]
    runs = [(done + first, kind, done + end) for first, kind, end in marker_runs(first_tokens, kinds)]
    if runs:
        runs[-1] = (runs[-1][0], runs[-1][1], full)  # generated blocks continue the last run
    head_end = runs[0][0] if runs else full
    return ([(done, BlockKind.PLAIN, head_end)] if head_end > done else []) + runs
