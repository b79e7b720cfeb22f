"""Block origins and the per-step routing of prefill requests between kernels (host-side logic)."""

from __future__ import annotations

import torch

from minipic_kernels.attention import Scratch, StepPlan, plan_step
from minipic_kernels.block_kinds import (
    BlockKind,
    hidden_per_block,
    requests_weighing_span_keys,
    requests_with_hidden,
)
from minipic_kernels.block_origins import key_shifts, misplaced_requests
from minipic_kernels.step_tensors import MOVED, StepTensors, derive_step_tensors_reference, flag_rows

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
    """4 query heads a kv head: decode takes up to 4 tokens, longer requests are routed."""
    return plan_step(query_lens, seq_lens, max_seq_len=max(seq_lens), block_size=BS, group=4, page_bytes=1000,
                     scratch_budget_bytes=budget)  # fmt: skip


def _routed(plan: StepPlan, masked: list[bool], misplaced: list[bool], seq_lens: list[int]) -> StepPlan:
    """``plan`` routed for requests without hidden blocks (none compactable)."""
    flags = flag_rows(len(seq_lens), torch.device("cpu"))
    flags.zero_()
    flags[MOVED], flags[2] = torch.tensor(misplaced), torch.tensor(masked)
    lengths = torch.tensor(seq_lens, dtype=torch.int32)
    in_request = torch.arange(8)[None, :] * BS < lengths[:, None]
    kept_start = torch.where(in_request, torch.arange(8) * BS, -1).to(torch.int32)
    no_shift = torch.zeros(len(seq_lens), 8, dtype=torch.int32)
    step = StepTensors(torch.full((len(seq_lens), 8), -1, dtype=torch.int32), flags, lengths, kept_start, no_shift)
    return plan.routed(step)


def test_each_prefill_request_goes_to_the_kernel_that_is_exact_for_it() -> None:
    # decode, at origin, windowed, moved, moved and windowed
    query_lens, seq_lens = [1, 40, 50, 30, 20], [70, 40, 50, 90, 33]
    windowed = [False, False, True, False, True]
    moved = [True, False, False, True, True]
    routes = _routed(_plan(query_lens, seq_lens), windowed, moved, seq_lens).routes
    assert routes is not None and routes.scratch is not None and routes.at_origin is not None
    assert routes.at_origin.tolist() == [0, 40, 0, 0, 0]
    assert routes.scratch.query_used.tolist() == [0, 0, 0, 30, 0]
    assert routes.scratch.page_start.tolist() == [-1, -1, -1, 0, -1]
    assert (routes.scratch.num_pages, routes.scratch.max_pages) == (6, 6)
    assert routes.tiles is not None and routes.tiles.tolist() == [0, 0, 1, 0, 1]


def test_moved_requests_over_the_scratch_budget_go_to_the_tile_kernel() -> None:
    plan = _plan([40, 30], [40, 90], budget=5 * 1000)  # 6 pages needed
    routes = _routed(plan, [False, False], [False, True], [40, 90]).routes
    assert routes is not None and routes.scratch is None
    assert routes.at_origin is not None and routes.at_origin.tolist() == [40, 0]
    assert routes.tiles is not None and routes.tiles.tolist() == [0, 1]


def test_rows_cover_requests_the_device_tensors_pad_and_kinds_without_requests_launch_nothing() -> None:
    plan = _plan([64], [64])
    routes = _routed(plan, [False, False], [False, False], [64, 0]).routes
    assert routes is not None and routes.at_origin is not None
    assert routes.at_origin.tolist() == [64, 0]
    assert routes.scratch is None and routes.tiles is None


def test_a_step_without_prefill_needs_no_routing() -> None:
    plan = _plan([1, 2], [70, 33])
    assert not plan.has_prefill
    assert _routed(plan, [True, True], [True, True], [70, 33]) is plan


