"""Prometheus counters of span reuse, served on vLLM's own ``/metrics``.

They are counted in the API-server process, where vLLM's ``/metrics`` lives:
when a request finishes, its prompt ids and its prefix-cache hit are both known
there, and the block rule of `minipic_protocol.blocks` tells which prompt
blocks were spans, SSep, HSep or PDep blocks. Like vLLM's own request metrics, they
are not counted with ``--disable-log-stats``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter as PrometheusCounter

from minipic_protocol.blocks import BlockKind, marker_runs, opens_span
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

    Spans are as the block hashes say: a run of blocks from a marker block up to the next
    (`marker_runs`) is a span when its marker opens one; a computed token in a span block
    attends from its span's start, not from the prompt's: windowed. A marker block is
    computed when it starts at or after the cached prefix. The work is per marker run, not
    per block: this runs in the API server before a finished request's last output, for
    prompts of tens of thousands of tokens.
    """
    firsts = token_ids[::block_size]
    # Blocks wholly in the cached prefix (a short last block counts when the whole prompt is cached).
    cached_blocks = len(firsts) if num_cached_tokens >= len(token_ids) else num_cached_tokens // block_size
    reused = windowed = 0
    computed: Counter[BlockKind] = Counter()
    for block, kind, end in marker_runs(firsts, pic.block_kinds):
        if block * block_size >= num_cached_tokens:
            computed[kind] += 1
        if opens_span(kind):
            reused += max(0, min(end, cached_blocks) - block)
            windowed += max(0, min(end * block_size, len(token_ids)) - max(block * block_size, num_cached_tokens))
    return PromptAccount(reused, computed[BlockKind.SSEP], computed[BlockKind.PDEP], windowed, computed[BlockKind.HSEP])


class _Counters:
    def __init__(self) -> None:
        self.span_blocks_reused = PrometheusCounter(
            "minipic:span_blocks_reused", "Prompt blocks inside SSep or HSep spans served from the prefix cache."
        )
        self.marker_blocks_computed = PrometheusCounter(
            "minipic:marker_blocks_computed",
            "Prompt blocks starting with an SSep, HSep or PDep marker that were computed (not served from the cache).",
            ["kind"],
        )
        self.windowed_tokens = PrometheusCounter(
            "minipic:windowed_tokens",
            "Prompt tokens computed inside a span: attending from the span's start, not the prompt's.",
        )
        self.requests_with_markers = PrometheusCounter(
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
