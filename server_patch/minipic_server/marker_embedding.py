"""Markers read as an ordinary token: the model sees a separator it was trained on.

MiniPIC's markers are unused special tokens, so an off-the-shelf model has never trained
their embedding rows. The block rule needs their ids; the model does not. With
``embed_markers_as`` set, the rows of SSep, PDep and HSep in the model's input embedding
become copies of that token's row (a newline with ``minipic serve --embed-markers-as
newline``), once, at load: hashing, windows and hidden heads still read the marker ids, and
nothing changes at run time. An output head that shares the embedding's weights gets its
own copy first, so markers keep their logits (and stay banned from sampling).
docs/accuracy.md has the measurement behind it.
"""

from __future__ import annotations

import torch
from torch import nn

from minipic_server.boundary import UNTIED_HEAD_WEIGHT, ParallelLMHead, VocabParallelEmbedding, patch_instance
from minipic_server.config import MiniPICConfigError, PicConfig


@torch.no_grad()
def embed_markers_as(model: nn.Module, pic: PicConfig) -> None:
    """Give `model`'s input embedding rows of `pic.embedded_markers` the row of `pic.embed_markers_as`."""
    assert pic.embed_markers_as is not None
    embedding = input_embedding(model)
    weight = embedding.weight
    out_of_range = [i for i in (*pic.embedded_markers, pic.embed_markers_as) if i >= weight.shape[0]]
    if out_of_range:
        raise MiniPICConfigError(f"token ids {out_of_range} are outside the model's embedding ({weight.shape[0]} rows)")
    if not weight.is_floating_point():
        raise MiniPICConfigError(f"--embed-markers-as needs an unquantized input embedding, not {weight.dtype}")
    for head in _heads_sharing(model, weight):
        patch_instance(UNTIED_HEAD_WEIGHT, head, nn.Parameter(weight.detach().clone(), requires_grad=False))
    weight[list(pic.embedded_markers)] = weight[pic.embed_markers_as].clone()


def input_embedding(model: nn.Module) -> nn.Module:
    """The model's one token embedding that is not an output head."""
    found = [
        name
        for name, module in model.named_modules()
        if isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead)
    ]
    if len(found) != 1:
        raise MiniPICConfigError(f"--embed-markers-as needs the model's one input embedding; found {found or 'none'}")
    return model.get_submodule(found[0])


def _heads_sharing(model: nn.Module, weight: torch.Tensor) -> list[nn.Module]:
    """Output heads tied to `weight` (they must keep the markers' own rows)."""
    return [
        module
        for module in model.modules()
        if isinstance(module, ParallelLMHead) and module.weight.data_ptr() == weight.data_ptr()
    ]