def test_a_cached_prompts_few_new_tokens_are_routed_and_decode_keeps_its_own() -> None:
    """A cached prompt's last few tokens (5 and 16 here) over moved keys read them from
    scratch pages, as any longer request does; the single-token decode beside them stays
    on the decode launch (the served comparison at 25f6b6d found the in-place short launch
    no faster, `cached-ttft-h100-25f6b6d-*.json`)."""
    plan = _plan([1, 5, 16], [70, 900, 33])
    assert plan.has_decode and plan.has_prefill and plan.decode_limit == 4
    routes = _routed(plan, [False, False, False], [True, True, True], [70, 900, 33]).routes
    assert routes is not None and routes.scratch is not None and routes.at_origin is None and routes.tiles is None
    assert routes.scratch.query_used.tolist() == [0, 5, 16]
    assert routes.scratch.page_start.tolist() == [-1, 0, 57]  # no pages for the decode request


# Physical blocks of a refreshed-heads prompt: [plain prefix][PDep head][HSep span, 2 blocks]
# [PDep head][HSep span][PDep question, 2 blocks] (block 0 stands for table padding).
LAYOUT = torch.tensor([0, 0, BlockKind.PDEP, BlockKind.HSEP, 0, BlockKind.PDEP, BlockKind.HSEP, BlockKind.PDEP, 0],
                      dtype=torch.int8)  # fmt: skip
FINAL_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def _step(
    tables: list[list[int]],
    reqs: list[tuple[int, int]],
    moved: list[bool] | None = None,
    unread: tuple[torch.Tensor, torch.Tensor] | None = None,
    kinds: torch.Tensor = LAYOUT,
) -> StepTensors:
    """The step's tensors for requests over `kinds`, (seq_len, query_len) each, every block at
    its origin but those of the requests ``moved`` flags; in the compact reading with ``unread``."""
    table = torch.tensor([t + [0] * (8 - len(t)) for t in tables], dtype=torch.int32)
    seq_lens = torch.tensor([s for s, _ in reqs], dtype=torch.int32)
    qsl = torch.tensor([0] + [q for _, q in reqs]).cumsum(0)
    origin = torch.zeros(len(kinds), dtype=torch.int32)
    for row in tables:
        origin[row] = torch.arange(len(row), dtype=torch.int32)
    step = derive_step_tensors_reference(table, kinds, origin, qsl, seq_lens, BS, unread, int(qsl[-1]))
    if moved is not None:
        step.flags[MOVED] = torch.tensor(moved)
    return step


def _tokens(scratch: Scratch) -> list[list[int]]:
    """The scratch token each logical block's first kept slot is copied to (-1: none), as
    `rotate_into_pages` places it."""
    start = scratch.page_start[:, None] * BS
    return torch.where((start >= 0) & (scratch.kept_start >= 0), start + scratch.kept_start, -1).tolist()


