"""What every attention layer of a step reads from the block records, derived once per step.

The block rule's tensor forms (`block_kinds`, `block_origins`) are a few dozen small torch
operations; on the GPU each costs a launch, and an eager step (any step with prefill: vLLM
runs attention outside its CUDA graphs there) paid about 2 ms of host time for them at
every step (`benchmarks/attention_kernel.py`, section ``dispatch``). `derive_step_tensors`
computes the same tensors in one Triton launch; `derive_step_tensors_reference` composes
the tensor forms (the CPU backend's path, and the definition the kernel is tested equal to).

Per request the kernel walks its block-table row in chunks, carrying the latest marker
block and whether a hidden block was seen (the two running maxima behind window starts and
hidden-before), then, for a compactable request only, a second walk numbering the blocks
it keeps (`compactable_requests`).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from minipic_kernels.block_kinds import (
    compactable_requests,
    hidden_per_block,
    requests_with_hidden,
    requests_with_masks,
    window_starts_per_block,
)
from minipic_kernels.block_origins import misplaced_requests
from minipic_protocol.blocks import OUTSIDE_SPANS, BlockKind

__all__ = ["StepTensors", "derive_step_tensors", "derive_step_tensors_reference"]

# Rows of `StepTensors.flags`.
MOVED, HIDDEN, MASKED, COMPACTABLE = range(4)
# Logical blocks per chunk of the kernel's walk (a row of a long prompt's table takes a few).
_CHUNK = 256
# The block rule's values, as the kernel reads them.
_SSEP = tl.constexpr(int(BlockKind.SSEP))
_HSEP = tl.constexpr(int(BlockKind.HSEP))
_OUTSIDE_SPANS = tl.constexpr(OUTSIDE_SPANS)


def _flag_row(row: int, doc: str) -> property:
    """`StepTensors.flags` row ``row``: one int8 per request."""
    return property(lambda self: self.flags[row], doc=doc)


@dataclasses.dataclass(frozen=True)
class StepTensors:
    """Per step, from the block records and the step's tables and lengths (all on the device).

    ``flags`` is one ``(4, num_reqs)`` int8 tensor (`flag_rows`) so that routing reads it in one copy.
    """

    window_starts: torch.Tensor  # (num_reqs, max_blocks) int32, `window_starts_per_block`
    flags: torch.Tensor  # (4, num_reqs) int8: rows MOVED, HIDDEN, MASKED, COMPACTABLE
    kept_len: torch.Tensor  # (num_reqs,) int32: the length less the hidden blocks a compactable request skips
    kept_rank: torch.Tensor  # (num_reqs, max_blocks) int32: each kept block's place among them, -1: not kept

    moved = _flag_row(MOVED, "int8 per request: reads a block away from its origin (`misplaced_requests`).")
    hidden = _flag_row(HIDDEN, "int8 per request: a hidden block among its keys (`requests_with_hidden`).")
    masked = _flag_row(MASKED, "int8 per request: a row sees less than causal (`requests_with_masks`).")
    compactable = _flag_row(COMPACTABLE, "int8 per request: masked only by hidden blocks before its rows "
                            "(`compactable_requests`).")


def derive_step_tensors_reference(
    block_table: torch.Tensor,
    block_kind: torch.Tensor,
    block_origin: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
) -> StepTensors:
    """The step's tensors from the block rule's tensor forms (any device)."""
    window_starts = window_starts_per_block(block_table, block_kind, block_size)
    hidden_blocks = hidden_per_block(block_table, block_kind)
    mask_inputs = (window_starts, hidden_blocks, query_start_loc, seq_lens, block_size)
    compactable = compactable_requests(*mask_inputs)
    flags = flag_rows(block_table.shape[0], block_table.device)
    flags[MOVED] = misplaced_requests(block_table, block_origin, seq_lens, block_size)
    flags[HIDDEN] = requests_with_hidden(hidden_blocks, seq_lens, block_size)
    flags[MASKED] = requests_with_masks(*mask_inputs)
    flags[COMPACTABLE] = compactable
    cols = torch.arange(block_table.shape[1], device=block_table.device)
    in_request = cols[None, :] * block_size < seq_lens[:, None]
    kept = in_request & ~(hidden_blocks & compactable[:, None])
    kept_rank = torch.where(kept, torch.cumsum(kept, dim=1) - 1, -1).to(torch.int32)
    kept_len = (seq_lens - block_size * (in_request & ~kept).sum(dim=1)).to(torch.int32)
    return StepTensors(window_starts, flags, kept_len, kept_rank)


def flag_rows(num_reqs: int, device: torch.device) -> torch.Tensor:
    """An empty ``(4, num_reqs)`` int8 view whose rows start 16 bytes apart at least: kernels
    reading a row (``moved``, ``hidden``) see the same pointer alignment whatever the
    batch size, so its size never makes Triton compile them anew."""
    return torch.empty(4, -(-max(num_reqs, 1) // 16) * 16, dtype=torch.int8, device=device)[:, :num_reqs]


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit(do_not_specialize=["num_blocks", "stride_flags", "stride_btr"])
def _derive_step_kernel(
    window_starts_ptr, flags_ptr, kept_len_ptr, kept_rank_ptr,
    block_table_ptr, block_kind_ptr, block_origin_ptr, query_start_loc_ptr, seq_lens_ptr,
    num_blocks, stride_flags, stride_btr, stride_btb,
    KV_BLOCK_SIZE: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Program r: request r's row of every output (`derive_step_tensors_reference`)."""
    req = tl.program_id(0)
    seq_len = tl.load(seq_lens_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - tl.load(query_start_loc_ptr + req)
    first_row_block = (seq_len - q_len) // KV_BLOCK_SIZE
    last_row_block = tl.where(seq_len > 0, (seq_len - 1) // KV_BLOCK_SIZE, -1)
    row_ptr = block_table_ptr + req.to(tl.int64) * stride_btr
    out_row = req.to(tl.int64) * num_blocks
    latest = tl.full((), -1, tl.int32)  # the latest marker block so far, as index * 4 + kind
    hidden_seen = tl.full((), 0, tl.int32)
    moved = tl.full((), 0, tl.int32)
    hidden = tl.full((), 0, tl.int32)
    hidden_in_request = tl.full((), 0, tl.int32)
    masked = tl.full((), 0, tl.int32)
    span_rows = tl.full((), 0, tl.int32)
    for start in range(0, num_blocks, CHUNK):
        blk = start + tl.arange(0, CHUNK)
        valid = blk < num_blocks
        phys = tl.load(row_ptr + blk * stride_btb, mask=valid, other=0).to(tl.int64)
        kind = tl.load(block_kind_ptr + phys, mask=valid, other=0).to(tl.int32)
        origin = tl.load(block_origin_ptr + phys, mask=valid, other=0)
        in_request = valid & (blk * KV_BLOCK_SIZE < seq_len)
        marker = tl.where(valid & (kind != 0), blk * 4 + kind, -1)
        marker = tl.maximum(tl.associative_scan(marker, 0, _max), latest)
        latest = tl.maximum(latest, tl.max(marker, 0))
        marker_kind = marker & 3
        in_span = (marker >= 0) & ((marker_kind == _SSEP) | (marker_kind == _HSEP))
        window = tl.where(in_span, (marker >> 2) * KV_BLOCK_SIZE, _OUTSIDE_SPANS)
        tl.store(window_starts_ptr + out_row + blk, window, mask=valid)
        is_hidden = (valid & (kind == _HSEP)).to(tl.int32)
        hidden_before = tl.maximum(tl.associative_scan(is_hidden, 0, _max), hidden_seen) > 0
        hidden_seen = tl.maximum(hidden_seen, tl.max(is_hidden, 0))
        rows = valid & (blk >= first_row_block) & (blk <= last_row_block)
        moved = tl.maximum(moved, tl.max((in_request & (origin != blk)).to(tl.int32), 0))
        hidden = tl.maximum(hidden, tl.max((in_request & (is_hidden > 0)).to(tl.int32), 0))
        hidden_in_request += tl.sum((in_request & (is_hidden > 0)).to(tl.int32), 0)
        row_masked = (window > 0) | ((window < 0) & hidden_before)
        masked = tl.maximum(masked, tl.max((rows & row_masked).to(tl.int32), 0))
        span_rows = tl.maximum(span_rows, tl.max((rows & (window >= 0)).to(tl.int32), 0))
    compactable = masked * (1 - span_rows)
    tl.store(flags_ptr + 0 * stride_flags + req, moved.to(tl.int8))
    tl.store(flags_ptr + 1 * stride_flags + req, hidden.to(tl.int8))
    tl.store(flags_ptr + 2 * stride_flags + req, masked.to(tl.int8))
    tl.store(flags_ptr + 3 * stride_flags + req, compactable.to(tl.int8))
    tl.store(kept_len_ptr + req, seq_len - KV_BLOCK_SIZE * hidden_in_request * compactable)
    kept_so_far = tl.full((), 0, tl.int32)
    for start in range(0, num_blocks, CHUNK):
        blk = start + tl.arange(0, CHUNK)
        valid = blk < num_blocks
        kept = valid & (blk * KV_BLOCK_SIZE < seq_len)
        if compactable > 0:  # a second look at the kinds, for this rare request only
            phys = tl.load(row_ptr + blk * stride_btb, mask=valid, other=0).to(tl.int64)
            kind = tl.load(block_kind_ptr + phys, mask=valid, other=0).to(tl.int32)
            kept = kept & (kind != _HSEP)
        count = tl.cumsum(kept.to(tl.int32), 0)
        tl.store(kept_rank_ptr + out_row + blk, tl.where(kept, kept_so_far + count - 1, -1), mask=valid)
        kept_so_far += tl.sum(kept.to(tl.int32), 0)


def derive_step_tensors(
    block_table: torch.Tensor,
    block_kind: torch.Tensor,
    block_origin: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
) -> StepTensors:
    """`derive_step_tensors_reference` in one launch, no host sync (graph-safe)."""
    num_reqs, num_blocks = block_table.shape
    device = block_table.device
    window_starts = torch.empty(num_reqs, num_blocks, dtype=torch.int32, device=device)
    kept_rank = torch.empty(num_reqs, num_blocks, dtype=torch.int32, device=device)
    flags = flag_rows(num_reqs, device)
    kept_len = torch.empty(num_reqs, dtype=torch.int32, device=device)
    if num_reqs:
        _derive_step_kernel[(num_reqs,)](
            window_starts, flags, kept_len, kept_rank, block_table, block_kind, block_origin, query_start_loc,
            seq_lens, num_blocks, flags.stride(0), *block_table.stride(), KV_BLOCK_SIZE=block_size, CHUNK=_CHUNK,
            num_warps=4,
        )  # fmt: skip
    return StepTensors(window_starts, flags, kept_len, kept_rank)
