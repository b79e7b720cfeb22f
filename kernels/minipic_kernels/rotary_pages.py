"""Copy requests' keys into scratch pages, each block moved to where it is read.

FlashAttention reads keys as they are. A request whose blocks all sit at their origin
(`block_origins`) hands it the cache itself; a request reading a cached span elsewhere, or
skipping keys before its read rows (`StepTensors.compactable`), gets this pre-pass first: the
keys it keeps (`step_tensors.kept_slots`), each rotated by its block's key shift, and their
values, token by token into pages laid out like vLLM's paged cache,
``(pages, block_size, num_kv_heads, head_size)``: a request's pages are contiguous and hold
its kept tokens in index order (`attention.Scratch`; one page table for K and V, as
FlashAttention takes). In the compact reading a compactable request's read rows sit
``row_shift`` positions past their compact positions (the tile kernel rotates them back in
registers); FlashAttention takes queries as they are, so its keys are rotated that much
further instead: scores depend on positions' differences alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minipic_kernels.step_tensors import _kept_slots
from minipic_kernels.triton_attention import _load_rows, _pow2, _rotary_lanes, _rotated_keys

__all__ = ["page_table", "rotate_into_pages"]


@triton.jit(do_not_specialize=["stride_btr", "stride_ksr", "stride_kpr"])
def _rotate_into_pages_kernel(
    k_out_ptr, v_out_ptr, k_ptr, v_ptr, block_table_ptr, key_shift_ptr, seq_lens_ptr, page_start_ptr,
    kept_start_ptr, compactable_ptr, unread_head_ptr, unread_tail_ptr, row_shift_ptr, cos_sin_ptr,
    stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btr, stride_btb, stride_ksr, stride_ksb, stride_kpr, stride_kpb, stride_cs,
    NUM_KV_HEADS: tl.constexpr, HEAD: tl.constexpr, HEAD_P: tl.constexpr, ROT_HALF: tl.constexpr,
    IS_NEOX: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
    # the compact reading: a compactable request keeps only its blocks' read slots, keys move further by its row shift
    COMPACT: tl.constexpr,
):  # fmt: skip
    """Program (request, logical block, kv head): that block's kept keys rotated by its key shift
    (plus, in the compact reading, its request's row shift), and their values, to the request's
    pages from token ``kept_start`` on (none for a request without pages, a block keeping nothing
    or past the request's length)."""
    req = tl.program_id(0)
    blk = tl.program_id(1)
    head = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    first_page = tl.load(page_start_ptr + req)
    in_request = (blk * KV_BLOCK_SIZE < seq_len) & (first_page >= 0)
    kept_start = tl.load(kept_start_ptr + req * stride_kpr + blk * stride_kpb, mask=in_request, other=-1)
    if kept_start < 0:
        return
    bt_row_ptr = block_table_ptr + req * stride_btr
    phys = tl.load(bt_row_ptr + blk * stride_btb).to(tl.int64)
    compacted = tl.load(compactable_ptr + req).to(tl.int32) * COMPACT != 0
    lo, hi = _kept_slots(phys, True, tl.minimum(seq_len - blk * KV_BLOCK_SIZE, KV_BLOCK_SIZE), compacted,
                         unread_head_ptr, unread_tail_ptr, KV_BLOCK_SIZE)  # fmt: skip
    offs_s = tl.arange(0, KV_BLOCK_SIZE)
    kept = (offs_s >= lo) & (offs_s < hi)
    offs_d = tl.arange(0, HEAD_P)
    d_ok = offs_d < HEAD
    k_rows = k_ptr + phys * stride_kb + offs_s * stride_ks + head * stride_kh
    v_rows = v_ptr + phys * stride_vb + offs_s * stride_vs + head * stride_vh
    token = first_page.to(tl.int64) * KV_BLOCK_SIZE + kept_start + offs_s - lo
    out = (token * (NUM_KV_HEADS * HEAD) + head * HEAD)[:, None] + offs_d[None, :]
    ok = kept[:, None] & d_ok[None, :]
    k = _load_rows(k_rows, offs_d, stride_kd, kept, d_ok)
    if ROT_HALF > 0:
        column, partner, sign, rotates = _rotary_lanes(HEAD_P, ROT_HALF, IS_NEOX)
        shift = tl.load(key_shift_ptr + req * stride_ksr + blk * stride_ksb) + tl.zeros([1], tl.int32)
        if COMPACT:
            shift += tl.load(row_shift_ptr + req)
        k = _rotated_keys(k, k_rows, stride_kd, kept, shift, cos_sin_ptr, stride_cs, column, partner, sign, rotates,
                          HEAD_P, ROT_HALF, 1, KV_BLOCK_SIZE)  # fmt: skip
    tl.store(k_out_ptr + out, k, mask=ok)
    tl.store(v_out_ptr + out, _load_rows(v_rows, offs_d, stride_vd, kept, d_ok), mask=ok)


def rotate_into_pages(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    key_shift: torch.Tensor,
    seq_lens: torch.Tensor,
    page_start: torch.Tensor,
    kept_start: torch.Tensor,
    compactable: torch.Tensor,
    cos_sin: torch.Tensor,
    rotary_dim: int,
    is_neox: bool,
    *,
    num_pages: int,
    max_pages: int,
    unread: tuple[torch.Tensor, torch.Tensor] | None = None,
    row_shift: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Moved keys and copied values of every kept token of the requests with pages.

    Request ``r``'s kept slots of logical block ``b`` (`step_tensors.kept_slots`: from
    ``compactable``, int8 per request, and in the compact reading the ``unread`` records), each
    key rotated by ``key_shift[r, b]`` plus, in the compact reading, ``row_shift[r]`` (int32 per
    request, given with ``unread``: the compact shift of a compactable request's read rows, which
    reach the stock kernel as the model rotated them), go to
    consecutive scratch tokens from
    ``page_start[r] * block_size + kept_start[r, b]`` on (int32), none where either is -1.
    ``num_pages`` (total) and ``max_pages`` (at least the logical blocks of any request with pages)
    are host ints the caller knows from its plan: no host sync. Tokens past a request's kept ones
    are left unwritten. Returns ``(key_pages, value_pages)``.
    """
    _, block_size, num_kv_heads, head_size = key_cache.shape
    shape = (num_pages, block_size, num_kv_heads, head_size)
    k_out = torch.empty(shape, dtype=key_cache.dtype, device=key_cache.device)
    v_out = torch.empty(shape, dtype=value_cache.dtype, device=value_cache.device)
    num_reqs = seq_lens.shape[0]
    if num_pages == 0 or num_reqs == 0 or max_pages == 0:
        return k_out, v_out
    if (unread is None) != (row_shift is None):
        raise ValueError("rotate_into_pages: unread and row_shift are given together (the compact reading)")
    # Read only in the compact reading.
    head, tail, row_shift = (*unread, row_shift) if unread is not None else (seq_lens, seq_lens, seq_lens)
    _rotate_into_pages_kernel[(num_reqs, max_pages, num_kv_heads)](
        k_out, v_out, key_cache, value_cache, block_table, key_shift, seq_lens, page_start, kept_start, compactable,
        head, tail, row_shift, cos_sin, *key_cache.stride(), *value_cache.stride(), *block_table.stride(),
        *key_shift.stride(), *kept_start.stride(), cos_sin.stride(0),
        NUM_KV_HEADS=num_kv_heads, HEAD=head_size, HEAD_P=_pow2(head_size), ROT_HALF=rotary_dim // 2,
        IS_NEOX=bool(is_neox), KV_BLOCK_SIZE=block_size, COMPACT=unread is not None, num_warps=2,
    )  # fmt: skip
    return k_out, v_out


def page_table(page_start: torch.Tensor, max_pages: int) -> torch.Tensor:
    """``(num_reqs, max_pages)`` int32 page ids of each request's scratch pages (0 for none)."""
    cols = torch.arange(max_pages, dtype=torch.int32, device=page_start.device)
    return (page_start.clamp(min=0)[:, None] + cols[None, :]).to(torch.int32)
