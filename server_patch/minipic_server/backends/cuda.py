"""CUDA attention backend: MiniPIC's Triton kernel over vLLM's Triton KV-cache layout.

The cache layout, its allocation and the KV write (keys arrive unrotated, so
vLLM's own write is exactly right) come from vLLM's TRITON_ATTN backend; only
the attention itself is ours: it rotates key tiles by their index in the
request and applies span windows.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend, TritonAttentionImpl

from minipic_kernels.triton_attention import paged_rope_attention
from minipic_server.backends.common import (
    PicMetadataBuilder,
    PositionFreeAttention,
    PositionFreeBackend,
    refuse_unsupported_features,
)


class PicCudaMetadataBuilder(PicMetadataBuilder):
    # Decode batches can be captured whole: the per-step record and window
    # derivation are graph-safe tensor ops. MINIPIC_FULL_CUDA_GRAPHS=0 keeps
    # attention out of graphs (piecewise graphs still cover the rest).
    _cudagraph_support: ClassVar[AttentionCGSupport] = (
        AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
        if os.environ.get("MINIPIC_FULL_CUDA_GRAPHS", "1") == "1"
        else AttentionCGSupport.NEVER
    )


class PicTritonAttentionBackend(PositionFreeBackend, TritonAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[PicTritonAttentionImpl]:
        return PicTritonAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[PicCudaMetadataBuilder]:
        return PicCudaMetadataBuilder


class PicTritonAttentionImpl(PositionFreeAttention, TritonAttentionImpl):
    """vLLM's Triton impl (cache layout, KV write) with MiniPIC's attention kernel."""

    attend = staticmethod(paged_rope_attention)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        refuse_unsupported_features(**dict(zip(_IMPL_ARG_NAMES, args)), **kwargs)
        super().__init__(*args, **kwargs)

    def fused_rope_kvcache_supported(self) -> bool:
        return False  # the key must reach the cache unrotated


# Positional order of vLLM's AttentionImpl constructor arguments.
_IMPL_ARG_NAMES = (
    "num_heads", "head_size", "scale", "num_kv_heads", "alibi_slopes", "sliding_window",
    "kv_cache_dtype", "logits_soft_cap", "attn_type", "kv_sharing_target_layer_name", "sinks",
)
