"""Where each physical KV block's keys are stored, and how far a request moves it.

Keys are cached as the model rotated them at a logical block index that the block's hash
determines, its *origin*: where the block was computed for every block outside a span (as in
stock vLLM), its offset in its span for a span block (`minipic_server.block_plan`; the cache
write rotates a span computed elsewhere back to it). A request that reads a block at its
origin (plain prompts, prefix hits, its own earlier chunks, span prefills) uses the keys as
they are, so a stock kernel can read the cache directly. A cached span placed after a
different prefix is *misplaced*: its keys are rotated by the shift ``(b - origin) * block_size``
when attended.
"""

from __future__ import annotations

import torch


def key_shifts(block_table: torch.Tensor, block_origin: torch.Tensor, block_size: int) -> torch.Tensor:
    """``(num_reqs, max_blocks)`` int32 positions by which each logical block's keys move.

    Entries past a request's length are meaningless (the table may hold any id there).
    """
    logical = torch.arange(block_table.shape[1], device=block_table.device, dtype=torch.int32)
    origins = block_origin[block_table.long()].to(torch.int32)
    return (logical[None, :] - origins) * block_size


def misplaced_requests(
    block_table: torch.Tensor, block_origin: torch.Tensor, seq_lens: torch.Tensor, block_size: int
) -> torch.Tensor:
    """``(num_reqs,)`` int8, 1 where the request reads a block away from its origin (the
    kernels' per-request flag, made once per step)."""
    shifts = key_shifts(block_table, block_origin, block_size)
    cols = torch.arange(block_table.shape[1], device=block_table.device)
    in_range = cols[None, :] * block_size < seq_lens[:, None]
    return ((shifts != 0) & in_range).any(dim=1).to(torch.int8)
