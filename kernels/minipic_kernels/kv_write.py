"""Write a step's keys and values into the paged cache, in one launch (as vLLM's own write).

Keys arrive rotated by the model at their positions. A block is stored at its origin
(`block_origins`): almost always where it is computed, so the write only copies; a block
computed ``write_shift`` blocks past its origin (a span inside a longer prompt) has its
keys rotated back by that much on the way. The GPU form of
`minipic_kernels.reference.write_kv_reference`, warmed up with the attention kernels
(`warmup`) so serving never compiles it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minipic_kernels.triton_attention import _load_rows, _pow2, _rotary_lanes

__all__ = ["write_kv"]


@triton.jit
def _write_kv_kernel(
    k_cache_ptr, v_cache_ptr, k_ptr, v_ptr, slot_mapping_ptr, write_shift_ptr, cos_sin_ptr,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd, stride_vcb, stride_vcs, stride_vch, stride_vcd, stride_cs,
    NUM_KV_HEADS: tl.constexpr, HEADS_P: tl.constexpr, HEAD: tl.constexpr, HEAD_P: tl.constexpr,
    ROT_HALF: tl.constexpr, IS_NEOX: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
):
    """Program t: token t's keys (at its block's origin) and values, all kv heads, into its slot."""
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
    ok = head_ok[:, None] & d_ok[None, :]
    k_rows = k_ptr + token * stride_kt + heads * stride_kh
    k = _load_rows(k_rows, offs_d, stride_kd, head_ok, d_ok)
    if ROT_HALF > 0:
        shift = tl.load(write_shift_ptr + block) * KV_BLOCK_SIZE
        if shift != 0:  # back to the origin: a rotation by -shift (the table holds positive angles)
            column, partner, sign, rotates = _rotary_lanes(HEAD_P, ROT_HALF, IS_NEOX)
            row = cos_sin_ptr + tl.abs(shift) * stride_cs
            cos = tl.load(row + column, mask=rotates, other=1.0)
            sin = tl.load(row + ROT_HALF + column, mask=rotates, other=0.0) * tl.where(shift > 0, -1.0, 1.0)
            other = _load_rows(k_rows, partner, stride_kd, head_ok, rotates)
            k = (k.to(tl.float32) * cos[None, :] + other.to(tl.float32) * (sin * sign)[None, :]).to(k.dtype)
    v = _load_rows(v_ptr + token * stride_vt + heads * stride_vh, offs_d, stride_vd, head_ok, d_ok)
    kc_rows = k_cache_ptr + block * stride_kcb + offset * stride_kcs + heads * stride_kch
    vc_rows = v_cache_ptr + block * stride_vcb + offset * stride_vcs + heads * stride_vch
    tl.store(kc_rows[:, None] + offs_d[None, :] * stride_kcd, k.to(k_cache_ptr.dtype.element_ty), mask=ok)
    tl.store(vc_rows[:, None] + offs_d[None, :] * stride_vcd, v.to(v_cache_ptr.dtype.element_ty), mask=ok)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    write_shift: torch.Tensor,
    cos_sin: torch.Tensor,
    rotary_dim: int,
    is_neox: bool,
) -> None:
    """`write_kv_reference` on the GPU: one program per token of ``slot_mapping``, no host sync.

    ``key``/``value``: ``(num_tokens, num_kv_heads, head_size)``, any strides.
    """
    num_tokens = min(slot_mapping.shape[0], key.shape[0])
    if num_tokens == 0:
        return
    _, block_size, num_kv_heads, head_size = key_cache.shape
    _write_kv_kernel[(num_tokens,)](
        key_cache, value_cache, key, value, slot_mapping, write_shift, cos_sin,
        *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(), cos_sin.stride(0),
        NUM_KV_HEADS=num_kv_heads, HEADS_P=_pow2(num_kv_heads), HEAD=head_size, HEAD_P=_pow2(head_size),
        ROT_HALF=rotary_dim // 2, IS_NEOX=bool(is_neox), KV_BLOCK_SIZE=block_size, num_warps=4,
    )  # fmt: skip
