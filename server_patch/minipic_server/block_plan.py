"""Scheduler side of the block records: each block's kind and origin, decided where vLLM allocates it.

A KV block's record is a function of its tokens and where its hash chain starts
(`minipic_protocol.blocks`): its *kind* from its first prompt token, and its *origin*,
the canonical logical index its keys are stored at:

- a block in a span (its hash chains from the span's SSep/HSep block, whatever came
  before): its offset from the span's first block, so the span's keys are stored as if the
  span opened the prompt, which is where a span prefill computes them;
- any other block (its hash covers the whole prompt before it, which pins where it sits):
  its own logical index, where stock vLLM computes and stores it.

Because the origin follows from the hash, a block whose KV arrives without being computed
here (a prefix hit, an adopted gapped run, a block reloaded from CPU offloading) gets the
right record from the request that uses it. A block computed away from its origin (a span
computed inside a longer prompt) is stored normalised: the cache write rotates its keys
back by ``write_shift`` blocks (`minipic_kernels.kv_write`).

In the compact reading (``--compact``) a block also records its unread head and tail (the
PDep marker opening it, its trailing pads: `minipic_protocol.compact.unread_ends_of_blocks`),
from its tokens too; outside it both stay 0.

After each ``schedule()`` the engine ships `StepRecords` for every block that entered a
request's block table this step (new requests, resumed ones, new slots, adopted runs,
external loads), so the worker sets them before the step's forward
(`minipic_server.block_records`), and a write shift for each block a request computes
(not for the blocks it found cached). Only the block table's newest entries are new, so
the cost is one record per allocated block.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minipic_protocol.blocks import BlockKind, in_span, marker_runs, opens_span
from minipic_protocol.compact import unread_ends_of_blocks
from minipic_server.boundary import ENGINE_PLANNER, REQUEST_RECORDS, SCHEDULE, STEP_RECORDS, Request, patch_instance
from minipic_server.config import PicConfig


@dataclass
class StepRecords:
    """The records of the blocks that entered block tables in one step, by physical id, and
    the write shifts of the blocks the step computes.

    ``write_shifts[i]``: logical index minus origin of block ``written_ids[i]`` in the request
    computing it (its keys are rotated back by that many blocks when stored); 0 at its origin.
    A block can enter two tables in one step: computed by one request and found in the
    prefix cache by another scheduled after it, at another place. Its kind and origin are the
    same in both (they follow from its hash); how its keys are stored is the computing
    request's alone, so only that request gives it a write shift.
    """

    num_blocks: int
    block_ids: list[int] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)
    written_ids: list[int] = field(default_factory=list)
    write_shifts: list[int] = field(default_factory=list)
    # The compact reading's unread heads and tails of ``block_ids`` (empty outside it).
    unread_heads: list[int] = field(default_factory=list)
    unread_tails: list[int] = field(default_factory=list)

    def add(self, block_ids: list[int], records: _RequestRecords, new: slice, first_written: int) -> None:
        """The request's blocks at logical indices ``new``, in order; those from logical index
        ``first_written`` on are computed by the request this step (the ones before are hits)."""
        first_logical, origins = new.start, records.origins[new]
        self.block_ids += block_ids
        self.kinds += records.kinds[new]
        self.origins += origins
        self.unread_heads += records.unread_heads[new]
        self.unread_tails += records.unread_tails[new]
        hits = min(max(first_written - first_logical, 0), len(block_ids))
        self.written_ids += block_ids[hits:]
        logical = range(first_logical + hits, first_logical + len(block_ids))
        self.write_shifts += map(operator.sub, logical, origins[hits:])


@dataclass
class _RequestRecords:
    """One request's records by logical block, extended as its table grows."""

    kinds: list[BlockKind] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)
    unread_heads: list[int] = field(default_factory=list)  # compact reading only (else empty)
    unread_tails: list[int] = field(default_factory=list)
    in_span: bool = False
    span_start: int = 0

    def extend(self, start: int, end: int, kind: BlockKind = BlockKind.PLAIN) -> None:
        """Logical blocks ``start`` to ``end``: the first of kind `kind`, the others plain."""
        if start >= end:
            return
        self.in_span = in_span(kind, self.in_span)
        if opens_span(kind):
            self.span_start = start
        self.kinds += [kind, *[BlockKind.PLAIN] * (end - start - 1)]
        base = self.span_start if self.in_span else 0
        self.origins += range(start - base, end - base)


