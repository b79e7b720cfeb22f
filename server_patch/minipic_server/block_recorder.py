"""The per-step block-kind record: how attention learns the span windows the block hashes imply.

Attention sees slots and block tables, never token ids. So, before any layer runs
in a step, the recorder (wrapped around the loaded model's forward, see
`minipic_server.boundary.MODEL_FORWARD`) writes one `BlockKind` byte per
*physical* KV block whose first slot this step writes, from the token written
there (`minipic_kernels.block_kinds.block_kinds_of_tokens`), and hands every
layer's metadata the record, the window start of each logical block and which
requests have windows at all (the CUDA step plan routes the others to a stock kernel).

Invariant: while a physical block holds tokens, its record is the kind of the
block's first token. A block's first slot is written exactly once per use (in the
step that writes that token) and the record is set in that same step before
attention reads it; a block served from the prefix cache keeps its tokens, hence
its first token, because its hash covers them. Generated tokens can write a block's
first slot too, but markers are banned from sampling, so they record PLAIN, as
the hasher counts them. Attention must never run without this step's record
(`PicAttentionMetadata.recorded_windows`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.layers.attention.attention import get_attention_context

from minipic_kernels.block_kinds import block_kinds_of_tokens, requests_with_windows, window_starts_per_block
from minipic_server.backends.common import PicAttentionMetadata
from minipic_server.boundary import MODEL_FORWARD, patch_instance
from minipic_server.config import MiniPICConfigError, PicConfig


def record_each_step(model: nn.Module, pic: PicConfig) -> None:
    """Wrap the loaded model's forward so each step records block kinds before any layer runs."""
    recorder = BlockKindRecorder(pic)
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
        kinds = block_kinds_of_tokens(ids, self.pic.ssep_token_id, self.pic.pdep_token_id)
        starts_block = (slots >= 0) & (slots % block_size == 0)
        spare = record.shape[0] - 1
        target = torch.where(starts_block, slots // block_size, torch.full_like(slots, spare))
        record.index_copy_(0, target, kinds)


def _distinct_metadata(attn_metadata: Any) -> list[PicAttentionMetadata]:
    seen: dict[int, PicAttentionMetadata] = {}
    for md in attn_metadata.values():
        seen.setdefault(id(md), md)
    return list(seen.values())
