"""Write a step's keys and values into the paged cache, keys rotated by their slot in the block.

The GPU form of `minipic_kernels.reference.write_kv_reference`, in one launch (as vLLM's
own cache write): a block's keys then depend on its tokens alone, so the block serves
any request that places it at any block boundary, and attention only adds the rotation
of the block's start (see `triton_attention`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minipic_kernels.triton_attention import _load_pair, _load_rows, _pow2, _rotate, _store_pair, _table_row

__all__ = ["write_kv"]


@triton.jit
def _write_kv_kernel(
    k_cache_ptr, v_cache_ptr, k_ptr, v_ptr, slot_mapping_ptr, cos_sin_ptr,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd, stride_vcb, stride_vcs, stride_vch, stride_vcd,
    stride_cs,
    NUM_KV_HEADS: tl.constexpr, HEADS_P: tl.constexpr, HEAD: tl.constexpr, HEAD_P: tl.constexpr,
    ROT_HALF: tl.constexpr, ROT_HALF_P: tl.constexpr, IS_NEOX: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
):
    """Program t: token t's keys (all kv heads) rotated by its slot, and its values, into the cache."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding
        return
    block = slot // KV_BLOCK_SIZE
    offset = slot % KV_BLOCK_SIZE
    heads = tl.arange(0, HEADS_P)
    head_ok = heads < NUM_KV_HEADS
    offs_d = tl.arange(0, HEAD_P)
    d_ok = offs_d < HEAD
    k_rows = k_ptr + token * stride_kt + heads * stride_kh
    v_rows = v_ptr + token * stride_vt + heads * stride_vh
    kc_rows = k_cache_ptr + block * stride_kcb + offset * stride_kcs + heads * stride_kch
    vc_rows = v_cache_ptr + block * stride_vcb + offset * stride_vcs + heads * stride_vch
    k = _load_rows(k_rows, offs_d, stride_kd, head_ok, d_ok)
    pass_ok = head_ok[:, None] & (d_ok & (offs_d >= 2 * ROT_HALF))[None, :]
    tl.store(kc_rows[:, None] + offs_d[None, :] * stride_kcd, k.to(k_cache_ptr.dtype.element_ty), mask=pass_ok)
    if ROT_HALF > 0:
        k1, k2 = _load_pair(k_rows, stride_kd, head_ok, HEADS_P, ROT_HALF, ROT_HALF_P, IS_NEOX)
        cos, sin = _table_row(cos_sin_ptr, offset, stride_cs, ROT_HALF, ROT_HALF_P)
        r1, r2 = _rotate(k1, k2, cos[None, :], sin[None, :])
        _store_pair(kc_rows, r1, r2, stride_kcd, head_ok, ROT_HALF, ROT_HALF_P, IS_NEOX)
    v = _load_rows(v_rows, offs_d, stride_vd, head_ok, d_ok)
    tl.store(vc_rows[:, None] + offs_d[None, :] * stride_vcd, v.to(v_cache_ptr.dtype.element_ty),
             mask=head_ok[:, None] & d_ok[None, :])


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    cos_sin: torch.Tensor,
    rotary_dim: int,
    is_neox: bool,
) -> None:
    """`write_kv_reference` on the GPU: one program per token of ``slot_mapping``, no host sync.

    ``key``/``value``: ``(num_tokens, num_kv_heads, head_size)``, any strides;
    ``cos_sin``: the model's own table (its rows ``0 .. block_size - 1`` are read).
    """
    num_tokens = min(slot_mapping.shape[0], key.shape[0])
    if num_tokens == 0:
        return
    _, block_size, num_kv_heads, head_size = key_cache.shape
    rot_half = rotary_dim // 2
    _write_kv_kernel[(num_tokens,)](
        key_cache, value_cache, key, value, slot_mapping, cos_sin,
        *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(), cos_sin.stride(0),
        NUM_KV_HEADS=num_kv_heads, HEADS_P=_pow2(num_kv_heads), HEAD=head_size, HEAD_P=_pow2(head_size),
        ROT_HALF=rot_half, ROT_HALF_P=_pow2(rot_half, 16), IS_NEOX=bool(is_neox), KV_BLOCK_SIZE=block_size,
        num_warps=4,
    )  # fmt: skip