def records_of_request(request: Request, num_blocks: int, block_size: int, pic: PicConfig) -> _RequestRecords:
    """The request's records for its first ``num_blocks`` logical blocks (cached on it), made per
    marker run (`marker_runs`): a new request's table can hold thousands of cached blocks."""
    state: _RequestRecords | None = getattr(request, REQUEST_RECORDS.attribute, None)
    if state is None:
        state = _RequestRecords()
        patch_instance(REQUEST_RECORDS, request, state)
    first = len(state.kinds)
    if first >= num_blocks:
        return state
    # Only prompt tokens act as markers (generated ones are banned from sampling).
    prompt_end = min(num_blocks * block_size, request.num_prompt_tokens)
    firsts = request.all_token_ids[first * block_size : prompt_end : block_size]
    runs = marker_runs(firsts, pic.block_kinds)
    state.extend(first, first + (runs[0][0] if runs else len(firsts)))  # continuing the blocks before
    for start, kind, end in runs:
        state.extend(first + start, first + end, kind)
    state.extend(first + len(firsts), num_blocks)  # generated blocks continue the last run
    if pic.compact:
        heads, tails = unread_ends_of_blocks(request.all_token_ids[:prompt_end], block_size, pic.roles, first)
        generated = num_blocks - first - len(heads)
        state.unread_heads += heads + [0] * generated
        state.unread_tails += tails + [0] * generated
    return state


class BlockPlanner:
    """Ships each step's new block records with the scheduler's output, for one engine."""

    def __init__(self, scheduler: Any, pic: PicConfig) -> None:
        manager = scheduler.kv_cache_manager
        self._tables: dict[str, list[Any]] = manager.coordinator.single_type_managers[0].req_to_blocks
        self._requests: dict[str, Request] = scheduler.requests
        self._num_blocks: int = manager.block_pool.num_gpu_blocks
        self._block_size: int = scheduler.block_size
        self._pic = pic

    def install(self, scheduler: Any) -> None:
        patch_instance(SCHEDULE, scheduler, self.wrap(scheduler.schedule))

    def wrap(self, schedule: Callable[..., Any]) -> Callable[..., Any]:
        def schedule_with_records(*args: Any, **kwargs: Any) -> Any:
            output = schedule(*args, **kwargs)
            patch_instance(STEP_RECORDS, output, self.records(output))
            return output

        return schedule_with_records

    def records(self, output: Any) -> StepRecords:
        step = StepRecords(self._num_blocks)
        for new in output.scheduled_new_reqs:
            self._add(step, new.req_id, len(new.block_ids[0]), new.num_computed_tokens)
        cached = output.scheduled_cached_reqs
        for req_id, new_ids, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            if new_ids is not None and new_ids[0]:
                self._add(step, req_id, len(new_ids[0]), computed)
        return step

    def _add(self, step: StepRecords, req_id: str, num_new: int, num_computed: int) -> None:
        """The last ``num_new`` blocks of the request's table are the ones it got this step; it
        computes from token ``num_computed`` on (the step's count before it, hits included)."""
        table = self._tables[req_id]
        records = records_of_request(self._requests[req_id], len(table), self._block_size, self._pic)
        new = slice(len(table) - num_new, len(table))
        step.add([block.block_id for block in table[new]], records, new, num_computed // self._block_size)


def install_block_planner(engine: Any, pic: PicConfig) -> None:
    """Once per engine: every scheduler output carries its step's block records."""
    if getattr(engine, ENGINE_PLANNER.attribute, None) is not None:
        return
    planner = BlockPlanner(engine.scheduler, pic)
    planner.install(engine.scheduler)
    patch_instance(ENGINE_PLANNER, engine, planner)
