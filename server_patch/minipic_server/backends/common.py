"""Pieces shared by MiniPIC's CPU and CUDA attention backends."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from minipic_kernels.attention import StepPlan
from minipic_kernels.step_tensors import StepTensors
from minipic_server import boundary
from minipic_server.block_records import BlockRecords, derive_step
from minipic_server.boundary import AttentionMetadataBuilder, AttentionType, CommonAttentionMetadata
from minipic_server.config import MiniPICConfigError, pic_config_of


@dataclass(frozen=True)
class RopeSpec:
    """The model's rotation, as attention re-applies it to a misplaced block's keys: the
    model's angles without any magnitude its table carries (the model applied that once)."""

    unit_cos_sin: torch.Tensor  # (max_positions, rotary_dim) float32, cat(cos, sin), pairs of length 1
    rotary_dim: int
    is_neox: bool
    _in_dtype: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    def unit_cos_sin_in(self, dtype: torch.dtype) -> torch.Tensor:
        """`unit_cos_sin` in ``dtype`` (the KV cache's), which attention rotates moved keys
        with. Made once per dtype; the CUDA warm-up makes the model's before any CUDA graph
        is captured (`warmup_hook`)."""
        if dtype not in self._in_dtype:
            self._in_dtype[dtype] = self.unit_cos_sin.to(dtype)
        return self._in_dtype[dtype]


@dataclass
class PicAttentionMetadata:
    """Per-step metadata; ``block_kind``/``block_origin``/``unread``/``step`` come from the worker's block
    records through the step's first attention layer (`block_records.derive_step`); ``plan``
    from builders whose kernels need one (CUDA), routed there."""

    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_size: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    plan: StepPlan | None = None
    block_kind: torch.Tensor | None = None
    block_origin: torch.Tensor | None = None
    unread: tuple[torch.Tensor, torch.Tensor] | None = None  # the compact reading's records (`BlockRecords.unread`)
    step: StepTensors | None = None
    span_bias: float = 0.0  # the server's (`PicConfig.span_bias`)


class PicMetadataBuilder(AttentionMetadataBuilder[PicAttentionMetadata]):
    """Copies what attention needs out of vLLM's common metadata; the block records are read
    by the step's first attention layer."""

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        boundary.check_kv_cache_layout(kv_cache_spec)
        self.block_size = kv_cache_spec.block_size
        pic = pic_config_of(vllm_config)
        self.span_bias = pic.span_bias if pic is not None else 0.0

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> PicAttentionMetadata:
        m = common_attn_metadata
        return PicAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
            block_size=self.block_size,
            query_start_loc=m.query_start_loc,
            seq_lens=m.seq_lens,
            block_table=m.block_table_tensor,
            slot_mapping=m.slot_mapping,
            span_bias=self.span_bias,
        )


def refuse_unsupported_features(
    *,
    alibi_slopes: Any = None,
    sliding_window: Any = None,
    logits_soft_cap: Any = None,
    attn_type: str = AttentionType.DECODER,
    kv_sharing_target_layer_name: Any = None,
    sinks: Any = None,
    kv_cache_dtype: str = "auto",
    **_: Any,
) -> None:
    """Layer features the position-free kernels do not implement."""
    unsupported = {
        "ALiBi": alibi_slopes is not None,
        "sliding windows": sliding_window not in (None, -1),
        "logits soft-capping": logits_soft_cap not in (None, 0),
        f"attention type {attn_type}": attn_type != AttentionType.DECODER,
        "cross-layer KV sharing": kv_sharing_target_layer_name is not None,
        "attention sinks": sinks is not None,
        f"kv_cache_dtype={kv_cache_dtype}": kv_cache_dtype != "auto",
    }
    found = [name for name, present in unsupported.items() if present]
    if found:
        raise MiniPICConfigError(f"MiniPIC attention does not support {', '.join(found)}")


