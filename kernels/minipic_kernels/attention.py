"""GPU attention over block-relative keys: which kernel computes which rows of a step.

Implements the contract of `minipic_kernels.reference.paged_rope_attention_reference`.
A step's requests fall into three groups, each computed by the fastest kernel that is
exact for it:

* **decode** (at most `decode_query_limit` query tokens): the Triton kernel, rotating the
  query per KV block instead of the keys, so K/V stream from the paged cache into the dot
  (memory-bound: one pass over K/V);
* **prefill without windows** (every row's window starts at 0, which is what a span
  prefill, a final prompt over cached spans and a plain prompt are): the step's keys are
  rotated once into scratch pages (`rotary_pages`), then a stock causal paged kernel
  (FlashAttention in vLLM) runs over them;
* **prefill with windows** (spans computed inside a prompt): the Triton tile kernel over
  the same scratch pages, skipping key tiles outside each row's window.

Which requests have windows is only known on the device (it depends on the block record),
so both prefill kernels are launched and each skips the other's requests: no host sync.
Scratch sizes come from a `StepPlan` that the metadata builder computes once per step
from host-side lengths. Without a stock kernel (``paged_attention=None``) the tile kernel
takes every prefill request; when the scratch would exceed its budget it rotates keys
in registers instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import torch

from minipic_kernels.block_kinds import requests_with_windows, window_starts_per_block
from minipic_kernels.rotary_pages import page_table, rotate_into_pages
from minipic_kernels.triton_attention import (
    AttentionConfig,
    TileLaunch,
    decode_config,
    decode_query_limit,
    launch,
    prefill_config,
)

__all__ = ["PagedAttention", "StepPlan", "paged_rope_attention", "plan_step"]


class PagedAttention(Protocol):
    """A stock causal attention over pre-rotated paged keys (FlashAttention's paged varlen).

    Row ``i`` of request ``r`` sits at position ``seq_used[r] - q_len + i`` and attends to
    keys ``0 ..`` that position; requests with ``seq_used[r] == 0`` may be written with
    anything (later kernels overwrite them).
    """

    def __call__(
        self,
        query: torch.Tensor,
        key_pages: torch.Tensor,
        value_pages: torch.Tensor,
        page_table: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_used: torch.Tensor,
        max_query_len: int,
        max_seq_len: int,
        scale: float,
        out: torch.Tensor,
    ) -> None: ...


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """Host-side facts about one step, shared by all layers.

    ``page_start`` (on the device) gives each prefill request its first scratch page, -1
    for the others; None when the step's scratch would exceed the budget.
    """

    max_query_len: int
    max_seq_len: int
    max_decode_query_len: int
    has_decode: bool
    has_prefill: bool
    page_start: torch.Tensor | None = None
    page_table: torch.Tensor | None = None  # (num_reqs, max_pages) scratch page ids
    num_pages: int = 0
    max_pages: int = 0
    # Set by `routed` once per step: keys per request for the stock kernel (0: not its
    # request) and the tile kernel's per-request flags.
    dense_seq_used: torch.Tensor | None = None
    tile_flags: torch.Tensor | None = None

    def routed(self, windowed: torch.Tensor, seq_lens: torch.Tensor) -> StepPlan:
        """Split the prefill requests between the stock kernel (no windows) and the tile
        kernel (windows), given `requests_with_windows` for this step."""
        if self.page_start is None:
            return self
        has_pages = self.page_start >= 0
        return dataclasses.replace(
            self,
            dense_seq_used=torch.where(has_pages & ~windowed, seq_lens, 0).to(torch.int32),
            tile_flags=(has_pages & windowed).to(torch.int8),
        )


def plan_step(
    query_lens: Sequence[int],
    seq_lens: Sequence[int] | None,
    query_start_loc: torch.Tensor,
    seq_lens_device: torch.Tensor,
    *,
    max_seq_len: int,
    block_size: int,
    group: int,
    page_bytes: int,
    scratch_budget_bytes: int,
) -> StepPlan:
    """Plan a step from host-side query lengths and (upper bounds on) sequence lengths.

    Scratch sizes are host ints from the host lengths (``seq_lens=None`` bounds every
    request by ``max_seq_len``); each request's first page is computed on the device
    from the device lengths (exact, never above the bounds): no host-to-device copy.
    ``page_bytes`` is one scratch page of keys plus values.
    """
    limit = decode_query_limit(group)
    is_prefill = [q > limit for q in query_lens]
    decode_lens = [q for q in query_lens if 0 < q <= limit]
    plan = StepPlan(
        max_query_len=max(query_lens, default=0),
        max_seq_len=max_seq_len,
        max_decode_query_len=max(decode_lens, default=0),
        has_decode=bool(decode_lens),
        has_prefill=any(is_prefill),
    )
    if not plan.has_prefill:
        return plan
    lengths = seq_lens if seq_lens is not None else [max_seq_len] * len(query_lens)
    pages = [-(-int(n) // block_size) if prefill else 0 for prefill, n in zip(is_prefill, lengths)]
    if sum(pages) * page_bytes > scratch_budget_bytes:
        return plan
    device_q_lens = query_start_loc[1:] - query_start_loc[:-1]
    prefill = device_q_lens > limit
    device_pages = torch.where(prefill, (seq_lens_device + block_size - 1) // block_size, 0)
    page_start = torch.where(prefill, torch.cumsum(device_pages, 0) - device_pages, -1).to(torch.int32)
    return dataclasses.replace(
        plan,
        page_start=page_start,
        page_table=page_table(page_start, max(pages)),
        num_pages=sum(pages),
        max_pages=max(pages),
    )


def paged_rope_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_kind: torch.Tensor,
    cos_sin: torch.Tensor,
    rotary_dim: int,
    is_neox: bool,
    scale: float,
    output: torch.Tensor | None = None,
    *,
    plan: StepPlan | None = None,
    window_starts: torch.Tensor | None = None,
    windowed: torch.Tensor | None = None,
    paged_attention: PagedAttention | None = None,
    scratch_budget_bytes: int = 1 << 30,
    prefill: AttentionConfig | None = None,
    decode: AttentionConfig | None = None,
) -> torch.Tensor:
    """Attention of each request's query rows over its paged, block-relative keys.

    Shapes and semantics as `paged_rope_attention_reference`. ``plan`` comes from
    `plan_step` (computed here with a host sync when omitted, for standalone use);
    ``window_starts`` and ``windowed`` (`requests_with_windows`) may be passed when the
    caller derived them once for the step. ``output`` must not alias the inputs.
    ``prefill``/``decode`` override the launch configurations (tests, benchmarks).
    """
    num_tokens, num_q_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    if output is None:
        output = torch.empty_like(query)
    if num_tokens == 0:
        return output
    if window_starts is None:
        window_starts = window_starts_per_block(block_table, block_kind, block_size)
    if plan is None:
        qsl = query_start_loc.tolist()
        lengths = seq_lens.tolist()
        plan = plan_step(
            [b - a for a, b in zip(qsl, qsl[1:])],
            lengths,
            query_start_loc,
            seq_lens,
            max_seq_len=max(lengths, default=0),
            block_size=block_size,
            group=num_q_heads // num_kv_heads,
            page_bytes=2 * key_cache[0].numel() * key_cache.element_size(),
            scratch_budget_bytes=scratch_budget_bytes,
        )
    work = TileLaunch(
        query, key_cache, value_cache, block_table, query_start_loc, seq_lens, window_starts,
        cos_sin, rotary_dim, bool(is_neox), float(scale), plan.max_seq_len,
    )  # fmt: skip
    if plan.has_prefill:
        cfg = prefill or prefill_config(head_size)
        _prefill(work, output, plan, cfg, windowed, paged_attention, num_tokens)
    if plan.has_decode:
        launch(work, output, decode or decode_config(head_size), decode=True, num_tokens=num_tokens,
               max_query_len=plan.max_decode_query_len)  # fmt: skip
    return output


def _prefill(
    work: TileLaunch,
    output: torch.Tensor,
    plan: StepPlan,
    cfg: AttentionConfig,
    windowed: torch.Tensor | None,
    paged_attention: PagedAttention | None,
    num_tokens: int,
) -> None:
    if plan.page_start is None or not work.rotary_dim:
        launch(work, output, cfg, decode=False, num_tokens=num_tokens, max_query_len=plan.max_query_len)
        return
    key_pages, value_pages = rotate_into_pages(
        work.key_cache, work.value_cache, work.block_table, work.seq_lens, plan.page_start,
        work.cos_sin, work.rotary_dim, work.is_neox, num_pages=plan.num_pages, max_pages=plan.max_pages,
    )  # fmt: skip
    scratch = dataclasses.replace(
        work, key_cache=key_pages, value_cache=value_pages, block_table=plan.page_table, rotary_dim=0
    )
    if paged_attention is not None:
        if plan.dense_seq_used is None:
            if windowed is None:
                windowed = requests_with_windows(
                    work.window_starts, work.query_start_loc, work.seq_lens, work.key_cache.shape[1]
                )
            plan = plan.routed(windowed, work.seq_lens)
        paged_attention(
            work.query, key_pages, value_pages, plan.page_table, work.query_start_loc, plan.dense_seq_used,
            plan.max_query_len, plan.max_seq_len, work.scale, output,
        )  # fmt: skip
    launch(scratch, output, cfg, decode=False, num_tokens=num_tokens, max_query_len=plan.max_query_len,
           req_flags=plan.tile_flags if paged_attention is not None else None)  # fmt: skip
