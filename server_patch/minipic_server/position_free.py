"""Worker side of the plugin: attention learns the model's rotation and the worker's block records.

After vLLM loads a model with PIC active, every layer's attention backend is handed the
layer's rotation (`RopeSpec`) and the worker's `BlockRecords`. The model rotates queries
and keys as usual; the cache keeps each block's keys at its origin (where stock vLLM
keeps them, except a span computed inside a longer prompt, stored as if it opened it:
`minipic_server.block_plan`), and attention re-applies the rotation only to the keys of a
block read elsewhere (a reused span), by the distance it moved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from minipic_kernels.reference import unit_rotation_table
from minipic_server.backends.common import RopeSpec
from minipic_server.block_records import link_block_records
from minipic_server.boundary import Attention, BaseModelLoader
from minipic_server.config import MiniPICConfigError, pic_config_of
from minipic_server.guards import check_rope_class
from minipic_server.marker_embedding import embed_markers_as


def wrap_load_model(original: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """The model loader's hook (`minipic_server.boundary`); a no-op for engines without a minipic section."""

    def load_model(self: BaseModelLoader, vllm_config: Any, model_config: Any, *args: Any, **kwargs: Any):
        model = original(self, vllm_config, model_config, *args, **kwargs)
        pic = pic_config_of(vllm_config)
        if pic is not None:
            make_position_free(model, compact=pic.compact)
            if pic.embed_markers_as is not None:
                embed_markers_as(model, pic)
        return model

    return load_model


def make_position_free(model: nn.Module, *, compact: bool = False) -> None:
    specs: dict[int, RopeSpec] = {}
    for name, module in model.named_modules():
        attn, rope = getattr(module, "attn", None), getattr(module, "rotary_emb", None)
        if not isinstance(attn, Attention) or rope is None:
            continue
        check_rope_class(rope, name)
        if not hasattr(attn.impl, "pic_rope"):
            raise MiniPICConfigError(
                f"layer {name} uses {type(attn.impl).__name__}, not a MiniPIC attention backend"
            )
        if id(rope) not in specs:
            specs[id(rope)] = RopeSpec(
                unit_cos_sin=unit_rotation_table(rope.cos_sin_cache),
                rotary_dim=rope.rotary_dim,
                is_neox=rope.is_neox_style,
            )
        attn.impl.pic_rope = specs[id(rope)]
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
    link_block_records(model, next(model.parameters()).device, compact)
