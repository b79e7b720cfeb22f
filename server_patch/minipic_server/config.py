"""MiniPIC's activation: a ``"minipic"`` section in vLLM's ``additional_config``.

Living inside ``additional_config`` puts activation in ``VllmConfig.compute_hash``,
so torch.compile caches never mix graphs built with and without PIC.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from minipic_protocol.blocks import BlockKind, marker_kinds
from minipic_protocol.markers import MarkerIds

CONFIG_KEY = "minipic"
_FIELDS = ("ssep_token_id", "pdep_token_id", "pad_token_id")
# Optional: a configuration written before hidden heads existed has no HSep marker.
_OPTIONAL_FIELDS = ("hsep_token_id",)
_OPTIONS = ("require_cache_salt", "embed_markers_as", "compact", "span_bias")


class MiniPICConfigError(ValueError):
    """The MiniPIC section of the configuration, or the setup around it, is unusable."""


@dataclass(frozen=True)
class PicConfig:
    """Marker token ids; a block whose first prompt token is one of them changes hashing
    (``hsep_token_id`` None: no hidden heads on this server). `require_cache_salt`:
    requests without a ``cache_salt`` are refused (`salt_policy`). `embed_markers_as`: the
    model reads SSep, PDep and HSep through this ordinary token's embedding
    (`marker_embedding`; None: their own rows). `compact`: the compact reading
    (`minipic_protocol.compact`): pads and PDep markers unread and given no position. It is the
    default because a model never trained on MiniPIC's markers answers nearly as with full
    attention in it (docs/accuracy.md); False keeps the plain reading, for models trained to
    read the markers. `span_bias`: added to the logit of every key inside a span read from outside
    every span (`minipic_protocol.weighed_by_span_bias`), so a question reads the passages computed
    apart that much less (negative) or more; 0 leaves attention as the block rule gives it."""

    ssep_token_id: int
    pdep_token_id: int
    pad_token_id: int
    hsep_token_id: int | None = None
    require_cache_salt: bool = False
    embed_markers_as: int | None = None
    compact: bool = True
    span_bias: float = 0.0

    def __post_init__(self) -> None:
        for name, value in self.markers.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise MiniPICConfigError(f"minipic.{name} must be a non-negative integer, got {value!r}")
        if len(set(self.marker_ids)) != len(self.marker_ids):
            raise MiniPICConfigError(
                "minipic marker ids must differ from each other, got "
                + ", ".join(f"{name}={value}" for name, value in self.markers.items())
            )
        for flag in ("require_cache_salt", "compact"):
            if not isinstance(getattr(self, flag), bool):
                raise MiniPICConfigError(f"minipic.{flag} must be true or false, got {getattr(self, flag)!r}")
        bias = self.span_bias
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise MiniPICConfigError(f"minipic.span_bias must be a finite number, got {bias!r}")
        stand_in = self.embed_markers_as
        if stand_in is not None and (isinstance(stand_in, bool) or not isinstance(stand_in, int) or stand_in < 0):
            raise MiniPICConfigError(f"minipic.embed_markers_as must be a token id, got {stand_in!r}")
        if stand_in in self.marker_ids:
            raise MiniPICConfigError(f"minipic.embed_markers_as must be an ordinary token, not the marker {stand_in}")

    @property
    def markers(self) -> dict[str, int]:
        """The configured markers by field name (no ``hsep_token_id`` when unset)."""
        fields = (*_FIELDS, *(name for name in _OPTIONAL_FIELDS if getattr(self, name) is not None))
        return {name: getattr(self, name) for name in fields}

    @property
    def marker_ids(self) -> tuple[int, ...]:
        """Every marker id (banned from sampling, kept out of text)."""
        return tuple(self.markers.values())

    @property
    def roles(self) -> MarkerIds:
        """The markers by role, as the protocol's functions take them."""
        return MarkerIds(self.ssep_token_id, self.pdep_token_id, self.pad_token_id, self.hsep_token_id)

    @property
    def kind_marker_ids(self) -> tuple[int, int, int | None]:
        """The ids that give a block a kind, as `minipic_protocol.blocks` takes them."""
        return (self.ssep_token_id, self.pdep_token_id, self.hsep_token_id)

    @cached_property
    def block_kinds(self) -> dict[int, BlockKind]:
        """A block's kind by its first prompt token (`marker_kinds`), made once: the hasher, the
        block planner and the metrics look every marker block up in it."""
        return marker_kinds(*self.kind_marker_ids)

    @property
    def embedded_markers(self) -> tuple[int, ...]:
        """The markers the model reads as `embed_markers_as` (pads keep their own row)."""
        return tuple(marker for marker in self.kind_marker_ids if marker is not None)

    @classmethod
    def from_section(cls, section: Any) -> PicConfig:
        if not isinstance(section, Mapping):
            raise MiniPICConfigError(
                f"additional_config.{CONFIG_KEY} must be an object with {', '.join(_FIELDS)}"
            )
        known = (*_FIELDS, *_OPTIONAL_FIELDS, *_OPTIONS)
        unknown = sorted(set(section) - set(known))
        missing = [name for name in _FIELDS if name not in section]
        if unknown or missing:
            raise MiniPICConfigError(
                f"additional_config.{CONFIG_KEY}: missing {missing or 'nothing'}, "
                f"unknown {unknown or 'nothing'}; expected {list(_FIELDS)}, "
                f"optionally {list((*_OPTIONAL_FIELDS, *_OPTIONS))}"
            )
        return cls(**{name: section[name] for name in known if name in section})


def pic_enabled(vllm_config: Any) -> bool:
    """Whether MiniPIC is on, without parsing its section: the runner's per-step hooks ask."""
    return CONFIG_KEY in (getattr(vllm_config, "additional_config", None) or {})


def pic_config_of(vllm_config: Any) -> PicConfig | None:
    """The active MiniPIC configuration, or None when PIC is off (stock vLLM)."""
    if not pic_enabled(vllm_config):
        return None
    return PicConfig.from_section(vllm_config.additional_config[CONFIG_KEY])
