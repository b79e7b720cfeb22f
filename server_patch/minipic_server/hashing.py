"""Block hashing with SSep and PDep markers (engine-core process).

vLLM chains every full block's hash on the block before it, so a document only
hits the cache after an identical prefix. Markers change the parent of a block:

- SSep as the first *prompt* token of a block: the block hashes as if it had no
  parent (plus the request's ``cache_salt``), so the span starting there is
  reusable after any prefix.
- PDep as the first prompt token: the block hashes over *every* token before it,
  i.e. vLLM's own unbroken chain, so a question after detached documents only
  hits when all of those documents match.
- Any other block chains on the block before it, so a multi-block span stays one
  unit and a block never hashes over less context than its attention window.

Generated tokens never act as markers (the markers are also banned from sampling).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_utils import (
    BlockHash,
    generate_block_hash_extra_keys,
    hash_block_tokens,
)
from vllm.v1.request import Request

from minipic_kernels.block_kinds import BlockKind
from minipic_server.config import PicConfig


@dataclass
class _ChainState:
    """Per-request hashing state carried between hasher calls."""

    prefix_hash: BlockHash | None = None  # vLLM's unbroken chain over all tokens so far
    detached: bool = False  # an SSep block reset the chain and no PDep has rejoined it


_STATE_ATTR = "_minipic_chain_state"


def block_kind_of(request: Request, start: int, pic: PicConfig) -> BlockKind:
    """What the token at ``start`` makes of its block; only prompt tokens count."""
    if start >= request.num_prompt_tokens:
        return BlockKind.PLAIN
    token = request.all_token_ids[start]
    if token == pic.ssep_token_id:
        return BlockKind.SSEP
    if token == pic.pdep_token_id:
        return BlockKind.PDEP
    return BlockKind.PLAIN


def _salted(request: Request, start: int, extra_keys: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """vLLM salts only the block at token 0; a detached span root must carry the salt itself."""
    if start == 0 or not request.cache_salt:
        return extra_keys
    return (*(extra_keys or ()), ("cache_salt", request.cache_salt))


def make_pic_block_hasher(
    block_size: int, hash_fn: Callable[[Any], bytes], pic: PicConfig
) -> Callable[[Request], list[BlockHash]]:
    """A drop-in for ``get_request_block_hasher`` that understands the markers."""

    def hash_new_full_blocks(request: Request) -> list[BlockHash]:
        state: _ChainState = getattr(request, _STATE_ATTR, None) or _ChainState()
        setattr(request, _STATE_ATTR, state)
        start = len(request.block_hashes) * block_size
        parent = request.block_hashes[-1] if request.block_hashes else None
        mm_idx = 0
        new_hashes: list[BlockHash] = []
        while start + block_size <= request.num_tokens:
            end = start + block_size
            tokens = request.all_token_ids[start:end]
            extra_keys, mm_idx = generate_block_hash_extra_keys(request, start, end, mm_idx)
            prefix_hash = hash_block_tokens(hash_fn, state.prefix_hash, tokens, extra_keys)
            kind = block_kind_of(request, start, pic)
            if kind is BlockKind.SSEP:
                block_hash = hash_block_tokens(
                    hash_fn, kv_cache_utils.NONE_HASH, tokens, _salted(request, start, extra_keys)
                )
                state.detached = True
            elif kind is BlockKind.PDEP or not state.detached:
                block_hash = prefix_hash
                state.detached = False
            else:
                block_hash = hash_block_tokens(hash_fn, parent, tokens, extra_keys)
            state.prefix_hash = prefix_hash
            new_hashes.append(block_hash)
            parent = block_hash
            start = end
        return new_hashes

    return hash_new_full_blocks
