"""CUDA attention backend: vLLM's Triton KV-cache layout, MiniPIC's cache write and attention.

The cache layout and its allocation come from vLLM's TRITON_ATTN backend. The KV write
is `minipic_kernels.kv_write.write_kv` (keys as the model rotated them, one launch like
vLLM's own write), or vLLM's CUDA write itself in eager steps while no block is stored away
from where it is computed (`PositionFreeAttention.plain_cache_write`). Attention is
`minipic_kernels.attention.paged_rope_attention`: decode rows by MiniPIC's Triton kernel,
window-free prefill by vLLM's FlashAttention-3 (over the cache itself when every block sits
where it was computed, over scratch pages for requests reading a cached span elsewhere or
skipping only hidden heads before all their rows), prefill with span windows by MiniPIC's
tile kernel.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from minipic_kernels.attention import PagedAttention, paged_rope_attention, plan_step
from minipic_kernels.kv_write import write_kv
from minipic_server.backends.common import (
    PicAttentionMetadata,
    PicMetadataBuilder,
    PositionFreeAttention,
    PositionFreeBackend,
    RopeSpec,
)
from minipic_server.boundary import (
    AttentionCGSupport,
    CommonAttentionMetadata,
    TritonAttentionBackend,
    TritonAttentionImpl,
    release,
)
from minipic_server.impl_args import bind_impl_args

# Scratch for the rotated keys and values of one step's prefill requests (both counted in
# vLLM's memory profiling: `PicTritonAttentionImpl.profile` allocates it). A step needing
# more rotates keys inside the tile kernel instead (slower, same result).
SCRATCH_BUDGET_BYTES = int(os.environ.get("MINIPIC_ATTN_SCRATCH_BYTES", str(1 << 30)))
# Decode batches run in FULL CUDA graphs unless MINIPIC_FULL_CUDA_GRAPHS=0.
FULL_CUDA_GRAPHS = os.environ.get("MINIPIC_FULL_CUDA_GRAPHS", "1") == "1"


class PicCudaMetadataBuilder(PicMetadataBuilder):
    """Adds the step's `StepPlan` (host-side lengths) to the metadata; the step recorder
    routes it (`StepPlan.routed`) once the block records are written.

    Decode batches can be captured whole: the per-step block record and window
    derivation are graph-safe tensor ops, and a decode-only plan needs no routing.
    """

    _cudagraph_support: ClassVar[AttentionCGSupport] = (
        AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE if FULL_CUDA_GRAPHS else AttentionCGSupport.NEVER
    )

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        num_heads = vllm_config.model_config.get_num_attention_heads(vllm_config.parallel_config)
        self.group = num_heads // kv_cache_spec.num_kv_heads
        self.head_size = kv_cache_spec.head_size
        self.page_bytes = kv_cache_spec.page_size_bytes

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> PicAttentionMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        m = common_attn_metadata
        starts = m.query_start_loc_cpu[: m.num_reqs + 1].tolist()
        upper = m.seq_lens_cpu_upper_bound
        metadata.plan = plan_step(
            [b - a for a, b in zip(starts, starts[1:])],
            upper[: m.num_reqs].tolist() if upper is not None else None,
            max_seq_len=m.max_seq_len,
            block_size=self.block_size,
            group=self.group,
            page_bytes=self.page_bytes,
            scratch_budget_bytes=SCRATCH_BUDGET_BYTES,
        )
        return metadata


class PicTritonAttentionBackend(PositionFreeBackend, TritonAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[PicTritonAttentionImpl]:
        return PicTritonAttentionImpl

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        """Blocks, tokens, heads (NHD) whatever a KV connector asks for (CPU offloading asks for
        HND, which it copies as bytes either way): the layout FlashAttention-3 reads pages in."""
        return (1, 0, 3, 2, 4) if include_num_layers_dimension else (0, 2, 1, 3)

    @staticmethod
    def get_builder_cls() -> type[PicCudaMetadataBuilder]:
        return PicCudaMetadataBuilder


class PicTritonAttentionImpl(PositionFreeAttention, TritonAttentionImpl):
    """vLLM's Triton impl (cache layout) with MiniPIC's cache write and attention."""

    cache_write = staticmethod(write_kv)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bind_impl_args(TritonAttentionImpl.__init__, args, kwargs)
        super().__init__(*args, **kwargs)
        self.plain_cache_write = vllm_cache_write()
        self.paged_attention: PagedAttention | None = None
        self._paged_attention_for: torch.dtype | None = None

    def fused_rope_kvcache_supported(self) -> bool:
        return False  # MiniPIC writes the cache itself (`do_kv_cache_update`)

    def attend(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: PicAttentionMetadata,
        rope: RopeSpec,
        output: torch.Tensor,
    ) -> None:
        self.ensure_paged_attention(query.dtype)
        paged_rope_attention(
            query, key_cache, value_cache, metadata.block_table, metadata.query_start_loc,
            metadata.seq_lens, metadata.block_kind, metadata.block_origin, rope.unit_cos_sin_in(key_cache.dtype),
            rope.rotary_dim, rope.is_neox, self.scale, output, plan=metadata.plan, step=metadata.step,
            paged_attention=self.paged_attention, unread=metadata.unread, span_bias=metadata.span_bias,
        )  # fmt: skip

    def ensure_paged_attention(self, dtype: torch.dtype) -> None:
        """Pick the stock kernel for window-free prefill once the model dtype is known."""
        if self._paged_attention_for != dtype:
            self.paged_attention = flash_attention_for(dtype, self.head_size)
            self._paged_attention_for = dtype

    def profile(self, query: torch.Tensor) -> None:
        if query.is_cuda and not torch.cuda.is_current_stream_capturing():
            torch.empty(SCRATCH_BUDGET_BYTES, dtype=torch.uint8, device=query.device)


def vllm_cache_write() -> Callable[..., None]:
    """vLLM's CUDA cache write (`release.stock_cache_write`) with unit scales (MiniPIC refuses
    quantized KV caches), as `PositionFreeAttention.plain_cache_write`."""
    write = release.stock_cache_write()
    unit_scales: dict[torch.device, torch.Tensor] = {}

    def plain_cache_write(
        key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:  # fmt: skip
        one = unit_scales.get(key.device)
        if one is None:
            one = unit_scales[key.device] = torch.ones((), dtype=torch.float32, device=key.device)
        write(key, value, key_cache, value_cache, slot_mapping, "auto", one, one)

    return plain_cache_write


def flash_attention_for(dtype: torch.dtype, head_size: int) -> PagedAttention | None:
    """vLLM's FlashAttention-3 as a `PagedAttention`, or None where it cannot run this layer
    (fp32, head sizes it lacks, GPUs without FA3): the Triton tile kernel then does all."""
    if dtype not in (torch.float16, torch.bfloat16) or head_size % 8 or head_size > 256:
        return None
    fa3_forward = release.fa3_forward(head_size)  # its argument order checked against the op's schema
    return None if fa3_forward is None else _fa3_paged_attention(fa3_forward)


def _fa3_paged_attention(fa3_forward: Callable[..., Any]) -> PagedAttention:
    """FA3's forward op, called as `flash_attn_varlen_func` calls it (vLLM 0.26) plus
    ``seqused_q``, positionally by the names of `boundary.v0_26.FA3_FWD_ARGUMENTS`: only the
    rows a request is given are computed, the others left as they are, so launches over the
    cache and over scratch pages share one output."""

    def attend(
        query: torch.Tensor,
        key_pages: torch.Tensor,
        value_pages: torch.Tensor,
        page_table: torch.Tensor,
        query_start_loc: torch.Tensor,
        query_used: torch.Tensor,
        seq_used: torch.Tensor,
        max_query_len: int,
        max_seq_len: int,
        scale: float,
        out: torch.Tensor,
    ) -> None:
        fa3_forward(
            query, key_pages, value_pages,
            None, None, None,  # k_new, v_new, q_v
            out, query_start_loc,
            None, None,  # cu_seqlens_k (paged: seqused_k), cu_seqlens_k_new
            query_used, seq_used, max_query_len, max_seq_len, page_table,
            None, None, None, None, None,  # kv_batch_idx, leftpad_k, rotary cos, sin, seqlens
            None, None, None,  # q/k/v descale
            scale, True, -1, -1, 0.0,  # causal, no sliding window, no softcap
            True, None, 0, None, 0,  # rotary_interleaved, scheduler metadata, splits (auto), pack_gqa, sm_margin
            None, 1, 0, None,  # s_aux, context parallelism off
        )  # fmt: skip

    return attend
