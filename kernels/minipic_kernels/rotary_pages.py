"""Copy requests' keys into scratch pages, each block moved to where it is read.

FlashAttention reads keys as they are. A request whose blocks all sit at their origin
(`block_origins`) hands it the cache itself; a request reading a cached span elsewhere
gets this pre-pass first: its blocks' keys, each rotated by its block's shift, and its
values, into pages laid out like vLLM's paged cache,
``(pages, block_size, num_kv_heads, head_size)``, each logical block into the page its
request's first page and its rank give it (`attention.Scratch`: a request's pages are
contiguous, in logical order; one page table for K and V, as FlashAttention takes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minipic_kernels.triton_attention import _load_rows, _moved_keys, _pow2, _rotary_lanes

__all__ = ["page_table", "rotate_into_pages"]


@triton.jit(do_not_specialize=["stride_btr", "stride_rkr"])
def _rotate_into_pages_kernel(
    k_out_ptr, v_out_ptr, k_ptr, v_ptr, block_table_ptr, block_origin_ptr, seq_lens_ptr, page_start_ptr,
    block_ranks_ptr, cos_sin_ptr,
    stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btr, stride_btb, stride_rkr, stride_rkb, stride_cs,
    NUM_KV_HEADS: tl.constexpr, HEAD: tl.constexpr, HEAD_P: tl.constexpr, ROT_HALF: tl.constexpr,
    IS_NEOX: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
):
    """Program (request, logical block, kv head): that block's keys rotated by its shift, and
    its values, into its page (none for a request without pages, a block ranked -1 or past
    the request's length)."""
    req = tl.program_id(0)
    blk = tl.program_id(1)
    head = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    first_page = tl.load(page_start_ptr + req)
    in_request = (blk * KV_BLOCK_SIZE < seq_len) & (first_page >= 0)
    rank = tl.load(block_ranks_ptr + req * stride_rkr + blk * stride_rkb, mask=in_request, other=-1)
    if rank < 0:
        return
    page = (first_page + rank).to(tl.int64)
    bt_row_ptr = block_table_ptr + req * stride_btr
    phys = tl.load(bt_row_ptr + blk * stride_btb).to(tl.int64)
    offs_s = tl.arange(0, KV_BLOCK_SIZE)
    pos_ok = blk * KV_BLOCK_SIZE + offs_s < seq_len
    offs_d = tl.arange(0, HEAD_P)
    d_ok = offs_d < HEAD
    k_rows = k_ptr + phys * stride_kb + offs_s * stride_ks + head * stride_kh
    v_rows = v_ptr + phys * stride_vb + offs_s * stride_vs + head * stride_vh
    out = ((page * KV_BLOCK_SIZE + offs_s) * (NUM_KV_HEADS * HEAD) + head * HEAD)[:, None] + offs_d[None, :]
    ok = pos_ok[:, None] & d_ok[None, :]
    k = _load_rows(k_rows, offs_d, stride_kd, pos_ok, d_ok)
    if ROT_HALF > 0:
        column, partner, sign, rotates = _rotary_lanes(HEAD_P, ROT_HALF, IS_NEOX)
        k = _moved_keys(k, k_rows, stride_kd, pos_ok, blk * KV_BLOCK_SIZE, seq_len, bt_row_ptr, stride_btb,
                        block_origin_ptr, cos_sin_ptr, stride_cs, column, partner, sign, rotates, HEAD_P,
                        ROT_HALF, KV_BLOCK_SIZE, KV_BLOCK_SIZE, 1, KV_BLOCK_SIZE)  # fmt: skip
    tl.store(k_out_ptr + out, k, mask=ok)
    tl.store(v_out_ptr + out, _load_rows(v_rows, offs_d, stride_vd, pos_ok, d_ok), mask=ok)


def rotate_into_pages(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    block_origin: torch.Tensor,
    seq_lens: torch.Tensor,
    page_start: torch.Tensor,
    block_ranks: torch.Tensor,
    cos_sin: torch.Tensor,
    rotary_dim: int,
    is_neox: bool,
    *,
    num_pages: int,
    max_pages: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Moved keys and copied values of every logical block with a page.

    Request ``r``'s logical block ``b`` goes to page ``page_start[r] + block_ranks[r, b]``
    (int32), none where either is -1. ``num_pages`` (total) and ``max_pages`` (at least the logical
    blocks of any request with pages) are host ints the caller knows from its plan: no host sync.
    Positions past a request's length are left unwritten. Returns ``(key_pages, value_pages)``.
    """
    _, block_size, num_kv_heads, head_size = key_cache.shape
    shape = (num_pages, block_size, num_kv_heads, head_size)
    k_out = torch.empty(shape, dtype=key_cache.dtype, device=key_cache.device)
    v_out = torch.empty(shape, dtype=value_cache.dtype, device=value_cache.device)
    num_reqs = seq_lens.shape[0]
    if num_pages == 0 or num_reqs == 0 or max_pages == 0:
        return k_out, v_out
    _rotate_into_pages_kernel[(num_reqs, max_pages, num_kv_heads)](
        k_out, v_out, key_cache, value_cache, block_table, block_origin, seq_lens, page_start, block_ranks, cos_sin,
        *key_cache.stride(), *value_cache.stride(), *block_table.stride(), *block_ranks.stride(), cos_sin.stride(0),
        NUM_KV_HEADS=num_kv_heads, HEAD=head_size, HEAD_P=_pow2(head_size), ROT_HALF=rotary_dim // 2,
        IS_NEOX=bool(is_neox), KV_BLOCK_SIZE=block_size, num_warps=2,
    )  # fmt: skip
    return k_out, v_out


def page_table(page_start: torch.Tensor, max_pages: int) -> torch.Tensor:
    """``(num_reqs, max_pages)`` int32 page ids of each request's scratch pages (0 for none)."""
    cols = torch.arange(max_pages, dtype=torch.int32, device=page_start.device)
    return (page_start.clamp(min=0)[:, None] + cols[None, :]).to(torch.int32)
