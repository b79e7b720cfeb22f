"""Selective in-context recompute of cached spans (CacheBlend's idea), emulated in transformers.

Refreshed heads recompute a fixed part of every span in context (its first block). CacheBlend
recomputes the tokens whose cached values differ most from what full attention would give:
a span's KV is taken from the cache (here: the layout's own pass under MiniPIC's rule), the
first layer is recomputed for every token, and at the check layer each span token's fresh
value is compared with its cached one; the ``ratio`` of span tokens that differ most, and every
token outside spans, are recomputed in context through the remaining layers, while the others
keep their cached keys and values. Whether that answers like full attention on a model never
trained for detached passages decides whether the server should learn it (a model-runner
change), so it is tried here first, through transformers' attention hook, before any kernel work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.models.llama.modeling_llama import eager_attention_forward

HOOK = "minipic_blend"


@dataclass
class Blend:
    """One prompt's blend state; transformers calls it as the attention of every layer.

    ``mode`` ``record`` stores each layer's keys and values (the cached pass), ``blend`` swaps
    the cached ones back in for the tokens not recomputed, ``off`` is plain eager attention
    (decode, whose cache already holds the blended keys)."""

    ratio: float
    candidates: torch.Tensor  # [tokens] bool: span tokens, which the cache could serve
    check_layer: int = 1
    random_choice: bool = False  # the control: the same number of span tokens, drawn at random
    mode: str = "off"
    cached: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    blended: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    fresh: torch.Tensor | None = None  # [tokens] bool, once chosen at the check layer

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        layer = module.layer_idx
        if self.mode == "record":
            self.cached[layer] = (key, value)
        elif self.mode == "blend":
            if layer >= self.check_layer:
                cached_key, cached_value = self.cached[layer]
                if layer == self.check_layer:
                    self.fresh = self._choose(value, cached_value)
                keep = self.fresh[None, None, :, None]
                key, value = torch.where(keep, key, cached_key), torch.where(keep, value, cached_value)
            self.blended[layer] = (key, value)
        return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)

    def _choose(self, value: torch.Tensor, cached_value: torch.Tensor) -> torch.Tensor:
        """Every token outside spans, plus the ``ratio`` of span tokens whose values moved most."""
        deviation = (value - cached_value).float().square().sum(dim=(0, 1, 3))
        if self.random_choice:
            deviation = torch.rand(deviation.shape, generator=torch.Generator().manual_seed(len(deviation)))
        count = round(self.ratio * int(self.candidates.sum()))
        ranked = deviation.masked_fill(~self.candidates, float("-inf")).argsort(descending=True)
        fresh = ~self.candidates
        fresh[ranked[:count]] = True
        return fresh

    @property
    def recomputed_share(self) -> float:
        """Prompt tokens recomputed after the check layer, over all prompt tokens."""
        return float(self.fresh.float().mean()) if self.fresh is not None else 1.0


_ACTIVE: list[Blend] = []  # the prompt being answered; transformers' hook has no other way to reach it
AttentionInterface.register(HOOK, lambda *args, **kwargs: _ACTIVE[-1](*args, **kwargs))


@torch.no_grad()
def blended_answer(model, ids: list[int], cached_bias: torch.Tensor, fresh_bias: torch.Tensor, blend: Blend,
                   stop: set[int], max_tokens: int) -> list[int]:  # fmt: skip
    """Greedy tokens after the prompt: one pass under ``cached_bias`` (the layout's rule) records
    the cache, a second under ``fresh_bias`` (what a token computed in context sees) blends;
    decode then reads the blended keys and values."""
    model.set_attn_implementation(HOOK)
    _ACTIVE.append(blend)
    try:
        positions = torch.arange(len(ids))[None]
        inputs = torch.tensor([ids])
        blend.mode = "record"
        model(input_ids=inputs, attention_mask=cached_bias[None, None], position_ids=positions, use_cache=False)
        blend.mode = "blend"
        out = model(input_ids=inputs, attention_mask=fresh_bias[None, None], position_ids=positions)
        for layer, (key, value) in blend.blended.items():
            out.past_key_values.layers[layer].keys, out.past_key_values.layers[layer].values = key, value
        blend.mode = "off"
        generated: list[int] = []
        for step in range(max_tokens):
            token = int(out.logits[0, -1].argmax())
            if token in stop:
                break
            generated.append(token)
            mask = torch.zeros(1, 1, 1, len(ids) + step + 1)
            out = model(input_ids=torch.tensor([[token]]), attention_mask=mask, past_key_values=out.past_key_values,
                        position_ids=torch.tensor([[len(ids) + step]]))  # fmt: skip
        return generated
    finally:
        _ACTIVE.pop()
        model.set_attn_implementation("eager")
