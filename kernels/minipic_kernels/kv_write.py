"""Write a step's keys and values into the paged cache, in one launch (as vLLM's own write).

Keys arrive rotated by the model at their positions, so the write only copies; where they
were computed is recorded per block (`block_origins`). The GPU form of
`minipic_kernels.reference.write_kv_reference`, warmed up with the attention kernels
(`warmup`) so serving never compiles it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minipic_kernels.triton_attention import _load_rows, _pow2

__all__ = ["write_kv"]


@triton.jit
def _write_kv_kernel(
    k_cache_ptr, v_cache_ptr, k_ptr, v_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd, stride_vcb, stride_vcs, stride_vch, stride_vcd,
    NUM_KV_HEADS: tl.constexpr, HEADS_P: tl.constexpr, HEAD: tl.constexpr, HEAD_P: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
):
    """Program t: token t's keys and values (all kv heads) into its slot."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding
        return
    block = slot // KV_BLOCK_SIZE
    offset = slot % KV_BLOCK_SIZE
    heads = tl.arange(0, HEADS_P)
    head_ok = heads < NUM_KV_HEADS
    offs_d = tl.arange(0, HEAD_P)
    ok = head_ok[:, None] & (offs_d < HEAD)[None, :]
    k = _load_rows(k_ptr + token * stride_kt + heads * stride_kh, offs_d, stride_kd, head_ok, offs_d < HEAD)
    v = _load_rows(v_ptr + token * stride_vt + heads * stride_vh, offs_d, stride_vd, head_ok, offs_d < HEAD)
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
) -> None:
    """`write_kv_reference` on the GPU: one program per token of ``slot_mapping``, no host sync.

    ``key``/``value``: ``(num_tokens, num_kv_heads, head_size)``, any strides.
    """
    num_tokens = min(slot_mapping.shape[0], key.shape[0])
    if num_tokens == 0:
        return
    _, block_size, num_kv_heads, head_size = key_cache.shape
    _write_kv_kernel[(num_tokens,)](
        key_cache, value_cache, key, value, slot_mapping,
        *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(),
        NUM_KV_HEADS=num_kv_heads, HEADS_P=_pow2(num_kv_heads), HEAD=head_size, HEAD_P=_pow2(head_size),
        KV_BLOCK_SIZE=block_size, num_warps=4,
    )  # fmt: skip
