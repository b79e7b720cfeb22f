"""GPU attention over position-stamped keys: which kernel computes which rows of a step.

Implements the contract of `minipic_kernels.reference.paged_rope_attention_reference`.
A step's requests fall into four groups, each computed by the fastest kernel that is
exact for it:

* **decode** (at most `decode_query_limit` query tokens): the Triton kernel, K/V from the
  paged cache straight into the dot (memory-bound: one pass over K/V), keys of misplaced
  blocks rotated in registers, windows and hidden blocks honoured;
* **prefill at origin** (no windows, every block where it was computed: plain prompts,
  prefix hits, a request's own earlier chunks, span prefills): a stock causal paged kernel
  (FlashAttention-3 in vLLM) over the cache itself, as stock vLLM runs it;
* **prefill over scratch pages**: window-free requests over misplaced blocks (a cached
  span placed after another prefix: ISPS final prompts), and requests whose rows all lie
  outside spans and skip only keys before their read rows (`StepTensors.compactable`: hidden
  blocks, refreshed-heads final prompts; in the compact reading also unread pads and markers,
  any final prompt over cached spans): keys moved into scratch pages once (`rotary_pages`),
  the skipped ones left out (`Scratch`), then the stock kernel over them;
* **prefill with masks** (spans computed inside a prompt, or span rows among rows that
  must skip a hidden block: FlashAttention-3 can neither start a row's keys late nor skip a
  block for some rows only; under a span bias also any row outside spans after a span
  block, which FlashAttention-3 cannot weigh): the Triton tile kernel over the cache,
  skipping key tiles outside each row's window and masking hidden blocks.

Which requests have masks (and which of those are compactable) or misplaced blocks is
known on the device (from the block records, `step_tensors`); `StepPlan.routed` brings those
flags to the host once per step with longer prefill (one small sync, before any layer runs), so every layer
launches only the kernels that have work. A step whose scratch pages would exceed the
budget sends their requests to the tile kernel instead. The stock kernel computes only the
rows it is given (``query_used``), so the launches never overwrite each other. Without a
stock kernel (``paged_attention=None``) the tile kernel takes every prefill request.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Protocol

import torch

from minipic_kernels.block_kinds import requests_weighing_span_keys
from minipic_kernels.rotary_pages import page_table, rotate_into_pages
from minipic_kernels.step_tensors import COMPACTABLE, MASKED, MOVED, StepTensors, derive_step_tensors
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
    """A stock causal attention over paged keys as they are (FlashAttention-3's paged varlen).

    Row ``i < query_used[r]`` of request ``r`` sits at position ``seq_used[r] - query_used[r] + i``
    and attends to keys ``0 ..`` that position; rows of requests with ``query_used[r] == 0``
    are left untouched.
    """

    def __call__(
        self,
        query: torch.Tensor,
        key_pages: torch.Tensor,
        value_pages: torch.Tensor,
        page_table: torch.Tensor,
        query_start_loc: torch.Tensor,
        query_used: torch.Tensor,
        seq_used: torch.Tensor,
        max_query_len: int,
        max_seq_len: int,
        scale: float,
        out: torch.Tensor,
    ) -> None: ...


@dataclasses.dataclass(frozen=True)
class Scratch:
    """Scratch pages of the requests the stock kernel reads there: ``page_start`` (device)
    gives each its first page, -1 for the others. A request's pages hold the tokens it keeps
    (`step_tensors.kept_slots`) in index order, token by token (``kept_start``): every key,
    but for a compactable request (`StepTensors.compactable`) none of its hidden blocks and, in
    the compact reading, none of its unread tokens.

    Why the stock kernel, placing a request's ``q`` rows at the end of its ``seq_used`` keys,
    is exact for a compactable request: its rows lie outside every span and come as
    ``[u unread rows][r read rows]`` (u >= 0, none outside the compact reading) after every
    hidden block and unread key, so its pages hold ``kept_ctx + r`` keys, the unread rows not
    among them. Read row j then sits at index ``kept_ctx + j`` and sees exactly the kept keys up
    to it: the keys its reading gives it (every key but hidden blocks and unread tokens). An
    unread row sees a prefix of the kept keys (none at all where ``u > kept_ctx``: the stock
    kernel gives it 0), finite, and no read row sees its output: the compact reading leaves
    unread rows unspecified but finite (`compact_shifts.read_keys`). Positions come from the
    rotations alone: each key by its block's ``key_shift`` (`rotate_into_pages`) and, in the
    compact reading, further by ``row_shift``, its request's read rows' compact shift: those rows
    reach the stock kernel rotated at their indices, that many positions past their compact
    positions, so keys moved as far score alike (every read row shares the shift: no unread token
    follows the first)."""

    page_start: torch.Tensor
    page_table: torch.Tensor  # (num_reqs, max_pages) scratch page ids
    kept_start: torch.Tensor  # each logical block's first token on the pages after its request's first (`StepTensors`)
    compactable: torch.Tensor  # int8 per request (`StepTensors.compactable`): keeps only what its rows read
    # (num_reqs,) int32: the compact shift of each compactable request's read rows (its last row's
    # `StepTensors.query_shift`), 0 for the others; None outside the compact reading
    row_shift: torch.Tensor | None
    query_used: torch.Tensor  # rows the stock kernel computes over the pages, per request
    seq_used: torch.Tensor  # keys it reads there, per request: the tokens kept (`StepTensors.kept_len`)
    num_pages: int
    max_pages: int


@dataclasses.dataclass(frozen=True)
class Routes:
    """Which kernel computes each prefill request this step (None: no request of that kind)."""

    at_origin: torch.Tensor | None  # stock kernel over the cache: rows per request (0: not its)
    scratch: Scratch | None  # stock kernel over moved keys
    tiles: torch.Tensor | None  # int8 per request: the tile kernel over the cache


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """Host-side facts about one step, shared by all layers; `routed` adds the routes."""

    query_lens: tuple[int, ...]
    seq_len_bounds: tuple[int, ...]  # host upper bounds of the device lengths
    max_query_len: int
    max_seq_len: int
    max_decode_query_len: int
    has_decode: bool
    has_prefill: bool
    decode_limit: int  # requests with more query tokens are prefill
    block_size: int
    page_bytes: int  # one scratch page of keys plus values
    scratch_budget_bytes: int
    routes: Routes | None = None

    def routed(self, step: StepTensors, weighing: torch.Tensor | None = None) -> StepPlan:
        """Route each prefill request from the step's device flags (`StepTensors`): the
        step's one host sync, none without prefill. Under a span bias ``weighing`` (bool per
        request, `block_kinds.requests_weighing_span_keys`) sends the requests whose rows weigh
        span keys to the tile kernel, the only one that weighs them."""
        if not self.has_prefill or self.routes is not None:
            return self
        rows = step.flags if weighing is None else torch.cat([step.flags, weighing[None].to(step.flags.dtype)])
        flags = rows.cpu()  # the host sync
        masks, compacts, misplaces = (flags[row].tolist() for row in (MASKED, COMPACTABLE, MOVED))
        if weighing is not None:
            weighs = flags[-1].tolist()
            masks = [m or w for m, w in zip(masks, weighs)]
            compacts = [c and not w for c, w in zip(compacts, weighs)]
        prefill = [q > self.decode_limit for q in self.query_lens]
        at_origin = [p and not w and not m for p, w, m in zip(prefill, masks, misplaces)]
        # A compactable request reads its kept keys from scratch, moved or not (`Scratch`); in the compact reading
        # one with an unread token after a read row is not compactable and, masked, goes to tiles
        # (tests/test_attention_routing.py).
        on_scratch = [p and (c or (m and not w)) for p, w, c, m in zip(prefill, masks, compacts, misplaces)]
        tiles = [p and w and not c for p, w, c in zip(prefill, masks, compacts)]
        pages = [-(-n // self.block_size) if s else 0 for s, n in zip(on_scratch, self.seq_len_bounds)]
        if sum(pages) * self.page_bytes > self.scratch_budget_bytes:
            tiles = [t or s for t, s in zip(tiles, on_scratch)]
            on_scratch, pages = [False] * len(on_scratch), [0] * len(on_scratch)
        starts = list(itertools.accumulate(pages, initial=0))
        width = step.flags.shape[1]  # the requests the device tensors hold, padding included
        # Each row starts 16 bytes apart (a row's width rounded up to 4): the rotation kernel
        # reads ``page_start`` with the same alignment whatever the batch size.
        pad = [0] * (-(-width // 4) * 4 - len(self.query_lens))
        rows = torch.tensor(
            [[q if a else 0 for q, a in zip(self.query_lens, at_origin)] + pad,
             [q if s else 0 for q, s in zip(self.query_lens, on_scratch)] + pad,
             [b if s else -1 for b, s in zip(starts, on_scratch)] + [-1] * len(pad),
             [int(t) for t in tiles] + pad,
             [int(s and c) for s, c in zip(on_scratch, compacts)] + pad,
             [max(end - 1, 0) for end in itertools.accumulate(self.query_lens)] + pad],
            dtype=torch.int32,
        ).to(step.flags.device, non_blocking=True)[:, :width]  # fmt: skip
        scratch = None
        if any(on_scratch):
            row_shift = None
            if step.query_shift is not None:  # the shift of each request's last row, kept where it reads compacted
                row_shift = step.query_shift[rows[5].long()] * rows[4]
            scratch = Scratch(rows[2], page_table(rows[2], max(pages)), step.kept_start, step.compactable, row_shift,
                              rows[1], step.kept_len, sum(pages), max(pages))  # fmt: skip
        routes = Routes(
            at_origin=rows[0] if any(at_origin) else None,
            scratch=scratch,
            tiles=rows[3].to(torch.int8) if any(tiles) else None,
        )
        return dataclasses.replace(self, routes=routes)


def plan_step(
    query_lens: Sequence[int],
    seq_lens: Sequence[int] | None,
    *,
    max_seq_len: int,
    block_size: int,
    group: int,
    page_bytes: int,
    scratch_budget_bytes: int,
) -> StepPlan:
    """Plan a step from host-side query lengths and (upper bounds on) sequence lengths
    (``seq_lens=None`` bounds every request by ``max_seq_len``)."""
    limit = decode_query_limit(group)
    decode_lens = [q for q in query_lens if 0 < q <= limit]
    return StepPlan(
        query_lens=tuple(query_lens),
        seq_len_bounds=tuple(seq_lens if seq_lens is not None else [max_seq_len] * len(query_lens)),
        max_query_len=max(query_lens, default=0),
        max_seq_len=max_seq_len,
        max_decode_query_len=max(decode_lens, default=0),
        has_decode=bool(decode_lens),
        has_prefill=any(q > limit for q in query_lens),
        decode_limit=limit,
        block_size=block_size,
        page_bytes=page_bytes,
        scratch_budget_bytes=scratch_budget_bytes,
    )


def paged_rope_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_kind: torch.Tensor,
    block_origin: torch.Tensor,
    cos_sin: torch.Tensor,
    rotary_dim: int,
    is_neox: bool,
    scale: float,
    output: torch.Tensor | None = None,
    *,
    plan: StepPlan | None = None,
    step: StepTensors | None = None,
    paged_attention: PagedAttention | None = None,
    scratch_budget_bytes: int = 1 << 30,
    prefill: AttentionConfig | None = None,
    decode: AttentionConfig | None = None,
    unread: tuple[torch.Tensor, torch.Tensor] | None = None,
    span_bias: float = 0.0,
) -> torch.Tensor:
    """Attention of each request's query rows over its paged keys, each block moved from its
    origin to where the request reads it.

    Shapes and semantics as `paged_rope_attention_reference`. ``plan`` comes from
    `plan_step` and, for a step with prefill, `StepPlan.routed` (both done here, with host
    syncs, when omitted: standalone use); ``step`` (`derive_step_tensors`) may be passed when
    the caller derived it once for the step (with ``unread`` in the compact reading, whose
    ``(unread_head, unread_tail)`` records the kernels then mask unread keys by).
    ``output`` must not alias the inputs. ``prefill``/``decode`` override the launch configurations (tests, benchmarks).
    In the compact reading the queries come as the model rotated them, at their tokens' indices:
    the decode and tile kernels rotate each row back to its compact position by its block's
    shift (`StepTensors.query_shift`) as they load it; the stock kernel reads the rows of
    compactable requests on scratch pages as they are, over keys rotated as much further
    (`Scratch.row_shift`), and over the cache only requests whose shifts are all 0
    (`StepPlan.routed`). ``query`` is never written.
    Moved keys are rotated with ``cos_sin`` in the key cache's dtype, as vLLM's RoPE rotates
    keys with its table in the model's; pass it so (`RopeSpec.unit_cos_sin_in`) to spare a
    conversion per call.
    """
    num_tokens, num_q_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    if output is None:
        output = torch.empty_like(query)
    if num_tokens == 0:
        return output
    cos_sin = cos_sin.to(key_cache.dtype)
    if step is None:
        step = derive_step_tensors(block_table, block_kind, block_origin, query_start_loc, seq_lens, block_size,
                                   unread, num_tokens)  # fmt: skip
    if plan is None:
        qsl = query_start_loc.tolist()
        lengths = seq_lens.tolist()
        plan = plan_step(
            [b - a for a, b in zip(qsl, qsl[1:])],
            lengths,
            max_seq_len=max(lengths, default=0),
            block_size=block_size,
            group=num_q_heads // num_kv_heads,
            page_bytes=2 * key_cache[0].numel() * key_cache.element_size(),
            scratch_budget_bytes=scratch_budget_bytes,
        )
    if plan.routes is None:  # routed once per step (`block_records.derive_step`), not again in every layer
        plan = plan.routed(step, weighing_requests(step, query_start_loc, seq_lens, block_size, span_bias))
    work = TileLaunch(
        query, key_cache, value_cache, block_table, block_kind, block_origin, step.key_shift, step.moved, step.hidden,
        query_start_loc, seq_lens, step.window_starts, cos_sin, rotary_dim, bool(is_neox), float(scale),
        plan.max_seq_len, unread, step.query_shift, span_bias,
    )  # fmt: skip
    if plan.has_prefill:
        _prefill(work, output, plan, prefill or prefill_config(head_size), paged_attention, num_tokens)
    if plan.has_decode:
        launch(work, output, decode or decode_config(head_size), decode=True, num_tokens=num_tokens,
               max_query_len=plan.max_decode_query_len)  # fmt: skip
    return output


def weighing_requests(
    step: StepTensors, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_size: int, span_bias: float
) -> torch.Tensor | None:
    """`StepPlan.routed`'s ``weighing`` under a span bias, None without one."""
    if not span_bias:
        return None
    return requests_weighing_span_keys(step.window_starts, query_start_loc, seq_lens, block_size)


