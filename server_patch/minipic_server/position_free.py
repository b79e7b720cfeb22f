"""Worker side of the plugin: keys reach the attention backend unrotated, and each step records block kinds.

After vLLM loads a model with PIC active:
- every layer's ``rotary_emb`` is wrapped so it rotates the query only, and the
  layer's attention backend is handed the rotation (`RopeSpec`): it writes keys rotated
  by their slot in the block and rotates them by their block's start in the current
  request when it attends;
- the model's forward records, before any attention runs, which physical blocks
  this step starts with an SSep or PDep token (`minipic_server.block_recorder`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from vllm.model_executor.layers.attention.attention import Attention
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from minipic_kernels.reference import unit_rotation_table
from minipic_server.backends.common import RopeSpec
from minipic_server.block_recorder import record_each_step
from minipic_server.boundary import ROTARY_EMB, patch_instance
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
            table = rope.cos_sin_cache.float().contiguous()
            specs[id(rope)] = RopeSpec(
                cos_sin=table,
                unit_cos_sin=unit_rotation_table(table),
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
    record_each_step(model, pic)
