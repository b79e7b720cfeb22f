"""Worker side of the block records: one record per physical KV block, set from the scheduler's plan.

Attention sees slots and block tables, never token ids. Each physical block has its
records on the device: its `BlockKind`, its origin (the logical index its keys are stored
at), its write shift (how many blocks the request writing it places it past its origin)
and, in the compact reading, its unread head and tail (`minipic_kernels.compact_shifts`).
The scheduler decides them for every block that enters a block table
(`minipic_server.block_plan`) and ships them with the step; the worker sets them before the
forward (`wrap_execute_model`), so they hold whether the block's KV was computed this step,
found in the prefix cache or loaded from elsewhere.

Per step, the first attention layer derives what the kernels read from them
(`derive_step`, `minipic_kernels.step_tensors`: one launch on the GPU): the window start of
each logical block, which requests read a block away from its origin, have a hidden block
among their keys or need masks, and, in steps with prefill, the routing of requests to
kernels (`StepPlan.routed`, one small host sync). The derivation is graph-safe, so decode
batches are captured whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from minipic_kernels.attention import weighing_requests
from minipic_kernels.step_tensors import derive_step_tensors, derive_step_tensors_reference
from minipic_server.block_plan import StepRecords
from minipic_server.boundary import STEP_RECORDS, Attention
from minipic_server.config import MiniPICConfigError

# Rows of `BlockRecords`' host copy.
_KIND, _ORIGIN, _WRITE_SHIFT, _UNREAD_HEAD, _UNREAD_TAIL = range(5)


class BlockRecords:
    """The per-physical-block records of one worker's KV cache (allocated on first use).

    A host copy mirrors the device's records, so a step sends the device only the records it
    changes: a prompt over cached documents lists thousands of blocks whose records are
    already there (their kind and origin follow from their hashes), and turning those lists
    into a device tensor cost about 1.8 ms of a 32-document request on the H100 (py-spy,
    `benchmarks/results/cached-ttft-h100-a3ce8b9-profile-cut-short.json`).
    """

    def __init__(self, device: torch.device, compact: bool = False) -> None:
        self.device = device
        self.compact = compact  # the compact reading: steps derive shifts from the unread records
        self.first_layer: Any = None  # the attention impl that derives each forward's metadata
        self.kind = torch.zeros(0, dtype=torch.int8, device=device)
        self.origin = torch.zeros(0, dtype=torch.int32, device=device)
        self.write_shift = torch.zeros(0, dtype=torch.int32, device=device)
        self.unread_head = torch.zeros(0, dtype=torch.int32, device=device)
        self.unread_tail = torch.zeros(0, dtype=torch.int32, device=device)
        self._host = np.zeros((5, 0), dtype=np.int32)  # rows _KIND, _ORIGIN, _WRITE_SHIFT, _UNREAD_HEAD, _UNREAD_TAIL
        # Whether any block is stored away from where it is computed, known without a sync
        # (an eager step writes with vLLM's own kernel when none is).
        self.any_write_shift = False

    def ensure(self, num_blocks: int) -> None:
        """Allocate once the cache size is known; the tensors then never move (CUDA graphs read them)."""
        if self.kind.shape[0] == num_blocks:
            return
        if self.kind.shape[0]:
            raise MiniPICConfigError(
                f"the KV cache has {num_blocks} blocks, but its block records were made for {self.kind.shape[0]}"
            )
        self.kind = torch.zeros(num_blocks, dtype=torch.int8, device=self.device)
        self.origin, self.write_shift, self.unread_head, self.unread_tail = (
            torch.zeros(num_blocks, dtype=torch.int32, device=self.device) for _ in range(4)
        )
        self._host = np.zeros((5, num_blocks), dtype=np.int32)

    @property
    def unread(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The unread head and tail records in the compact reading (what the step derivation
        and attention take), None outside it."""
        return (self.unread_head, self.unread_tail) if self.compact else None

    def apply(self, step: StepRecords) -> None:
        """Set the records the scheduler shipped with this step: the host copy first, then
        the blocks whose records changed, each once, on the device (one host-to-device copy).

        The rows go through pinned memory on CUDA: a copy from pageable memory waits for the
        GPU to finish the step in flight, which would stall vLLM's async scheduling (the next
        step's inputs are prepared while the GPU runs this one). The pinned block is not reused
        before its copy completes (torch's host allocator records the copy's stream)."""
        self.ensure(step.num_blocks)
        if not step.block_ids and not step.written_ids:  # a decode step lists nothing
            return
        listed = np.asarray(step.block_ids, dtype=np.intp)
        written = np.asarray(step.written_ids, dtype=np.intp)
        touched = np.concatenate([listed, written])
        before = self._host[:, touched]
        self._host[_KIND, listed] = step.kinds
        self._host[_ORIGIN, listed] = step.origins
        if self.compact:
            self._host[_UNREAD_HEAD, listed] = step.unread_heads
            self._host[_UNREAD_TAIL, listed] = step.unread_tails
        self._host[_WRITE_SHIFT, written] = step.write_shifts
        changed = np.unique(touched[(self._host[:, touched] != before).any(axis=0)])
        if not changed.size:
            return
        rows = torch.from_numpy(np.vstack([changed.astype(np.int32), self._host[:, changed]]))
        packed = (rows.pin_memory() if self.device.type == "cuda" else rows).to(self.device, non_blocking=True)
        ids = packed[0].long()
        self.kind.index_copy_(0, ids, packed[1 + _KIND].to(torch.int8))
        self.origin.index_copy_(0, ids, packed[1 + _ORIGIN])
        self.write_shift.index_copy_(0, ids, packed[1 + _WRITE_SHIFT])
        if self.compact:
            self.unread_head.index_copy_(0, ids, packed[1 + _UNREAD_HEAD])
            self.unread_tail.index_copy_(0, ids, packed[1 + _UNREAD_TAIL])
        self.any_write_shift = bool(self._host[_WRITE_SHIFT].any())


