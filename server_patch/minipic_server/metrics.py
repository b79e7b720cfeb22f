"""Prometheus counters of span reuse, served on vLLM's own ``/metrics``.

They are counted in the API-server process, where vLLM's ``/metrics`` lives:
when a request finishes, its prompt ids and its prefix-cache hit are both known
there, and the block rule of `minipic_protocol.blocks` tells which prompt
blocks were spans, SSep, HSep or PDep blocks. Like vLLM's own request metrics, they
are not counted with ``--disable-log-stats``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from minipic_protocol.blocks import BlockKind, block_kind_of, in_span
from minipic_server.config import PicConfig


@dataclass(frozen=True)
class PromptAccount:
    """What one prompt's PIC markers did, given how much of it the prefix cache held."""

    span_blocks_reused: int = 0
    ssep_blocks_computed: int = 0
    pdep_blocks_computed: int = 0
    windowed_tokens: int = 0
    hsep_blocks_computed: int = 0

    @property
    def has_markers(self) -> bool:
        return bool(
            self.span_blocks_reused or self.ssep_blocks_computed or self.pdep_blocks_computed
            or self.hsep_blocks_computed
        )


def account(token_ids: Sequence[int], num_cached_tokens: int, block_size: int, pic: PicConfig) -> PromptAccount:
    """Count a prompt's span blocks served from the cache, and its marker blocks and span tokens computed.

    A block is in a span as the block hashes say (`in_span`); a computed token in
    a span block attends from its span's start, not from the prompt's: windowed.
    A marker block is computed when it starts at or after the cached prefix.
    """
    reused = ssep = pdep = hsep = windowed = 0
    spanning = False
    for start in range(0, len(token_ids), block_size):
        kind = block_kind_of(token_ids[start], *pic.kind_marker_ids)
        spanning = in_span(kind, spanning)
        end = min(start + block_size, len(token_ids))
        computed = end - max(start, num_cached_tokens)
        if spanning and end <= num_cached_tokens:
            reused += 1
        if spanning and computed > 0:
            windowed += computed
        if start >= num_cached_tokens:
            ssep += kind is BlockKind.SSEP
            pdep += kind is BlockKind.PDEP
            hsep += kind is BlockKind.HSEP
    return PromptAccount(reused, ssep, pdep, windowed, hsep)


class _Counters:
    def __init__(self) -> None:
        self.span_blocks_reused = Counter(
            "minipic:span_blocks_reused", "Prompt blocks inside SSep or HSep spans served from the prefix cache."
        )
        self.marker_blocks_computed = Counter(
            "minipic:marker_blocks_computed",
            "Prompt blocks starting with an SSep, HSep or PDep marker that were computed (not served from the cache).",
            ["kind"],
        )
        self.windowed_tokens = Counter(
            "minipic:windowed_tokens",
            "Prompt tokens computed inside a span: attending from the span's start, not the prompt's.",
        )
        self.requests_with_markers = Counter(
            "minipic:requests_with_markers", "Finished requests whose prompt has SSep, HSep or PDep blocks."
        )

    def add(self, prompt: PromptAccount) -> None:
        if not prompt.has_markers:
            return
        self.requests_with_markers.inc()
        self.span_blocks_reused.inc(prompt.span_blocks_reused)
        self.marker_blocks_computed.labels(kind="ssep").inc(prompt.ssep_blocks_computed)
        self.marker_blocks_computed.labels(kind="pdep").inc(prompt.pdep_blocks_computed)
        self.marker_blocks_computed.labels(kind="hsep").inc(prompt.hsep_blocks_computed)
        self.windowed_tokens.inc(prompt.windowed_tokens)


@dataclass
class _Settings:
    pic: PicConfig
    block_size: int
    counters: _Counters


_settings: _Settings | None = None


def configure(pic: PicConfig, block_size: int) -> None:
    """Start counting in this process (the engine configuration just activated PIC)."""
    global _settings
    counters = _settings.counters if _settings is not None else _Counters()
    _settings = _Settings(pic, block_size, counters)


def wrap_update_stats_from_finished(original: Callable[..., None]) -> Callable[..., None]:
    def _update_stats_from_finished(self: Any, req_state: Any, finish_reason: Any, iteration_stats: Any) -> None:
        original(self, req_state, finish_reason, iteration_stats)
        if _settings is None or iteration_stats is None or req_state.prompt_token_ids is None:
            return
        prompt = account(req_state.prompt_token_ids, req_state.num_cached_tokens, _settings.block_size, _settings.pic)
        _settings.counters.add(prompt)

    return _update_stats_from_finished
