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

A block never hashes over less context than its attention window. Generated
tokens never act as markers (the markers are also banned from sampling).
Multimodal requests are refused: their extra keys would need vLLM's own
bookkeeping of which images a block overlaps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minipic_protocol.blocks import BlockKind, in_span, opens_span
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

    # The hash of the last block outside spans: with `span_hashes`, it names every token so far.
    prefix_hash: BlockHash | None = None
    # The hashes of the span blocks after it, in order; each names its block's tokens.
    span_hashes: list[BlockHash] = field(default_factory=list)
    in_span: bool = False  # the last hashed block belongs to a span

    def prefix_through_spans(self, hash_fn: Callable[[Any], bytes]) -> BlockHash | None:
        """The parent of a block outside spans: the last such block's hash, linked once to
        the span blocks' hashes since (the tuple of hashes goes where a block's tokens go)."""
        if self.span_hashes:
            self.prefix_hash = hash_block_tokens(hash_fn, self.prefix_hash, tuple(self.span_hashes), None)
            self.span_hashes = []
        return self.prefix_hash


def _salted(request: Request, start: int, extra_keys: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """vLLM salts only the block at token 0; a detached span root must carry the salt itself."""
    if start == 0 or not request.cache_salt:
        return extra_keys
    return (*(extra_keys or ()), ("cache_salt", request.cache_salt))


def make_pic_block_hasher(
    block_size: int, hash_fn: Callable[[Any], bytes], pic: PicConfig
) -> Callable[[Request], list[BlockHash]]:
    """A drop-in for ``get_request_block_hasher`` that understands the markers."""
    kinds = pic.block_kinds

    def hash_new_full_blocks(request: Request) -> list[BlockHash]:
        if request.mm_features:
            raise MiniPICConfigError("MiniPIC does not support multimodal inputs: send text or token ids")
        state: _ChainState | None = getattr(request, CHAIN_STATE.attribute, None)
        if state is None:
            state = _ChainState()
            patch_instance(CHAIN_STATE, request, state)
        start = len(request.block_hashes) * block_size
        parent = request.block_hashes[-1] if request.block_hashes else None
        new_hashes: list[BlockHash] = []
        num_tokens, num_prompt_tokens = request.num_tokens, request.num_prompt_tokens
        while start + block_size <= num_tokens:
            end = start + block_size
            tokens = request.all_token_ids[start:end]
            extra_keys, _ = generate_block_hash_extra_keys(request, start, end, 0)
            kind = kinds.get(tokens[0], BlockKind.PLAIN) if start < num_prompt_tokens else BlockKind.PLAIN
            state.in_span = in_span(kind, state.in_span)
            if opens_span(kind):
                block_hash = hash_block_tokens(
                    hash_fn, kv_cache_utils.NONE_HASH, tokens, _salted(request, start, extra_keys)
                )
            elif state.in_span:
                block_hash = hash_block_tokens(hash_fn, parent, tokens, extra_keys)
            else:
                block_hash = hash_block_tokens(hash_fn, state.prefix_through_spans(hash_fn), tokens, extra_keys)
                state.prefix_hash = block_hash
            if state.in_span:
                state.span_hashes.append(block_hash)
            new_hashes.append(block_hash)
            parent = block_hash
            start = end
        return new_hashes

    return hash_new_full_blocks
