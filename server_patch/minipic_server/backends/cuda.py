"""CUDA attention backend: MiniPIC's Triton kernel over vLLM's Triton KV-cache layout.

The cache layout, its allocation and the KV write (keys arrive unrotated, so
vLLM's own write is exactly right) come from vLLM's TRITON_ATTN backend; only
the attention itself is ours: it rotates key tiles by their index in the
request and applies span windows.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend, TritonAttentionImpl

from minipic_kernels.triton_attention import paged_rope_attention
from minipic_server.backends.common import (
    PicAttentionMetadata,
    PicMetadataBuilder,
    linked_rope,
    refuse_unsupported_features,
    split_kv_cache,
)


class PicCudaMetadataBuilder(PicMetadataBuilder):
    # Window starts are derived per step in eager code before attention runs,
    # so attention stays outside CUDA graphs (piecewise graphs still cover the rest).
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER


class PicTritonAttentionBackend(TritonAttentionBackend):
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return False

    @classmethod
    def supports_sink(cls) -> bool:
        return False

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @staticmethod
    def get_impl_cls() -> type[PicTritonAttentionImpl]:
        return PicTritonAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[PicCudaMetadataBuilder]:
        return PicCudaMetadataBuilder


class PicTritonAttentionImpl(TritonAttentionImpl):
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
        **kwargs: Any,
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
        super().__init__(
            num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
            kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name, sinks, **kwargs,
        )
        self.pic_rope = None  # linked to the model's RotaryEmbedding after loading

    def fused_rope_kvcache_supported(self) -> bool:
        return False  # the key must reach the cache unrotated

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: PicAttentionMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("MiniPIC attention does not fuse output quantization")
        if attn_metadata is None:  # profiling run
            return output.fill_(0)
        rope = linked_rope(self)
        num_tokens = attn_metadata.num_actual_tokens
        key_cache, value_cache = split_kv_cache(kv_cache)
        paged_rope_attention(
            query[:num_tokens],
            key_cache,
            value_cache,
            attn_metadata.block_table,
            attn_metadata.query_start_loc,
            attn_metadata.seq_lens,
            attn_metadata.block_kind,
            rope.cos_sin,
            rope.rotary_dim,
            rope.is_neox,
            self.scale,
            output[:num_tokens].view(num_tokens, self.num_heads, self.head_size),
            max_query_len=attn_metadata.max_query_len,
            window_starts=attn_metadata.window_starts,
        )
        return output
