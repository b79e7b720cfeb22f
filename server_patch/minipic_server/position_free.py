"""Worker side of the plugin: keys enter the KV cache unrotated, and each step records block kinds.

After vLLM loads a model with PIC active:
- every layer's ``rotary_emb`` is wrapped so it rotates the query only, and the
  layer's attention backend is handed the rotation (`RopeSpec`) to apply to keys
  at their index in the current request;
- the model's forward records, before any attention runs, which physical blocks
  this step starts with an SSep or PDep token (token ids are the model's input;
  slots are in the forward context), and derives each block's window start.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.layers.attention.attention import Attention, get_attention_context
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from minipic_kernels.block_kinds import BlockKind, requests_with_windows, window_starts_per_block
from minipic_server.backends.common import PicAttentionMetadata, RopeSpec
from minipic_server.boundary import MODEL_FORWARD, ROTARY_EMB, patch_instance
from minipic_server.config import MiniPICConfigError, PicConfig, pic_config_of
from minipic_server.guards import check_rope_class


def wrap_load_model(original: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """The model loader's hook (`minipic_server.boundary`); a no-op for engines without a minipic section."""

    def load_model(self: BaseModelLoader, vllm_config: Any, model_config: Any, *args: Any, **kwargs: Any):
        model = original(self, vllm_config, model_config, *args, **kwargs)
        pic = pic_config_of(vllm_config)
        if pic is not None:
            make_position_free(model, pic)
        return model

    return load_model


class QueryOnlyRotary(nn.Module):
    """Stands in for a layer's rotary embedding: rotates q, leaves k for the attention backend."""

    def __init__(self, rope: nn.Module) -> None:
        super().__init__()
        self.rope = rope

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        query, _ = self.rope(positions, query, None)
        return query, key


def make_position_free(model: nn.Module, pic: PicConfig) -> None:
    specs: dict[int, RopeSpec] = {}
    for name, module in model.named_modules():
        attn, rope = getattr(module, "attn", None), getattr(module, "rotary_emb", None)
        if not isinstance(attn, Attention) or rope is None or isinstance(rope, QueryOnlyRotary):
            continue
        check_rope_class(rope, name)
        if not hasattr(attn.impl, "pic_rope"):
            raise MiniPICConfigError(
                f"layer {name} uses {type(attn.impl).__name__}, not a MiniPIC attention backend"
            )
        if id(rope) not in specs:
            specs[id(rope)] = RopeSpec(
                cos_sin=rope.cos_sin_cache.float().contiguous(),
                rotary_dim=rope.rotary_dim,
                is_neox=rope.is_neox_style,
            )
        attn.impl.pic_rope = specs[id(rope)]
        patch_instance(ROTARY_EMB, module, QueryOnlyRotary(rope))
    unlinked = [
        name
        for name, module in model.named_modules()
        if isinstance(module, Attention) and getattr(module.impl, "pic_rope", None) is None
    ]
    if unlinked or not specs:
        raise MiniPICConfigError(
            "MiniPIC could not find the rotary embedding beside attention layers "
            f"{unlinked[:3] or '(none found)'}: this model architecture is not supported"
        )
    _record_block_kinds_each_step(model, BlockKindRecorder(pic))


def _record_block_kinds_each_step(model: nn.Module, recorder: BlockKindRecorder) -> None:
    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        recorder.record(input_ids)
        return original(*args, **kwargs)

    patch_instance(MODEL_FORWARD, model, forward)


class BlockKindRecorder:
    """Keeps the per-physical-block record of `BlockKind` for one worker's KV cache."""

    def __init__(self, pic: PicConfig) -> None:
        self.pic = pic
        self.block_kind: torch.Tensor | None = None

    def _record_for(self, num_blocks: int, device: torch.device) -> torch.Tensor:
        # One spare entry at the end absorbs writes from tokens that start no block.
        if self.block_kind is None or self.block_kind.shape[0] != num_blocks + 1:
            self.block_kind = torch.zeros(num_blocks + 1, dtype=torch.int8, device=device)
        return self.block_kind

    def record(self, input_ids: torch.Tensor | None) -> None:
        if not is_forward_context_available():
            return
        slot_mappings = get_forward_context().slot_mapping
        if not slot_mappings:  # profiling runs write no KV
            return
        if isinstance(slot_mappings, list):
            raise MiniPICConfigError("MiniPIC does not support micro-batching (DBO/ubatching)")
        if input_ids is None:
            raise MiniPICConfigError("MiniPIC needs token ids: prompt embeddings are not supported")
        layer_name, slot_mapping = next(iter(slot_mappings.items()))
        metadata, _, kv_cache, _ = get_attention_context(layer_name)
        if metadata is None:  # CUDA-graph capture of the non-attention pieces
            return
        if not isinstance(metadata, PicAttentionMetadata):
            raise MiniPICConfigError(
                f"attention metadata is {type(metadata).__name__}; MiniPIC's backend is not active"
            )
        record = self._record_for(kv_cache.shape[0], kv_cache.device)
        self._write(record, input_ids, slot_mapping, metadata.block_size)
        windows = window_starts_per_block(metadata.block_table, record, metadata.block_size)
        windowed = requests_with_windows(windows, metadata.query_start_loc, metadata.seq_lens, metadata.block_size)
        for md in _distinct_metadata(get_forward_context().attn_metadata):
            md.block_kind, md.window_starts, md.windowed = record, windows, windowed
            if md.plan is not None:
                md.plan = md.plan.routed(windowed, md.seq_lens)

    def _write(
        self, record: torch.Tensor, input_ids: torch.Tensor, slot_mapping: torch.Tensor, block_size: int
    ) -> None:
        """Set the record of every block whose first slot is written this step (graph-safe ops)."""
        num_tokens = min(input_ids.shape[0], slot_mapping.shape[0])
        ids, slots = input_ids[:num_tokens], slot_mapping[:num_tokens].long()
        kinds = (ids == self.pic.ssep_token_id).to(torch.int8) * int(BlockKind.SSEP) + (
            ids == self.pic.pdep_token_id
        ).to(torch.int8) * int(BlockKind.PDEP)
        starts_block = (slots >= 0) & (slots % block_size == 0)
        spare = record.shape[0] - 1
        target = torch.where(starts_block, slots // block_size, torch.full_like(slots, spare))
        record.index_copy_(0, target, kinds)


def _distinct_metadata(attn_metadata: Any) -> list[PicAttentionMetadata]:
    seen: dict[int, PicAttentionMetadata] = {}
    for md in attn_metadata.values():
        seen.setdefault(id(md), md)
    return list(seen.values())
