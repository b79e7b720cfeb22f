"""The block rule in tensor form: per-step block records and attention masks.

The rule itself (block kinds, spans, hidden heads, visibility) is stated once, in scalar
form, in `minipic_protocol.blocks`; these are its tensor forms for the per-step recorder
and the attention kernels (graph-safe, no host sync), tested equal to the scalar ones;
`requests_with_hidden` is the kernels' per-request switch for the hidden-block mask;
`requests_with_masks`, `compactable_requests` and, under a span bias,
`requests_weighing_span_keys` route prefill requests between kernels.
"""

from __future__ import annotations

import torch

from minipic_protocol.blocks import OUTSIDE_SPANS, BlockKind, marker_kinds


def block_kinds_of_tokens(
    token_ids: torch.Tensor, ssep_token_id: int, pdep_token_id: int, hsep_token_id: int | None
) -> torch.Tensor:
    """`minipic_protocol.block_kind_of` for every token at once, as int8."""
    kinds = torch.zeros_like(token_ids, dtype=torch.int8)
    for token, kind in marker_kinds(ssep_token_id, pdep_token_id, hsep_token_id).items():
        kinds = kinds.masked_fill(token_ids == token, int(kind))
    return kinds


def visible(
    query_pos: torch.Tensor, window_start: torch.Tensor, key_pos: torch.Tensor, key_hidden: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """`minipic_protocol.visible` on broadcast tensors: causal, inside the window, and not
    hidden unless the key's block opens the query's own span."""
    own_head = key_pos - key_pos % block_size == window_start
    return (key_pos <= query_pos) & (key_pos >= window_start) & ((key_hidden == 0) | own_head)


def weighed_by_span_bias(query_window: torch.Tensor, key_window: torch.Tensor) -> torch.Tensor:
    """`minipic_protocol.weighed_by_span_bias` on broadcast tensors: a key inside a span read
    from outside every span."""
    return (query_window == OUTSIDE_SPANS) & (key_window != OUTSIDE_SPANS)


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
        index a query in that block may attend to, `OUTSIDE_SPANS` outside every span.
    """
    kinds = block_kind[block_table.long()]
    num_blocks = block_table.shape[1]
    logical = torch.arange(num_blocks, device=block_table.device, dtype=torch.int32)
    marker_at = torch.where(kinds != BlockKind.PLAIN, logical, torch.full_like(logical, -1))
    latest_marker = torch.cummax(marker_at, dim=1).values
    latest_kind = torch.gather(kinds, 1, latest_marker.clamp(min=0).long())
    is_span = (latest_marker >= 0) & ((latest_kind == BlockKind.SSEP) | (latest_kind == BlockKind.HSEP))
    return torch.where(is_span, latest_marker * block_size, torch.full_like(latest_marker, OUTSIDE_SPANS)).to(
        torch.int32
    )


def hidden_per_block(block_table: torch.Tensor, block_kind: torch.Tensor) -> torch.Tensor:
    """``(num_reqs, max_blocks)`` bool: is each logical block a hidden (HSep) block?"""
    return block_kind[block_table.long()] == BlockKind.HSEP


def requests_with_hidden(hidden: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> torch.Tensor:
    """``(num_reqs,)`` int8, 1 where a hidden block (``hidden``: `hidden_per_block`) lies among
    the request's keys: the kernels' per-request flag, made once per step (graph-safe), that
    turns the hidden-block mask on (a request without one loads no block kinds)."""
    cols = torch.arange(hidden.shape[1], device=hidden.device)
    in_range = cols[None, :] * block_size < seq_lens[:, None]
    return (hidden & in_range).any(dim=1).to(torch.int8)


def _query_blocks(
    num_blocks: int, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_size: int
) -> torch.Tensor:
    """``(num_reqs, num_blocks)`` bool: the logical blocks holding a request's query rows."""
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    first = (seq_lens - q_lens) // block_size
    last = (seq_lens - 1) // block_size
    cols = torch.arange(num_blocks, device=seq_lens.device)
    return (cols[None, :] >= first[:, None]) & (cols[None, :] <= last[:, None])


def requests_with_masks(
    window_starts: torch.Tensor,
    hidden: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """``(num_reqs,)`` bool: does any query row of the request see less than a causal kernel gives it?

    A row with a window start above 0 skips the keys before its span. A row outside every
    span skips every hidden block before it. A span row at window start 0 skips nothing:
    the only hidden block it can follow is its own head (another HSep block would open a
    later span). A request with neither kind of row needs no mask support (a stock causal
    kernel computes it).
    """
    rows = _query_blocks(window_starts.shape[1], query_start_loc, seq_lens, block_size)
    hidden_before = torch.cummax(hidden.to(torch.int8), dim=1).values > 0
    masked = (window_starts > 0) | ((window_starts < 0) & hidden_before)
    return (masked & rows).any(dim=1)


def compactable_requests(
    window_starts: torch.Tensor,
    hidden: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """``(num_reqs,)`` bool: masked requests (`requests_with_masks`) whose query rows all lie
    outside every span.

    Such rows all see the same keys: causal, less every hidden block, and every hidden
    block lies before the first row (an HSep block among the rows would make them span
    rows). A stock causal kernel over the keys with the hidden blocks left out is
    therefore exact for them (a refreshed-heads final prompt: its question after cached
    HSep spans).
    """
    in_span = requests_with_span_rows(window_starts, query_start_loc, seq_lens, block_size)
    return requests_with_masks(window_starts, hidden, query_start_loc, seq_lens, block_size) & ~in_span


def requests_weighing_span_keys(
    window_starts: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_size: int
) -> torch.Tensor:
    """``(num_reqs,)`` bool: does a query row outside every span follow a span block? Under a
    span bias that row weighs the span's keys (`weighed_by_span_bias`), which a stock causal
    kernel cannot; a span prefill (its rows in its span, or before it) does not."""
    rows = _query_blocks(window_starts.shape[1], query_start_loc, seq_lens, block_size)
    in_span = window_starts != OUTSIDE_SPANS
    span_before = torch.cummax(in_span.to(torch.int8), dim=1).values > 0
    return (rows & ~in_span & span_before).any(dim=1)


def requests_with_span_rows(
    window_starts: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_size: int
) -> torch.Tensor:
    """``(num_reqs,)`` bool: does a query row of the request lie in a span?"""
    rows = _query_blocks(window_starts.shape[1], query_start_loc, seq_lens, block_size)
    return ((window_starts >= 0) & rows).any(dim=1)
