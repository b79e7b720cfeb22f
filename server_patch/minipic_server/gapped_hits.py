"""Gapped prefix-cache hits: cached blocks after a miss are reused where they sit.

vLLM's lookup stops at a request's first uncached block, so for
``[sys][A cached][B new][C cached][q]`` it computes B, C and q. MiniPIC's block hashes
make C's cached blocks valid here too: an SSep span hashes without its prefix, and any
other block hashes over exactly the prompt before it, so a hit is a hit wherever it sits.
With span windows every token attends exactly what its hash covers, so reusing C gives
the same answer as computing it.

vLLM computes one contiguous range of each request's tokens per step, from
``num_computed_tokens``. So a gap is filled by ending the prefill chunk where the next
cached run starts (`GapScheduling.chunk_tokens`), and the run is adopted when the request's
next chunk is allocated: its cached blocks are appended to the request's block table and
the computed count moves past them (`GapScheduling.allocate_slots`), as vLLM adopts the
first run of a prefix hit. A prompt with g gaps takes g + 1 prefill steps. Adopted blocks
keep their block records (kind, origin), like any prefix hit, so attention moves them
exactly as it moves a span found by the prefix lookup.

Hooks (`minipic_server.boundary`): the scheduler's per-request chunk-end hook (vLLM's
Mamba block-aligned split, switched on for this), `KVCacheManager.allocate_slots`, and in
vLLM 0.26's GPU model runner a step that copies an advanced computed count to the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from minipic_server.boundary import (
    ENGINE_GAPS,
    SCHEDULER_ALLOCATE_SLOTS,
    SCHEDULER_CHUNK_END,
    SCHEDULER_SPLITS_CHUNKS,
    Request,
    RequestStatus,
    patch_instance,
)
from minipic_server.config import pic_enabled


class GapScheduling:
    """Finds cached runs after a miss and adopts them, for one engine's scheduler.

    The scheduler asks `chunk_tokens` how far a prefill chunk may run, then allocates
    the chunk's slots; a run found at the chunk's start is adopted in that allocation
    (kept in ``_pending`` between the two calls, which vLLM makes back to back).
    """

    def __init__(self, scheduler: Any) -> None:
        manager = scheduler.kv_cache_manager
        self._kv_cache_manager = manager
        self._blocks = manager.coordinator.single_type_managers[0]  # the guards allow one KV cache group
        self._pool = self._blocks.block_pool
        self._block_size: int = scheduler.block_size
        self._allocate = manager.allocate_slots
        self._pending: dict[str, list[Any]] = {}

    def install(self, scheduler: Any) -> None:
        patch_instance(SCHEDULER_SPLITS_CHUNKS, scheduler, True)
        patch_instance(SCHEDULER_CHUNK_END, scheduler, self.chunk_tokens)
        patch_instance(SCHEDULER_ALLOCATE_SLOTS, self._kv_cache_manager, self.allocate_slots)

    def chunk_tokens(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_local_computed_tokens: int = 0,
        num_external_computed_tokens: int = 0,
    ) -> int:
        """How many of the scheduled prefill tokens to compute now: the chunk ends where the
        next cached run starts; a run at the chunk's start is adopted first."""
        self._pending.pop(request.request_id, None)
        start = request.num_computed_tokens + num_new_local_computed_tokens + num_external_computed_tokens
        size = self._block_size
        if start >= request.num_prompt_tokens or not self._lookup_enabled(request):
            return num_new_tokens
        # Like vLLM's lookup, never serve the last prompt token from the cache: it needs logits.
        hit_limit = (request.num_tokens - 1) // size
        # A chunk that the step's token budget ended mid-block starts mid-block: it adopts
        # nothing, but still ends at the next cached run, so the chunk after it adopts that.
        run = []
        if start % size == 0 and request.status == RequestStatus.RUNNING:
            run = self._run_to_adopt(request, start // size, hit_limit)
        if run:
            self._pending[request.request_id] = run
        begin = start + len(run) * size
        end = min(begin + num_new_tokens, request.num_tokens)
        # The block holding `begin` is uncached (a run stops before it) unless adoption was
        # not possible; start looking one block later so the chunk is never empty.
        for index in range(begin // size + 1, min(hit_limit, -(-end // size))):
            if self._cached(request.block_hashes[index]) is not None:
                end = min(end, index * size)
                break
        return end - begin

    def allocate_slots(self, request: Request, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        """vLLM's allocation, with the pending run (if any) adopted in front of the new slots."""
        run = self._pending.pop(request.request_id, None)
        if not run:
            return self._allocate(request, num_new_tokens, *args, **kwargs)
        self._adopt(request, run, +1)
        new_blocks = self._allocate(request, num_new_tokens, *args, **kwargs)
        if new_blocks is None:  # no room: undo, so a retry after preemption adopts again
            self._adopt(request, run, -1)
            self._pending[request.request_id] = run
            return None
        return self._kv_cache_manager.create_kv_cache_blocks((run,)) + new_blocks

    def _lookup_enabled(self, request: Request) -> bool:
        return bool(self._kv_cache_manager.enable_caching) and not request.skip_reading_prefix_cache

    def _cached(self, block_hash: Any) -> Any:
        blocks = self._pool.get_cached_block(block_hash, [0])
        return blocks[0] if blocks else None

    def _run_to_adopt(self, request: Request, first: int, hit_limit: int) -> list[Any]:
        """The cached blocks from `first` on, when the request's table ends exactly there."""
        rid = request.request_id
        if len(self._blocks.req_to_blocks.get(rid, ())) != first or self._blocks.num_cached_block.get(rid) != first:
            return []
        run = []
        for index in range(first, hit_limit):
            block = self._cached(request.block_hashes[index])
            if block is None:
                break
            run.append(block)
        return run

    def _adopt(self, request: Request, run: Sequence[Any], sign: int) -> None:
        """Add (``sign`` +1) or take back (-1) a cached run at the end of the request's table."""
        rid, tokens = request.request_id, sign * len(run) * self._block_size
        table = self._blocks.req_to_blocks[rid]
        if sign > 0:
            self._pool.touch(run)
            table.extend(run)
        else:
            del table[len(table) - len(run) :]
            self._pool.free_blocks(run)
        self._blocks.num_cached_block[rid] = len(table)
        request.num_computed_tokens += tokens
        stats = request.prefill_stats
        if stats is not None and request.num_preemptions <= 0:  # what the response reports as cached
            stats.num_cached_tokens += tokens
            stats.num_local_cached_tokens += tokens
            stats.num_computed_tokens -= tokens


def install_gap_scheduling(engine: Any) -> None:
    """Once per engine, with prefix caching on: reuse cached runs after a miss."""
    if getattr(engine, ENGINE_GAPS.attribute, None) is not None:
        return
    scheduling = GapScheduling(engine.scheduler)
    scheduling.install(engine.scheduler)
    patch_instance(ENGINE_GAPS, engine, scheduling)


def wrap_update_requests(original: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM 0.26's GPU model runner (V2) keeps each request's computed count on the device and
    only adds each step's tokens to it; a prefilling request whose count the scheduler moved past
    an adopted run gets the scheduler's count written there too."""

    def update_requests(self: Any, scheduler_output: Any) -> None:
        original(self, scheduler_output)
        if not pic_enabled(self.vllm_config):
            return
        reqs, states = scheduler_output.scheduled_cached_reqs, self.req_states
        staged = False
        for req_id, num_computed in zip(reqs.req_ids, reqs.num_computed_tokens):
            index = states.req_id_to_index[req_id]
            if num_computed < states.prefill_len.np[index]:
                states.num_computed_tokens.stage_write_elem(index, num_computed)
                staged = True
        if staged:
            states.num_computed_tokens.apply_write()

    return update_requests
