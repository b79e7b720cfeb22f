"""The per-physical-block record that turns block hashing rules into attention windows.

Each physical KV block remembers what its first token was when it was written:
SSep (the block starts an independent span), PDep (the block depends on the whole
prompt before it) or neither. A query row attends from the start of the latest
SSep block at or before its own block, or from 0 when the latest marker block is
PDep or there is none. That is exactly the token range the block hashes cover, so
a cached block never holds keys computed from context its hash does not name.
"""

from __future__ import annotations

import enum

import torch


class BlockKind(enum.IntEnum):
    """Values stored in the per-block record (int8)."""

    PLAIN = 0
    SSEP = 1
    PDEP = 2


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