def _capturing(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


def split_kv_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Key and value views ``(num_blocks, block_size, num_kv_heads, head_size)`` of a layer's cache.

    Both backends keep vLLM's logical ``(num_blocks, num_kv_heads, block_size, 2 * head_size)``
    layout with K and V side by side in the last dimension.
    """
    head_size = kv_cache.shape[-1] // 2
    by_token = kv_cache.transpose(1, 2)
    return by_token[..., :head_size], by_token[..., head_size:]


class PositionFreeBackend:
    """What both backends declare: decoder attention only, no windows, sinks or quantized KV.

    Listed first in a backend's bases so these answers override the stock backend's.
    """

    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return False

    @classmethod
    def supports_sink(cls) -> bool:
        return False

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


class PositionFreeAttention:
    """The forward pass both backends share; each computes attention in `attend` and writes
    the cache in ``do_kv_cache_update``.

    ``pic_rope`` and ``pic_records`` (the worker's `BlockRecords`) are linked after loading
    (`position_free.make_position_free`).
    """

    num_heads: int
    head_size: int
    scale: float
    pic_rope: RopeSpec | None = None
    pic_records: BlockRecords | None = None
    _kv_views: tuple[weakref.ref[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    # The backend's cache write, `minipic_kernels.reference.write_kv_reference`'s signature.
    cache_write: ClassVar[Callable[..., None]]
    # A cheaper write for steps where no block is stored away from where it is computed (every
    # write shift 0): ``(key, value, key_cache, value_cache, slot_mapping)``. Eager steps only: a
    # captured graph keeps whichever write it was captured with, so it captures `cache_write`.
    plain_cache_write: Callable[..., None] | None = None

    def attend(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: PicAttentionMetadata,
        rope: RopeSpec,
        output: torch.Tensor,
    ) -> None:
        """Attention of ``query`` ``(tokens, heads, head_size)`` into ``output`` (same shape); in
        the compact reading attention rotates each row back by its query shift itself."""
        raise NotImplementedError

    def do_kv_cache_update(
        self,
        layer: torch.nn.Module,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Write this step's keys and values into their slots, each key at its block's origin
        (rotated back by its block's write shift when computed elsewhere)."""
        rope, records = self.linked()
        records.ensure(kv_cache.shape[0])
        key_cache, value_cache = self.kv_views(kv_cache)
        if self.plain_cache_write is not None and not records.any_write_shift and not _capturing(kv_cache):
            self.plain_cache_write(key, value, key_cache, value_cache, slot_mapping)
            return
        self.cache_write(
            key, value, key_cache, value_cache, slot_mapping, records.write_shift, rope.unit_cos_sin,
            rope.rotary_dim, rope.is_neox,
        )  # fmt: skip

    def kv_views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`split_kv_cache` of this layer's cache, made once: vLLM hands the layer the same
        tensor every step, and the three view operations cost an eager step about 20 us a layer
        on the H100. Held through a weak reference to the cache, so a cache vLLM replaces is
        split anew and the old views let go at the next step."""
        held = self._kv_views
        if held is None or held[0]() is not kv_cache:
            held = self._kv_views = (weakref.ref(kv_cache), split_kv_cache(kv_cache))
        return held[1]

    def linked(self) -> tuple[RopeSpec, BlockRecords]:
        if self.pic_rope is None or self.pic_records is None:
            raise MiniPICConfigError(
                "MiniPIC attention ran before make_position_free linked its rotary embedding and block "
                "records: the model's layers do not expose `rotary_emb` next to `attn`, so reused spans cannot be moved"
            )
        return self.pic_rope, self.pic_records

    def profile(self, query: torch.Tensor) -> None:
        """A memory-profiling step (no metadata): allocate what a real step can use at most."""

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
        if attn_metadata is None:  # profiling and warm-up runs
            self.profile(query)
            return output.fill_(0)
        rope, records = self.linked()
        records.ensure(kv_cache.shape[0])
        derive_step(attn_metadata, records, first_layer=self is records.first_layer)
        num_tokens = attn_metadata.num_actual_tokens
        key_cache, value_cache = self.kv_views(kv_cache)
        self.attend(
            query[:num_tokens].view(num_tokens, self.num_heads, self.head_size),
            key_cache,
            value_cache,
            attn_metadata,
            rope,
            output[:num_tokens].view(num_tokens, self.num_heads, self.head_size),
        )
        return output