def _prefill(
    work: TileLaunch,
    output: torch.Tensor,
    plan: StepPlan,
    cfg: AttentionConfig,
    paged_attention: PagedAttention | None,
    num_tokens: int,
) -> None:
    routes = plan.routes
    assert routes is not None, "a prefill step is routed before attention"
    tiles = dict(decode=False, num_tokens=num_tokens, max_query_len=plan.max_query_len)
    if paged_attention is None:
        launch(work, output, cfg, **tiles)
        return
    if routes.at_origin is not None:
        paged_attention(
            work.query, work.key_cache, work.value_cache, work.block_table, work.query_start_loc, routes.at_origin,
            work.seq_lens, plan.max_query_len, plan.max_seq_len, work.scale, output,
        )  # fmt: skip
    if routes.scratch is not None:
        scratch = routes.scratch
        key_pages, value_pages = rotate_into_pages(
            work.key_cache, work.value_cache, work.block_table, work.key_shift, work.seq_lens,
            scratch.page_start, scratch.kept_start, scratch.compactable, work.cos_sin, work.rotary_dim, work.is_neox,
            num_pages=scratch.num_pages, max_pages=scratch.max_pages, unread=work.unread, row_shift=scratch.row_shift,
        )  # fmt: skip
        paged_attention(
            work.query, key_pages, value_pages, scratch.page_table, work.query_start_loc, scratch.query_used,
            scratch.seq_used, plan.max_query_len, plan.max_seq_len, work.scale, output,
        )  # fmt: skip
    if routes.tiles is not None:
        launch(work, output, cfg, req_flags=routes.tiles, **tiles)
