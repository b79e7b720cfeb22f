"""Block origins and the per-step routing of prefill requests between kernels (host-side logic)."""

from __future__ import annotations

import torch

from minipic_kernels.attention import plan_step
from minipic_kernels.block_kinds import (
    BlockKind,
    hidden_per_block,
    requests_with_hidden,
    requests_with_masks,
    window_starts_per_block,
)
from minipic_kernels.block_origins import key_shifts, misplaced_requests

BS = 16


def test_shifts_are_how_far_each_logical_block_moved_from_its_origin() -> None:
    table = torch.tensor([[5, 6, 7], [6, 5, 0]], dtype=torch.int32)
    origin = torch.zeros(8, dtype=torch.int32)
    origin[5], origin[6], origin[7] = 0, 3, 2
    assert key_shifts(table, origin, BS).tolist() == [[0, -32, 0], [-48, 16, 32]]


def test_only_blocks_inside_a_request_make_it_misplaced() -> None:
    table = torch.tensor([[1, 2, 3], [1, 2, 3]], dtype=torch.int32)
    origin = torch.tensor([0, 0, 1, 9], dtype=torch.int32)  # block 3 was computed elsewhere
    seq_lens = torch.tensor([2 * BS, 2 * BS + 1], dtype=torch.int32)  # only the second reaches block 3
    assert misplaced_requests(table, origin, seq_lens, BS).tolist() == [False, True]


def test_only_hidden_blocks_inside_a_request_flag_it_for_the_hidden_mask() -> None:
    """The decode kernel loads block kinds only for flagged requests: a hidden block past a
    request's length (a junk table entry) does not flag it, one among its keys does."""
    kind = torch.tensor([0, 0, BlockKind.HSEP, BlockKind.SSEP], dtype=torch.int8)
    table = torch.tensor([[1, 3, 2], [1, 3, 2], [2, 1, 0], [3, 1, 1]], dtype=torch.int32)
    seq_lens = torch.tensor([2 * BS, 2 * BS + 1, 1, 3 * BS], dtype=torch.int32)
    flags = requests_with_hidden(hidden_per_block(table, kind), seq_lens, BS)
    assert flags.dtype == torch.int8 and flags.tolist() == [0, 1, 1, 0]


def _plan(query_lens: list[int], seq_lens: list[int], budget: int = 1 << 30):
    return plan_step(query_lens, seq_lens, max_seq_len=max(seq_lens), block_size=BS, group=4, page_bytes=1000,
                     scratch_budget_bytes=budget)  # fmt: skip


def test_each_prefill_request_goes_to_the_kernel_that_is_exact_for_it() -> None:
    # decode, at origin, windowed, moved, moved and windowed
    query_lens, seq_lens = [1, 40, 50, 30, 20], [70, 40, 50, 90, 33]
    windowed = torch.tensor([False, False, True, False, True])
    moved = torch.tensor([True, False, False, True, True])
    routes = _plan(query_lens, seq_lens).routed(windowed, moved, torch.tensor(seq_lens)).routes
    assert routes is not None and routes.scratch is not None and routes.at_origin is not None
    assert routes.at_origin.tolist() == [0, 40, 0, 0, 0]
    assert routes.scratch.query_used.tolist() == [0, 0, 0, 30, 0]
    assert routes.scratch.page_start.tolist() == [-1, -1, -1, 0, -1]
    assert (routes.scratch.num_pages, routes.scratch.max_pages) == (6, 6)
    assert routes.tiles is not None and routes.tiles.tolist() == [0, 0, 1, 0, 1]


def test_moved_requests_over_the_scratch_budget_go_to_the_tile_kernel() -> None:
    plan = _plan([40, 30], [40, 90], budget=5 * 1000)  # 6 pages needed
    routes = plan.routed(torch.tensor([False, False]), torch.tensor([False, True]), torch.tensor([40, 90])).routes
    assert routes is not None and routes.scratch is None
    assert routes.at_origin is not None and routes.at_origin.tolist() == [40, 0]
    assert routes.tiles is not None and routes.tiles.tolist() == [0, 1]


def test_rows_cover_requests_the_device_tensors_pad_and_kinds_without_requests_launch_nothing() -> None:
    plan = _plan([64], [64])
    routes = plan.routed(torch.tensor([False, False]), torch.tensor([False, False]), torch.tensor([64, 0])).routes
    assert routes is not None and routes.at_origin is not None
    assert routes.at_origin.tolist() == [64, 0]
    assert routes.scratch is None and routes.tiles is None


def test_a_step_without_prefill_needs_no_routing() -> None:
    plan = _plan([1, 2], [70, 33])
    assert not plan.has_prefill
    assert plan.routed(torch.tensor([True, True]), torch.tensor([True, True]), torch.tensor([70, 33])) is plan


def test_only_rows_that_must_skip_a_hidden_head_send_a_request_to_the_tile_kernel() -> None:
    """FlashAttention-3 cannot skip a block: a request goes to the tile kernel when one of its
    query rows must skip a hidden head, not merely because it holds one."""
    kind = torch.tensor([0, BlockKind.HSEP, 0, BlockKind.PDEP, 0], dtype=torch.int8)
    table = torch.tensor([[1, 2, 0], [1, 2, 3], [1, 2, 3], [4, 1, 2]], dtype=torch.int32)
    # an HSep span prefilled alone | the final prompt: cached span, PDep tail computed |
    # the span's own rows only (a chunk) | the span after a plain block (its rows windowed)
    seq_lens = torch.tensor([2 * BS, 3 * BS, 2 * BS, 3 * BS])
    q_lens = torch.tensor([2 * BS, BS, BS, 2 * BS])
    qsl = torch.cat((torch.zeros(1, dtype=torch.long), torch.cumsum(q_lens, 0)))
    windows = window_starts_per_block(table, kind, BS)
    masked = requests_with_masks(windows, hidden_per_block(table, kind), qsl, seq_lens, BS)
    assert masked.tolist() == [False, True, False, True]
    routes = _plan(q_lens.tolist(), seq_lens.tolist()).routed(masked, torch.zeros(4, dtype=torch.bool), seq_lens).routes
    assert routes is not None and routes.tiles is not None and routes.at_origin is not None
    assert routes.tiles.tolist() == [0, 1, 0, 1]
    assert routes.at_origin.tolist() == [2 * BS, 0, BS, 0]
