"""The per-step block records: how attention learns span windows and where blocks were computed.

Attention sees slots and block tables, never token ids or positions. So, before any
layer runs in a step, the recorder (wrapped around the loaded model's forward, see
`minipic_server.boundary.MODEL_FORWARD`) writes two records per *physical* KV block
whose first slot this step writes: its `BlockKind`, from the token written there
(`minipic_kernels.block_kinds.block_kinds_of_tokens`), and its origin, the logical block
at which its keys are computed (`minipic_kernels.block_origins`). It hands every layer's
metadata both records, the window start of each logical block and two per-request flags
(reads a block away from its origin; has a hidden block among its keys), and routes the CUDA
step plan (which requests have masks: windows or hidden blocks to skip; which read a
block away from its origin).

Invariant: while a physical block holds tokens, its records describe the block's first
token. A block's first slot is written exactly once per use (in the step that writes
that token) and the records are set in that same step before attention reads them; a
block served from the prefix cache keeps its tokens and keys, hence its first token and
origin. Generated tokens can write a block's first slot too, but markers are banned
from sampling, so they record PLAIN, as the hasher counts them. Attention must never
run without this step's records (`PicAttentionMetadata.recorded_blocks`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from minipic_kernels.block_kinds import (
    block_kinds_of_tokens,
    hidden_per_block,
    requests_with_hidden,
    requests_with_masks,
    window_starts_per_block,
)
from minipic_kernels.block_origins import misplaced_requests
from minipic_server.backends.common import PicAttentionMetadata
from minipic_server.boundary import (
    MODEL_FORWARD,
    get_attention_context,
    get_forward_context,
    is_forward_context_available,
    patch_instance,
)
from minipic_server.config import MiniPICConfigError, PicConfig


def record_each_step(model: nn.Module, pic: PicConfig) -> None:
    """Wrap the loaded model's forward so each step records its blocks before any layer runs."""
    recorder = BlockRecorder(pic)
    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        positions = kwargs["positions"] if "positions" in kwargs else args[1]
        recorder.record(input_ids, positions)
        return original(*args, **kwargs)

    patch_instance(MODEL_FORWARD, model, forward)


class BlockRecorder:
    """Keeps the per-physical-block records (`BlockKind`, origin) of one worker's KV cache."""

    def __init__(self, pic: PicConfig) -> None:
        self.pic = pic
        self.block_kind: torch.Tensor | None = None
        self.block_origin: torch.Tensor | None = None

    def _records_for(self, num_blocks: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # One spare entry at the end absorbs writes from tokens that start no block.
        if self.block_kind is None or self.block_origin is None or self.block_kind.shape[0] != num_blocks + 1:
            self.block_kind = torch.zeros(num_blocks + 1, dtype=torch.int8, device=device)
            self.block_origin = torch.zeros(num_blocks + 1, dtype=torch.int32, device=device)
        return self.block_kind, self.block_origin

    def record(self, input_ids: torch.Tensor | None, positions: torch.Tensor) -> None:
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
        kinds, origins = self._records_for(kv_cache.shape[0], kv_cache.device)
        self._write(kinds, origins, input_ids, positions, slot_mapping, metadata.block_size)
        windows = window_starts_per_block(metadata.block_table, kinds, metadata.block_size)
        moved = misplaced_requests(metadata.block_table, origins, metadata.seq_lens, metadata.block_size)
        hidden_blocks = hidden_per_block(metadata.block_table, kinds)
        hidden = requests_with_hidden(hidden_blocks, metadata.seq_lens, metadata.block_size)
        for md in _distinct_metadata(get_forward_context().attn_metadata):
            md.block_kind, md.block_origin, md.window_starts = kinds, origins, windows
            md.moved, md.hidden = moved, hidden
            if md.plan is not None and md.plan.has_prefill:
                masked = requests_with_masks(windows, hidden_blocks, md.query_start_loc, md.seq_lens, md.block_size)
                md.plan = md.plan.routed(masked, moved, md.seq_lens)

    def _write(
        self,
        kinds: torch.Tensor,
        origins: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_size: int,
    ) -> None:
        """Set the records of every block whose first slot is written this step (graph-safe ops)."""
        num_tokens = min(input_ids.shape[0], slot_mapping.shape[0], positions.shape[0])
        ids, slots = input_ids[:num_tokens], slot_mapping[:num_tokens].long()
        starts_block = (slots >= 0) & (slots % block_size == 0)
        spare = kinds.shape[0] - 1
        target = torch.where(starts_block, slots // block_size, torch.full_like(slots, spare))
        kinds.index_copy_(0, target, block_kinds_of_tokens(ids, *self.pic.kind_marker_ids))
        origins.index_copy_(0, target, (positions[:num_tokens] // block_size).to(torch.int32))


def _distinct_metadata(attn_metadata: Any) -> list[PicAttentionMetadata]:
    seen: dict[int, PicAttentionMetadata] = {}
    for md in attn_metadata.values():
        seen.setdefault(id(md), md)
    return list(seen.values())
