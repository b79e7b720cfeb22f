"""Markers read as an ordinary token: the model sees a separator it was trained on.

MiniPIC's markers are unused special tokens, so an off-the-shelf model has never trained
their embedding rows. The block rule needs their ids; the model does not. With
``embed_markers_as`` set, the model's input embedding looks SSep, PDep and HSep up as that
token (a newline with ``minipic serve --embed-markers-as newline``): a forward pre-hook
maps the ids just before the lookup, so hashing, windows and hidden heads still read the
marker ids, and the weights are untouched. An output head, tied to the embedding or not,
multiplies by the weights without calling the embedding, so the markers keep their own
logits (and stay banned from sampling). docs/accuracy.md has the measurement behind it.
"""

from __future__ import annotations

import torch
from torch import nn

from minipic_server.boundary import ParallelLMHead, VocabParallelEmbedding
from minipic_server.config import MiniPICConfigError, PicConfig


def embed_markers_as(model: nn.Module, pic: PicConfig) -> None:
    """Make `model`'s input embedding look `pic.embedded_markers` up as `pic.embed_markers_as`."""
    assert pic.embed_markers_as is not None
    embedding = input_embedding(model)
    rows = embedding.weight.shape[0]
    out_of_range = [i for i in (*pic.embedded_markers, pic.embed_markers_as) if i >= rows]
    if out_of_range:
        raise MiniPICConfigError(f"token ids {out_of_range} are outside the model's embedding ({rows} rows)")
    looked_up = torch.arange(rows, device=embedding.weight.device)
    looked_up[list(pic.embedded_markers)] = pic.embed_markers_as

    def read_markers_as_stand_in(module: nn.Module, args: tuple[torch.Tensor]) -> tuple[torch.Tensor]:
        return (looked_up[args[0]],)

    embedding.register_forward_pre_hook(read_markers_as_stand_in)


def input_embedding(model: nn.Module) -> nn.Module:
    """The model's one token embedding that is not only an output head."""
    found = [
        name
        for name, module in model.named_modules()
        if isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead)
    ]
    if len(found) != 1:
        raise MiniPICConfigError(f"--embed-markers-as needs the model's one input embedding; found {found or 'none'}")
    return model.get_submodule(found[0])
