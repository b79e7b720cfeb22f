"""Rotate a step's keys once into scratch pages, for kernels that take rotated keys.

FlashAttention (and the tile kernel with rotation compiled out) read keys that are already
rotated. This pre-pass copies the selected requests' keys, each rotated by the first
position of its block in its request (the cache holds them rotated by their slot in the
block, `kv_write`), and their values into contiguous pages laid out like vLLM's paged cache,
``(pages, block_size, num_kv_heads, head_size)``: request ``r`` owns pages
``page_start[r] ..`` in logical order. Reading a page costs one pass over the keys,
instead of one rotation per query tile that visits them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minipic_kernels.triton_attention import _load_pair, _load_rows, _pow2, _rotate, _store_pair, _table_rows

__all__ = ["page_table", "rotate_into_pages"]


@triton.jit(do_not_specialize=["num_kv_heads", "stride_btr"])
def _rotate_into_pages_kernel(
    k_out_ptr, v_out_ptr, k_ptr, v_ptr, block_table_ptr, seq_lens_ptr, page_start_ptr, cos_sin_ptr,
    num_kv_heads,
    stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btr, stride_btb, stride_cs,
    HEAD: tl.constexpr, HEAD_P: tl.constexpr, ROT_HALF: tl.constexpr, ROT_HALF_P: tl.constexpr,
    IS_NEOX: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
):
    """Program (request, logical block): that block's keys rotated by its first position, and
    its values, into one page."""
    req = tl.program_id(0)
    blk = tl.program_id(1)
    first_page = tl.load(page_start_ptr + req)
    seq_len = tl.load(seq_lens_ptr + req)
    if (first_page < 0) | (blk * KV_BLOCK_SIZE >= seq_len):
        return
    phys = tl.load(block_table_ptr + req * stride_btr + blk * stride_btb).to(tl.int64)
    page = (first_page + blk).to(tl.int64)
    offs_s = tl.arange(0, KV_BLOCK_SIZE)
    pos = blk * KV_BLOCK_SIZE + offs_s
    pos_ok = pos < seq_len
    offs_d = tl.arange(0, HEAD_P)
    d_ok = offs_d < HEAD
    cos, sin = _table_rows(cos_sin_ptr, pos - offs_s, pos_ok, stride_cs, ROT_HALF, ROT_HALF_P)
    for h in range(num_kv_heads):
        k_rows = k_ptr + phys * stride_kb + offs_s * stride_ks + h * stride_kh
        v_rows = v_ptr + phys * stride_vb + offs_s * stride_vs + h * stride_vh
        out_rows = (page * KV_BLOCK_SIZE + offs_s) * (num_kv_heads * HEAD) + h * HEAD
        k = _load_rows(k_rows, offs_d, stride_kd, pos_ok, d_ok)
        k1, k2 = _load_pair(k_rows, stride_kd, pos_ok, KV_BLOCK_SIZE, ROT_HALF, ROT_HALF_P, IS_NEOX)
        r1, r2 = _rotate(k1, k2, cos, sin)
        _store_pair(k_out_ptr + out_rows, r1, r2, 1, pos_ok, ROT_HALF, ROT_HALF_P, IS_NEOX)
        pass_ok = pos_ok[:, None] & (d_ok & (offs_d >= 2 * ROT_HALF))[None, :]
        tl.store(k_out_ptr + out_rows[:, None] + offs_d[None, :], k, mask=pass_ok)
        v = _load_rows(v_rows, offs_d, stride_vd, pos_ok, d_ok)
        tl.store(v_out_ptr + out_rows[:, None] + offs_d[None, :], v, mask=pos_ok[:, None] & d_ok[None, :])


def rotate_into_pages(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    page_start: torch.Tensor,
    cos_sin: torch.Tensor,
    rotary_dim: int,
    is_neox: bool,
    *,
    num_pages: int,
    max_pages: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated keys and copied values of every request with ``page_start[r] >= 0``.

    ``num_pages`` (total) and ``max_pages`` (most pages of one request) are host ints
    the caller knows from its plan: no host sync. Positions past a request's length
    are left unwritten. Returns ``(key_pages, value_pages)``.
    """
    _, block_size, num_kv_heads, head_size = key_cache.shape
    shape = (num_pages, block_size, num_kv_heads, head_size)
    k_out = torch.empty(shape, dtype=key_cache.dtype, device=key_cache.device)
    v_out = torch.empty(shape, dtype=value_cache.dtype, device=value_cache.device)
    num_reqs = seq_lens.shape[0]
    if num_pages == 0 or num_reqs == 0 or max_pages == 0:
        return k_out, v_out
    rot_half = rotary_dim // 2
    _rotate_into_pages_kernel[(num_reqs, max_pages)](
        k_out, v_out, key_cache, value_cache, block_table, seq_lens, page_start, cos_sin,
        num_kv_heads, *key_cache.stride(), *value_cache.stride(), *block_table.stride(),
        cos_sin.stride(0),
        HEAD=head_size, HEAD_P=_pow2(head_size), ROT_HALF=rot_half, ROT_HALF_P=_pow2(rot_half, 16),
        IS_NEOX=bool(is_neox), KV_BLOCK_SIZE=block_size, num_warps=4,
    )  # fmt: skip
    return k_out, v_out


def page_table(page_start: torch.Tensor, max_pages: int) -> torch.Tensor:
    """``(num_reqs, max_pages)`` int32 page ids of each request's scratch pages (0 for none)."""
    cols = torch.arange(max_pages, dtype=torch.int32, device=page_start.device)
    return (page_start.clamp(min=0)[:, None] + cols[None, :]).to(torch.int32)