def _pages(scratch: Scratch) -> list[list[int]]:
    """The scratch page each logical block is copied to (-1: none), blocks kept whole."""
    assert all(t % BS == 0 for row in _tokens(scratch) for t in row if t >= 0)
    return [[t // BS if t >= 0 else -1 for t in row] for row in _tokens(scratch)]


def test_rows_that_only_skip_hidden_blocks_before_them_go_to_the_stock_kernel_over_scratch() -> None:
    """A refreshed-heads final prompt (its question after cached HSep spans, at their origin or
    moved) reads scratch pages without its hidden blocks; a request computing its HSep span,
    or with span rows among rows that skip the span's head, needs the tile kernel; an HSep
    span prefilled alone (rows at window 0) sees its own head and reads the cache."""
    tables = [FINAL_PROMPT, FINAL_PROMPT, FINAL_PROMPT, [3, 4], [3, 4, 7, 8], [3, 4, 7, 8]]
    # the question | the same, moved | the whole prompt | the span alone | the span and the
    # question | the question after a span at block 0
    reqs = [(8 * BS, 2 * BS), (8 * BS, 2 * BS), (8 * BS, 8 * BS), (2 * BS, 2 * BS), (4 * BS, 4 * BS),
            (4 * BS - 3, 2 * BS - 3)]  # fmt: skip
    step = _step(tables, reqs, moved=[False, True, False, False, False, False])
    assert step.masked.tolist() == [1, 1, 1, 0, 1, 1]
    assert step.compactable.tolist() == [1, 1, 0, 0, 0, 1]
    plan = _plan([q for _, q in reqs], [s for s, _ in reqs])
    routes = plan.routed(step).routes
    assert routes is not None and routes.tiles is not None and routes.at_origin is not None
    assert routes.tiles.tolist() == [0, 0, 1, 0, 1, 0]
    assert routes.at_origin.tolist() == [0, 0, 0, 2 * BS, 0, 0]
    scratch = routes.scratch
    assert scratch is not None
    assert scratch.query_used.tolist() == [2 * BS, 2 * BS, 0, 0, 0, 2 * BS - 3]
    assert scratch.page_start.tolist() == [0, 8, -1, -1, -1, 16]
    assert (scratch.num_pages, scratch.max_pages) == (20, 8)
    assert _pages(scratch) == [
        [0, 1, -1, 2, 3, -1, 4, 5], [8, 9, -1, 10, 11, -1, 12, 13], [-1] * 8, [-1] * 8, [-1] * 8,
        [-1, 16, 17, 18, -1, -1, -1, -1],
    ]  # fmt: skip
    assert scratch.seq_used[[0, 1, 5]].tolist() == [6 * BS, 6 * BS, 3 * BS - 3]


def test_under_a_span_bias_rows_weighing_span_keys_go_to_the_tile_kernel() -> None:
    """The stock kernel cannot weigh keys: the question after cached spans goes to tiles (moved or
    not), the span prefilled alone keeps the cache and the stock kernel."""
    tables = [FINAL_PROMPT, FINAL_PROMPT, [3, 4]]
    reqs = [(8 * BS, 2 * BS), (8 * BS, 2 * BS), (2 * BS, 2 * BS)]
    step = _step(tables, reqs, moved=[False, True, False])
    plan = _plan([q for _, q in reqs], [s for s, _ in reqs])
    weighing = requests_weighing_span_keys(step.window_starts, torch.tensor([0, 2 * BS, 4 * BS, 6 * BS]),
                                           torch.tensor([s for s, _ in reqs]), BS)  # fmt: skip
    assert weighing.tolist() == [True, True, False]
    routes = plan.routed(step, weighing).routes
    assert routes is not None and routes.scratch is None and routes.at_origin is not None
    assert routes.tiles is not None and routes.tiles.tolist() == [1, 1, 0]
    assert routes.at_origin.tolist() == [0, 0, 2 * BS]
    assert plan.routed(step).routes.tiles is None  # without the bias: scratch pages, as above


def test_moved_requests_keep_every_block_on_scratch() -> None:
    """A misplaced window-free request reads all its blocks in logical order, a hidden head its
    rows see (a span's own, at window 0) included."""
    step = _step([[3, 4]], [(2 * BS, BS + 1)], moved=[True])
    assert not step.masked.any() and not step.compactable.any()
    routes = _plan([BS + 1], [2 * BS]).routed(step).routes
    assert routes is not None and routes.scratch is not None
    assert _pages(routes.scratch) == [[0, 1, -1, -1, -1, -1, -1, -1]]
    assert routes.scratch.seq_used.tolist() == [2 * BS]


def test_compactable_requests_over_the_scratch_budget_go_to_the_tile_kernel() -> None:
    reqs = [(8 * BS, 2 * BS), (2 * BS, 2 * BS)]
    step = _step([FINAL_PROMPT, [3, 4]], reqs)
    plan = _plan([q for _, q in reqs], [s for s, _ in reqs], budget=7 * 1000)  # 8 pages needed
    routes = plan.routed(step).routes
    assert routes is not None and routes.scratch is None
    assert routes.tiles is not None and routes.tiles.tolist() == [1, 0]
    assert routes.at_origin is not None and routes.at_origin.tolist() == [0, 2 * BS]


def test_compact_final_prompts_read_their_kept_keys_from_scratch() -> None:
    """In the compact reading a final prompt's question or last PDep head after cached spans (tail
    pads, a PDep marker opening each block after a span, hidden heads) has unread keys before its
    rows and a PDep marker as its first row, and none after its first read row: compactable, it
    reads scratch pages holding only its kept tokens (read and not hidden), packed token by token;
    a question whose last rows are pads (an unread row after a read one) and the whole prompt
    (span rows) go to the tile kernel."""
    kinds = torch.cat((LAYOUT, torch.tensor([BlockKind.PDEP, 0], dtype=torch.int8)))  # 9, 10: a padded question
    unread = ((kinds == BlockKind.PDEP).to(torch.int32), torch.zeros(len(kinds), dtype=torch.int32))
    unread[1][[1, 4, 6, 10]] = torch.tensor([2, 3, 5, 4], dtype=torch.int32)  # the prefix's and spans' pads
    tables = [FINAL_PROMPT, FINAL_PROMPT[:7], FINAL_PROMPT[:6] + [9, 10], FINAL_PROMPT]
    reqs = [(8 * BS, 2 * BS), (7 * BS, BS), (8 * BS, 2 * BS), (8 * BS, 8 * BS)]
    step = _step(tables, reqs, unread=unread, kinds=kinds)
    assert step.masked.tolist() == [1, 1, 1, 1] and step.compactable.tolist() == [1, 1, 0, 0]
    routes = _plan([q for _, q in reqs], [s for s, _ in reqs]).routed(step).routes
    assert routes is not None and routes.at_origin is None
    assert routes.tiles is not None and routes.tiles.tolist() == [0, 0, 1, 1]
    scratch = routes.scratch
    assert scratch is not None and scratch.page_start.tolist() == [0, 8, -1, -1]
    # Per logical block: 14 of the prefix's 16 tokens, 15 of each PDep block, 13 of the span's second.
    question = [0, 14, -1, 29, 42, -1, 57, 72]
    assert _tokens(scratch)[:2] == [question, [8 * BS + t if t >= 0 else -1 for t in question[:7]] + [-1]]
    assert scratch.seq_used[:2].tolist() == [88, 72] and scratch.query_used.tolist() == [2 * BS, BS, 0, 0]


def test_unread_keys_after_every_read_row_keep_the_stock_kernel() -> None:
    """An unread row reads causally in the reference (`compact_shifts.read_keys`), so an SSep span
    prefilled alone, whose pads end it, is causal attention in the compact reading and keeps the
    stock kernel over the cache, as does a step computing only those pads; a request with a read
    row after an unread key (here the PDep head opening it) is masked and reads its kept keys from
    scratch pages (`test_compact_final_prompts_read_their_kept_keys_from_scratch`)."""
    kinds = LAYOUT.clone()
    kinds[3] = BlockKind.SSEP
    unread = ((kinds == BlockKind.PDEP).to(torch.int32), torch.zeros(len(kinds), dtype=torch.int32))
    unread[1][4] = 5  # the span [3, 4] ends with pads
    reqs = [(2 * BS, 2 * BS), (2 * BS, 3), (2 * BS, 2 * BS)]  # the span | its last three pads | a PDep question
    step = _step([[3, 4], [3, 4], [7, 8]], reqs, unread=unread, kinds=kinds)
    assert step.hidden.tolist() == [1, 1, 1]  # the kernels would still mask unread keys from read rows
    assert step.masked.tolist() == [0, 0, 1] and step.compactable.tolist() == [0, 0, 1]
    routes = _plan([q for _, q in reqs], [s for s, _ in reqs]).routed(step).routes
    assert routes is not None and routes.tiles is None
    assert routes.at_origin is not None and routes.at_origin.tolist() == [2 * BS, 0, 0]
    assert routes.scratch is not None and routes.scratch.query_used.tolist() == [0, 0, 2 * BS]
    assert routes.scratch.seq_used[2] == 2 * BS - 1  # its PDep marker left out
