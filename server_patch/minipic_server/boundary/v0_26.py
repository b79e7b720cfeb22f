"""What differs in vLLM 0.26 (CUDA): the KV-cache shape API, and FlashAttention-3 called directly.

Imports are inside the functions: the contract tests read this module on any release.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PLATFORM = "cuda"

# `_vllm_fa3_C::fwd`'s arguments as `backends.cuda._fa3_paged_attention` passes them, in order
# (as vLLM 0.26's `flash_attn_varlen_func` does, plus ``seqused_q``). Checked against the
# op's schema at start-up (`fa3_forward`).
FA3_FWD_ARGUMENTS = (
    "q", "k", "v", "k_new", "v_new", "q_v", "out", "cu_seqlens_q", "cu_seqlens_k", "cu_seqlens_k_new",
    "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k", "page_table", "kv_batch_idx", "leftpad_k",
    "rotary_cos", "rotary_sin", "seqlens_rotary", "q_descale", "k_descale", "v_descale", "softmax_scale",
    "is_causal", "window_size_left", "window_size_right", "softcap", "is_rotary_interleaved",
    "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin", "s_aux", "cp_world_size", "cp_rank",
    "cp_tot_seqused_k",
)  # fmt: skip


def kv_cache_shape(spec: Any, num_blocks: int) -> tuple[int, ...]:
    """The per-layer KV-cache shape vLLM allocates for MiniPIC's CUDA backend (a TRITON_ATTN subclass)."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    return tuple(
        TritonAttentionBackend.get_kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
    )


def fa3_forward(head_size: int) -> Callable[..., Any] | None:
    """vLLM's FlashAttention-3 forward op, its schema checked, or None where FA3 cannot run this head size."""
    import torch
    from vllm.v1.attention.backends.fa_utils import get_flash_attn_version, is_flash_attn_varlen_func_available

    from minipic_server.boundary.checks import check_op_arguments

    if not is_flash_attn_varlen_func_available() or get_flash_attn_version(head_size=head_size) != 3:
        return None
    from vllm.vllm_flash_attn import flash_attn_interface  # noqa: F401 - loads FA3's op library

    try:
        op = torch.ops._vllm_fa3_C.fwd
    except (AttributeError, RuntimeError):  # built without FA3
        return None
    check_op_arguments(str(op.default._schema), FA3_FWD_ARGUMENTS)
    return op