def derive_step(metadata: Any, records: BlockRecords, *, first_layer: bool) -> None:
    """Fill a forward's metadata from the records: in the model's first attention layer, every
    forward (a CUDA graph captures the derivation with it, so each replay redoes it), and in
    any later layer whose metadata the first layer did not fill."""
    if not first_layer and metadata.step is not None:
        return
    if not records.kind.shape[0]:
        raise MiniPICConfigError("MiniPIC attention ran before the KV cache's block records were allocated")
    derive = derive_step_tensors if records.kind.is_cuda else derive_step_tensors_reference
    metadata.block_kind, metadata.block_origin, metadata.unread = records.kind, records.origin, records.unread
    metadata.step = derive(
        metadata.block_table, records.kind, records.origin, metadata.query_start_loc, metadata.seq_lens,
        metadata.block_size, records.unread, metadata.num_actual_tokens,
    )
    if metadata.plan is not None:
        weighing = weighing_requests(metadata.step, metadata.query_start_loc, metadata.seq_lens, metadata.block_size,
                                     metadata.span_bias)  # fmt: skip
        metadata.plan = metadata.plan.routed(metadata.step, weighing)


def link_block_records(model: torch.nn.Module, device: torch.device, compact: bool = False) -> BlockRecords:
    """One `BlockRecords` for the worker, shared by every attention layer of the model; the
    first layer (in module order, the order a decoder runs them) derives each forward's metadata."""
    records = BlockRecords(device, compact)
    for module in model.modules():
        if isinstance(module, Attention):
            module.impl.pic_records = records
            if records.first_layer is None:
                records.first_layer = module.impl
    return records


def records_of_worker(vllm_config: Any) -> BlockRecords:
    """The worker's records, found through its first attention layer."""
    for layer in vllm_config.compilation_config.static_forward_context.values():
        records = getattr(getattr(layer, "impl", None), "pic_records", None)
        if records is not None:
            return records
    raise MiniPICConfigError("MiniPIC is active but no attention layer holds block records")


def wrap_execute_model(original: Callable[..., Any]) -> Callable[..., Any]:
    """The worker's step entry (`minipic_server.boundary`): set the shipped records before the forward."""

    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        # Steps vLLM makes up itself (its kernel warm-up) carry none: their blocks hold dummy KV.
        step = getattr(scheduler_output, STEP_RECORDS.attribute, None)
        if step is not None:
            with torch.inference_mode():  # the records were made in it, by the first forward
                records_of_worker(self.vllm_config).apply(step)
        return original(self, scheduler_output, *args, **kwargs)

    return execute_model
