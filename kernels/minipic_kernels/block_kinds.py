"""The marker rule, defined once: which blocks are spans, and which keys each query sees.

A block's kind is set by its first token: SSep (the block starts an independent
span), HSep (the same, and the block is *hidden*), PDep (the block depends on the
whole prompt before it) or neither (`block_kind_of`). A span runs from an SSep or
HSep block up to the next marker block (`in_span`). A block in a span hashes from the
span's start and its tokens attend from there; any other block hashes over, and
attends to, everything before it. A hidden block is attended only by the queries of
its own span: every other query skips its keys (`visible`). Hiding only removes
context, so a cached block still never holds keys computed from context its hash
does not name.

The block hasher, the metrics and the test fixtures apply the rule block by block
(`window_starts_of_prompt`, `hidden_of_prompt` for a whole prompt); the per-step
recorder and the attention kernels apply it in tensor form (`block_kinds_of_tokens`,
`window_starts_per_block`, `hidden_per_block`, `requests_with_hidden`), tested equal to the scalar form.
`visible` is the one visibility predicate, for ints and tensors alike.
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
    HSEP = 3


# The window start of a query outside every span: it attends from position 0, yet is
# told apart from a span opened at block 0, whose hidden head it must not see.
OUTSIDE_SPANS = -1


def marker_kinds(ssep_token_id: int, pdep_token_id: int, hsep_token_id: int | None) -> dict[int, BlockKind]:
    """The tokens that give a block a kind when they are its first (prompt) token
    (``hsep_token_id`` None: a server without hidden heads)."""
    kinds = {ssep_token_id: BlockKind.SSEP, pdep_token_id: BlockKind.PDEP}
    if hsep_token_id is not None:
        kinds[hsep_token_id] = BlockKind.HSEP
    return kinds


def block_kind_of(first_token: int, ssep_token_id: int, pdep_token_id: int, hsep_token_id: int | None) -> BlockKind:
    """The kind a block takes from its first token (`marker_kinds` spelled out: this runs for
    every block of every prompt, in the hasher and the metrics)."""
    if first_token == ssep_token_id:
        return BlockKind.SSEP
    if first_token == pdep_token_id:
        return BlockKind.PDEP
    if first_token == hsep_token_id:
        return BlockKind.HSEP
    return BlockKind.PLAIN


def block_kinds_of_tokens(
    token_ids: torch.Tensor, ssep_token_id: int, pdep_token_id: int, hsep_token_id: int | None
) -> torch.Tensor:
    """`block_kind_of` for every token at once, as int8 (graph-safe: no host sync)."""
    kinds = torch.zeros_like(token_ids, dtype=torch.int8)
    for token, kind in marker_kinds(ssep_token_id, pdep_token_id, hsep_token_id).items():
        kinds = kinds.masked_fill(token_ids == token, int(kind))
    return kinds


def opens_span(kind: BlockKind) -> bool:
    """SSep and HSep blocks start a span (they hash without a parent)."""
    return kind is BlockKind.SSEP or kind is BlockKind.HSEP


def in_span(kind: BlockKind, previous_in_span: bool) -> bool:
    """Whether a block of `kind` is in a span: SSep/HSep open one, PDep closes it, and a plain
    block continues what the block before it was."""
    return previous_in_span if kind is BlockKind.PLAIN else opens_span(kind)


def visible(
    query_pos: int | torch.Tensor,
    window_start: int | torch.Tensor,
    key_pos: int | torch.Tensor,
    key_hidden: bool | torch.Tensor,
    block_size: int,
) -> bool | torch.Tensor:
    """Whether the query at ``query_pos`` (window start ``window_start``) attends the key at
    ``key_pos`` (in a hidden block or not): causal, inside the window, and not hidden unless
    the key's block opens the query's own span. Works on ints and on broadcast tensors."""
    own_head = key_pos - key_pos % block_size == window_start
    return (key_pos <= query_pos) & (key_pos >= window_start) & ((key_hidden == 0) | own_head)


def _kinds_of_prompt(
    token_ids: Sequence[int], block_size: int, ssep_token_id: int, pdep_token_id: int, hsep_token_id: int | None
) -> list[BlockKind]:
    return [
        block_kind_of(token_ids[start], ssep_token_id, pdep_token_id, hsep_token_id)
        for start in range(0, len(token_ids), block_size)
    ]


def window_starts_of_prompt(
    token_ids: Sequence[int], block_size: int, ssep_token_id: int, pdep_token_id: int, hsep_token_id: int | None
) -> list[int]:
    """The window start of each token of a prompt (`OUTSIDE_SPANS` outside every span), by
    the rule applied block by block."""
    starts: list[int] = []
    spanning, span_start = False, 0
    kinds = _kinds_of_prompt(token_ids, block_size, ssep_token_id, pdep_token_id, hsep_token_id)
    for block, kind in enumerate(kinds):
        block_start = block * block_size
        spanning = in_span(kind, spanning)
        span_start = block_start if opens_span(kind) else span_start
        starts += [span_start if spanning else OUTSIDE_SPANS] * len(token_ids[block_start : block_start + block_size])
    return starts


def hidden_of_prompt(
    token_ids: Sequence[int], block_size: int, ssep_token_id: int, pdep_token_id: int, hsep_token_id: int | None
) -> list[bool]:
    """Whether each token of a prompt is a key of a hidden (HSep) block."""
    kinds = _kinds_of_prompt(token_ids, block_size, ssep_token_id, pdep_token_id, hsep_token_id)
    return [kinds[i // block_size] is BlockKind.HSEP for i in range(len(token_ids))]


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
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    first = (seq_lens - q_lens) // block_size
    last = (seq_lens - 1) // block_size
    cols = torch.arange(window_starts.shape[1], device=window_starts.device)
    in_range = (cols[None, :] >= first[:, None]) & (cols[None, :] <= last[:, None])
    hidden_before = torch.cummax(hidden.to(torch.int8), dim=1).values > 0
    masked = (window_starts > 0) | ((window_starts < 0) & hidden_before)
    return (masked & in_range).any(dim=1)
