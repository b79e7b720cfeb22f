"""MiniPIC's activation: a ``"minipic"`` section in vLLM's ``additional_config``.

Living inside ``additional_config`` puts activation in ``VllmConfig.compute_hash``,
so torch.compile caches never mix graphs built with and without PIC.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

CONFIG_KEY = "minipic"
_FIELDS = ("ssep_token_id", "pdep_token_id", "pad_token_id")
_OPTIONS = ("require_cache_salt",)


class MiniPICConfigError(ValueError):
    """The MiniPIC section of the configuration, or the setup around it, is unusable."""


@dataclass(frozen=True)
class PicConfig:
    """Marker token ids; a block whose first prompt token is one of them changes hashing.
    `require_cache_salt`: requests without a ``cache_salt`` are refused (`salt_policy`)."""

    ssep_token_id: int
    pdep_token_id: int
    pad_token_id: int
    require_cache_salt: bool = False

    def __post_init__(self) -> None:
        for name in _FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise MiniPICConfigError(f"minipic.{name} must be a non-negative integer, got {value!r}")
        salt = self.require_cache_salt
        if not isinstance(salt, bool):
            raise MiniPICConfigError(f"minipic.require_cache_salt must be true or false, got {salt!r}")
        ids = [getattr(self, name) for name in _FIELDS]
        if len(set(ids)) != len(ids):
            raise MiniPICConfigError(
                "minipic marker ids must differ from each other, got "
                + ", ".join(f"{name}={getattr(self, name)}" for name in _FIELDS)
            )

    @property
    def marker_ids(self) -> tuple[int, int, int]:
        return (self.ssep_token_id, self.pdep_token_id, self.pad_token_id)

    def to_additional_config(self) -> dict[str, dict[str, int]]:
        return {CONFIG_KEY: asdict(self)}

    @classmethod
    def from_section(cls, section: Any) -> PicConfig:
        if not isinstance(section, Mapping):
            raise MiniPICConfigError(
                f"additional_config.{CONFIG_KEY} must be an object with {', '.join(_FIELDS)}"
            )
        unknown = sorted(set(section) - set(_FIELDS) - set(_OPTIONS))
        missing = [name for name in _FIELDS if name not in section]
        if unknown or missing:
            raise MiniPICConfigError(
                f"additional_config.{CONFIG_KEY}: missing {missing or 'nothing'}, "
                f"unknown {unknown or 'nothing'}; expected {list(_FIELDS)}, optionally {list(_OPTIONS)}"
            )
        return cls(**section)


def pic_config_of(vllm_config: Any) -> PicConfig | None:
    """The active MiniPIC configuration, or None when PIC is off (stock vLLM)."""
    additional = getattr(vllm_config, "additional_config", None) or {}
    if CONFIG_KEY not in additional:
        return None
    return PicConfig.from_section(additional[CONFIG_KEY])
