"""The SSep/PDep rule, defined once: which blocks are spans, for hashing and for attention.

A block's kind is set by its first token: SSep (the block starts an independent
span), PDep (the block depends on the whole prompt before it) or neither
(`block_kind_of`). A span runs from an SSep block up to the next marker block
(`in_span`). A block in a span hashes from the span's start and its tokens attend
from there; any other block hashes over, and attends to, everything before it.
So a cached block never holds keys computed from context its hash does not name.

The block hasher, the metrics and the test fixtures apply the rule block by block
(`window_starts_of_prompt` for a whole prompt); the per-step recorder and the
attention kernels apply it in tensor form (`block_kinds_of_tokens`,
`window_starts_per_block`), tested equal to the scalar form.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import torch


class BlockKind(enum.IntEnum):
    """Values stored in the per-block record (int8)."""

    PLAIN = 0
    SSEP = 1
    PDEP = 2


def marker_kinds(ssep_token_id: int, pdep_token_id: int) -> dict[int, BlockKind]:
    """The tokens that give a block a kind when they are its first (prompt) token."""
    return {ssep_token_id: BlockKind.SSEP, pdep_token_id: BlockKind.PDEP}


def block_kind_of(first_token: int, ssep_token_id: int, pdep_token_id: int) -> BlockKind:
    """The kind a block takes from its first token (`marker_kinds` spelled out: this runs for
    every block of every prompt, in the hasher and the metrics)."""
    if first_token == ssep_token_id:
        return BlockKind.SSEP
    if first_token == pdep_token_id:
        return BlockKind.PDEP
    return BlockKind.PLAIN


def block_kinds_of_tokens(token_ids: torch.Tensor, ssep_token_id: int, pdep_token_id: int) -> torch.Tensor:
    """`block_kind_of` for every token at once, as int8 (graph-safe: no host sync)."""
    kinds = torch.zeros_like(token_ids, dtype=torch.int8)
    for token, kind in marker_kinds(ssep_token_id, pdep_token_id).items():
        kinds = kinds.masked_fill(token_ids == token, int(kind))
    return kinds


def in_span(kind: BlockKind, previous_in_span: bool) -> bool:
    """Whether a block of `kind` is in a span: SSep opens one, PDep closes it, and a plain
    block continues what the block before it was."""
    return previous_in_span if kind is BlockKind.PLAIN else kind is BlockKind.SSEP


def window_starts_of_prompt(
    token_ids: Sequence[int], block_size: int, ssep_token_id: int, pdep_token_id: int
) -> list[int]:
    """The first position each token of a prompt may attend to, by the rule applied block by block."""
    starts: list[int] = []
    spanning, span_start = False, 0
    for block_start in range(0, len(token_ids), block_size):
        kind = block_kind_of(token_ids[block_start], ssep_token_id, pdep_token_id)
        spanning = in_span(kind, spanning)
        span_start = block_start if kind is BlockKind.SSEP else span_start
        starts += [span_start if spanning else 0] * len(token_ids[block_start : block_start + block_size])
    return starts


def window_starts_per_block(
    block_table: torch.Tensor, block_kind: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Window start (token index) of every logical block of every request.

    Args:
        block_table: ``(num_reqs, max_blocks)`` physical block ids (int32/int64).
            Entries past a request's length may hold anything in range.
        block_kind: ``(num_physical_blocks,)`` int8 record of `BlockKind` values.
        block_size: tokens per block.

    Returns:
        ``(num_reqs, max_blocks)`` int32: for logical block ``b`` the first token
        index a query in that block may attend to.
    """
    kinds = block_kind[block_table.long()]
    num_blocks = block_table.shape[1]
    logical = torch.arange(num_blocks, device=block_table.device, dtype=torch.int32)
    marker_at = torch.where(kinds != BlockKind.PLAIN, logical, torch.full_like(logical, -1))
    latest_marker = torch.cummax(marker_at, dim=1).values
    latest_kind = torch.gather(kinds, 1, latest_marker.clamp(min=0).long())
    is_span = (latest_marker >= 0) & (latest_kind == BlockKind.SSEP)
    return torch.where(is_span, latest_marker * block_size, torch.zeros_like(latest_marker)).to(
        torch.int32
    )


def requests_with_windows(
    window_starts: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_size: int
) -> torch.Tensor:
    """``(num_reqs,)`` bool: does any query row of the request have a window start above 0?

    Rows with window start 0 attend causally to everything before them, which a stock
    causal kernel computes; a request with no other rows needs no window support.
    """
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    first = (seq_lens - q_lens) // block_size
    last = (seq_lens - 1) // block_size
    cols = torch.arange(window_starts.shape[1], device=window_starts.device)
    in_range = (cols[None, :] >= first[:, None]) & (cols[None, :] <= last[:, None])
    return ((window_starts > 0) & in_range).any(dim=1)
