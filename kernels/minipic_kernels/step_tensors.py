"""What every attention layer of a step reads from the block records, derived once per step.

The block rule's tensor forms (`block_kinds`, `block_origins`) are a few dozen small torch
operations; on the GPU each costs a launch, and an eager step (any step with prefill: vLLM
runs attention outside its CUDA graphs there) paid about 2 ms of host time for them at
every step (`benchmarks/attention_kernel.py`, section ``dispatch``). `derive_step_tensors`
computes the same tensors in one Triton launch; `derive_step_tensors_reference` composes
the tensor forms (the CPU backend's path, and the definition the kernel is tested equal to).

Per request the kernel walks its block-table row in chunks, carrying the latest marker
block and whether a hidden block was seen (the two running maxima behind window starts and
hidden-before), in the compact reading also the read tokens so far and the open span's
shift (`compact_shifts`), then a second walk counting the tokens each request keeps before
each block (``kept_start``; a compactable request, `compactable_requests`, leaves its hidden
blocks out, and in the compact reading its unread tokens too).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from minipic_kernels.block_kinds import (
    compactable_requests,
    hidden_per_block,
    requests_with_hidden,
    requests_with_masks,
    requests_with_span_rows,
    window_starts_per_block,
)
from minipic_kernels.block_origins import key_shifts
from minipic_kernels.compact_shifts import compact_shifts_per_block
from minipic_protocol.blocks import OUTSIDE_SPANS, BlockKind

__all__ = ["StepTensors", "derive_step_tensors", "derive_step_tensors_reference", "kept_slots"]

# Rows of `StepTensors.flags`.
MOVED, HIDDEN, MASKED, COMPACTABLE = range(4)
# Logical blocks per chunk of the kernel's walk (a row of a long prompt's table takes a few).
_CHUNK = 256
# The block rule's values, as the kernel reads them.
_SSEP = tl.constexpr(int(BlockKind.SSEP))
_HSEP = tl.constexpr(int(BlockKind.HSEP))
_OUTSIDE_SPANS = tl.constexpr(OUTSIDE_SPANS)


def _flag_row(row: int, doc: str) -> property:
    """`StepTensors.flags` row ``row``: one int8 per request."""
    return property(lambda self: self.flags[row], doc=doc)


@dataclasses.dataclass(frozen=True)
class StepTensors:
    """Per step, from the block records and the step's tables and lengths (all on the device).

    ``flags`` is one ``(4, num_reqs)`` int8 tensor (`flag_rows`) so that routing reads it in one copy.
    """

    window_starts: torch.Tensor  # (num_reqs, max_blocks) int32, `window_starts_per_block`
    flags: torch.Tensor  # (4, num_reqs) int8: rows MOVED, HIDDEN, MASKED, COMPACTABLE
    # (num_reqs,) int32: the tokens a request keeps on scratch pages (`kept_slots`): its length but for a
    # compactable request, less its hidden blocks and, in the compact reading, its unread tokens
    kept_len: torch.Tensor
    # (num_reqs, max_blocks) int32: the request's kept tokens before each logical block, -1 for a block keeping none
    # (outside the compact reading `block_size` times its rank among the kept blocks)
    kept_start: torch.Tensor
    # (num_reqs, max_blocks) int32: positions each logical block's keys move when read, its distance from
    # its origin less its compact shift (`compact_shifts.compact_shifts_per_block`; 0 outside the compact reading)
    key_shift: torch.Tensor
    # (num_tokens,) int32: each query row's compact shift (queries rotate back by it); None outside the compact reading
    query_shift: torch.Tensor | None = None

    moved = _flag_row(MOVED, "int8 per request: reads a block away from its origin (`misplaced_requests`).")
    hidden = _flag_row(HIDDEN, "int8 per request: keys its rows may skip by their block's records: a hidden "
                       "block (`requests_with_hidden`) or, in the compact reading, unread slots.")
    masked = _flag_row(MASKED, "int8 per request: a row sees less than causal (`requests_with_masks`).")
    compactable = _flag_row(COMPACTABLE, "int8 per request: masked only by keys before its read rows that "
                            "none of them sees: hidden blocks (`compactable_requests`) and, in the compact reading, "
                            "unread tokens (`_unread_after_read_rows`).")


def derive_step_tensors_reference(
    block_table: torch.Tensor,
    block_kind: torch.Tensor,
    block_origin: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    unread: tuple[torch.Tensor, torch.Tensor] | None = None,
    num_tokens: int = 0,
) -> StepTensors:
    """The step's tensors from the block rule's tensor forms (any device). ``unread``: the
    compact reading's ``(unread_head, unread_tail)`` records (`compact_shifts`), None outside
    it; ``num_tokens``: the query rows a compact step's ``query_shift`` covers."""
    window_starts = window_starts_per_block(block_table, block_kind, block_size)
    hidden_blocks = hidden_per_block(block_table, block_kind)
    mask_inputs = (window_starts, hidden_blocks, query_start_loc, seq_lens, block_size)
    compactable = compactable_requests(*mask_inputs)
    masked = requests_with_masks(*mask_inputs)
    hidden = requests_with_hidden(hidden_blocks, seq_lens, block_size)
    cols = torch.arange(block_table.shape[1], device=block_table.device)
    in_request = cols[None, :] * block_size < seq_lens[:, None]
    key_shift = key_shifts(block_table, block_origin, block_size)
    query_shift = None
    if unread is not None:
        head, tail = unread
        shifts = compact_shifts_per_block(block_table, block_kind, head, tail, window_starts, seq_lens, block_size)
        key_shift = key_shift - shifts
        bt = block_table.long()
        unread_keys = (((head[bt] > 0) | (tail[bt] > 0)) & in_request).any(dim=1)
        q_lens = query_start_loc[1:] - query_start_loc[:-1]
        before_read = _unread_before_read_rows(head[bt], tail[bt], seq_lens, q_lens, block_size)
        shifted = before_read | ((shifts != 0) & in_request).any(dim=1)
        hidden, masked = hidden | unread_keys, masked | shifted
        # Rows outside spans, every unread token before the first read one: exact on compacted scratch pages.
        span_rows = requests_with_span_rows(window_starts, query_start_loc, seq_lens, block_size)
        after_read = _unread_after_read_rows(head[bt], tail[bt], seq_lens, q_lens, block_size)
        compactable = masked & ~span_rows & ~after_read
        query_shift = _query_rows_shift(shifts, query_start_loc, seq_lens, block_size, num_tokens)
    flags = flag_rows(block_table.shape[0], block_table.device)
    flags[MOVED] = ((key_shift != 0) & in_request).any(dim=1)
    flags[HIDDEN] = hidden
    flags[MASKED] = masked
    flags[COMPACTABLE] = compactable
    lo, hi = kept_slots(block_table, block_kind, seq_lens, block_size, compactable, unread)
    kept = (hi - lo).clamp(min=0)
    kept_start = torch.where(kept > 0, torch.cumsum(kept, dim=1) - kept, -1).to(torch.int32)
    kept_len = kept.sum(dim=1).to(torch.int32)
    return StepTensors(window_starts, flags, kept_len, kept_start, key_shift.to(torch.int32), query_shift)


def kept_slots(
    block_table: torch.Tensor,
    block_kind: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    compactable: torch.Tensor,
    unread: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, hi)``, each ``(num_reqs, max_blocks)`` int32: the slots ``lo <= slot < hi`` of each
    logical block a request keeps on scratch pages (none where ``hi <= lo``): its present slots,
    but none of a hidden block of a ``compactable`` request and, in the compact reading (``unread``),
    only the read slots of a compactable request's blocks (`_kept_slots`, the kernels' form)."""
    cols = torch.arange(block_table.shape[1], device=block_table.device, dtype=torch.int32)
    hi = (seq_lens[:, None].to(torch.int32) - cols[None, :] * block_size).clamp(0, block_size)
    lo = torch.zeros_like(hi)
    compactable = compactable.bool()[:, None]
    if unread is not None:
        bt = block_table.long()
        lo = torch.where(compactable, unread[0][bt].to(torch.int32), lo)
        hi = torch.where(compactable, torch.minimum(hi, block_size - unread[1][bt].to(torch.int32)), hi)
    hi = torch.where(compactable & hidden_per_block(block_table, block_kind), 0, hi)
    return lo, hi


def _unread_before_read_rows(
    head: torch.Tensor, tail: torch.Tensor, seq_lens: torch.Tensor, q_lens: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Per request: whether an unread key comes before one of its read query rows. Without one,
    causal attention is exact for it in the compact reading (an unread row's result is unspecified
    but finite, causal one choice: `compact_shifts.read_keys`), as for a span prefill, whose pads end it."""
    starts = torch.arange(head.shape[1], device=head.device)[None, :] * block_size
    ends = seq_lens[:, None]
    present = (ends - starts).clamp(0, block_size)
    first_unread = torch.where(head > 0, starts, torch.where(tail > 0, starts + block_size - tail, ends))
    first_unread = torch.where(first_unread < ends, first_unread, ends).amin(dim=1)
    read_end = torch.minimum(present, block_size - tail)
    last_read = torch.where(read_end > head, starts + read_end - 1, -1).amax(dim=1)
    return (first_unread < last_read) & (last_read >= seq_lens - q_lens)


def _unread_after_read_rows(
    head: torch.Tensor, tail: torch.Tensor, seq_lens: torch.Tensor, q_lens: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Per request: whether an unread token (a key or a query row) comes after its first read
    query row. Without one its query rows are ``[unread rows][read rows]`` after every unread
    key, so the stock kernel over its kept keys alone, placing the rows at their end, gives each
    read row exactly the kept keys up to it (`attention.Scratch`)."""
    starts = torch.arange(head.shape[1], device=head.device)[None, :] * block_size
    ends = seq_lens[:, None]
    present = (ends - starts).clamp(0, block_size)
    read_end = torch.minimum(present, block_size - tail)
    # A block's last present slot if unread, else the last of its unread head, if any.
    last_slot_unread = (present > 0) & ((present <= head) | (present > read_end))
    head_end = torch.where((present > 0) & (head > 0), starts + head, 0)
    last_unread = torch.where(last_slot_unread, starts + present, head_end) - 1
    first_row = (seq_lens - q_lens)[:, None]
    first_read = torch.maximum(starts + head, first_row)
    first_read = torch.where(first_read < starts + read_end, first_read, ends).amin(dim=1)
    return last_unread.amax(dim=1) > first_read


def _query_rows_shift(
    shifts: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_size: int, num_tokens: int
) -> torch.Tensor:
    """``(num_tokens,)`` int32: the compact shift of each query row's block (0 for padding rows)."""
    out = torch.zeros(num_tokens, dtype=torch.int32, device=shifts.device)
    starts = query_start_loc.tolist()
    for r, seq_len in enumerate(seq_lens.tolist()):
        begin, end = starts[r], min(starts[r + 1], num_tokens)
        positions = torch.arange(seq_len - (starts[r + 1] - begin), seq_len, device=shifts.device)[: end - begin]
        out[begin:end] = shifts[r, positions // block_size]
    return out


def flag_rows(num_reqs: int, device: torch.device) -> torch.Tensor:
    """An empty ``(4, num_reqs)`` int8 view whose rows start 16 bytes apart at least: kernels
    reading a row (``moved``, ``hidden``) see the same pointer alignment whatever the
    batch size, so its size never makes Triton compile them anew."""
    return torch.empty(4, -(-max(num_reqs, 1) // 16) * 16, dtype=torch.int8, device=device)[:, :num_reqs]


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _lowest_block(blk_a, own_a, window_a, blk_b, own_b, window_b):
    """Combine of a scan keeping the lowest block and its values."""
    a = blk_a <= blk_b
    return tl.where(a, blk_a, blk_b), tl.where(a, own_a, own_b), tl.where(a, window_a, window_b)


@triton.jit
def _highest_block(blk_a, value_a, blk_b, value_b):
    """Combine of a scan keeping the highest block and its value."""
    b = blk_b >= blk_a
    return tl.where(b, blk_b, blk_a), tl.where(b, value_b, value_a)


@triton.jit
def _at(x, blk, at):
    """``x``'s value at block ``at`` of the chunk (0 if none)."""
    return tl.sum(tl.where(blk == at, x, 0), 0)


@triton.jit
def _read_tokens(blk, valid, phys, kind, seq_len, unread_head_ptr, unread_tail_ptr, KV_BLOCK_SIZE: tl.constexpr):
    """Per block: its unread head and tail records and its read tokens, the present slots
    between them (none in a hidden block: `compact_shifts_per_block`)."""
    head = tl.load(unread_head_ptr + phys, mask=valid, other=0)
    tail = tl.load(unread_tail_ptr + phys, mask=valid, other=0)
    present = tl.minimum(tl.maximum(seq_len - blk * KV_BLOCK_SIZE, 0), KV_BLOCK_SIZE)
    read = tl.maximum(tl.minimum(present, KV_BLOCK_SIZE - tail) - head, 0)
    return head, tail, tl.where(valid & (kind != _HSEP), read, 0)


@triton.jit
def _read_ahead(look, num_blocks, read_before, row_ptr, stride_btb, block_kind_ptr, unread_head_ptr, unread_tail_ptr,
                seq_len, KV_BLOCK_SIZE: tl.constexpr, CHUNK: tl.constexpr):
    """The first block from ``look`` on with read tokens, unless a marker block comes first
    (``num_blocks`` then), and its own shift (``read_before``: the read tokens before ``look``):
    where a span open at a chunk's end takes its shift from. Walks on only while neither shows."""
    found = num_blocks + look * 0
    own = read_before * 0
    while look < num_blocks:
        blk = look + tl.arange(0, CHUNK)
        valid = blk < num_blocks
        phys = tl.load(row_ptr + blk * stride_btb, mask=valid, other=0).to(tl.int64)
        kind = tl.load(block_kind_ptr + phys, mask=valid, other=0).to(tl.int32)
        head, _, read = _read_tokens(blk, valid, phys, kind, seq_len, unread_head_ptr, unread_tail_ptr, KV_BLOCK_SIZE)
        stop = tl.min(tl.where(valid & ((read > 0) | (kind != 0)), blk, num_blocks), 0)
        plain = (stop < num_blocks) & (_at(kind, blk, stop) == 0)
        found = tl.where(plain, stop, found)
        own = tl.where(plain, stop * KV_BLOCK_SIZE + _at(head, blk, stop) - read_before, own)
        look = tl.where(stop < num_blocks, num_blocks, look + CHUNK)
    return found, own


@triton.jit
def _compact_shifts(start, blk, valid, phys, kind, window, seq_len, num_blocks, read_before, span_shift, row_ptr,
                    stride_btb, block_kind_ptr, unread_head_ptr, unread_tail_ptr, KV_BLOCK_SIZE: tl.constexpr,
                    CHUNK: tl.constexpr):
    """The compact shift of each block of the chunk from ``start`` (`compact_shifts_per_block`),
    whether it has unread slots, and what the next chunk carries in: the read tokens before it
    and the shift of the span open at its start (``read_before`` and ``span_shift``: this chunk's).

    Outside spans a block's shift is its *own*: its index less the compact position of its
    first read token. A span block takes the own shift of its span's first block with read
    tokens (its opener's if none): a reverse scan finds each block's next read block, a
    forward scan carries each opener's value to its span, and a span opened in the chunk with
    no read block in it by the chunk's end reads ahead (`_read_ahead`)."""
    head, tail, read = _read_tokens(blk, valid, phys, kind, seq_len, unread_head_ptr, unread_tail_ptr, KV_BLOCK_SIZE)
    own = blk * KV_BLOCK_SIZE + head - (read_before + tl.cumsum(read, 0) - read)
    read_before += tl.sum(read, 0)
    last = start + CHUNK - 1
    last_window = _at(window, blk, last)
    read_in_last_span = tl.max(((read > 0) & (window == last_window)).to(tl.int32), 0)
    opened_here = (last_window >= start * KV_BLOCK_SIZE) & (read_in_last_span == 0) & (last < num_blocks)
    ahead, ahead_own = _read_ahead(tl.where(opened_here, last + 1, num_blocks), num_blocks, read_before, row_ptr,
                                   stride_btb, block_kind_ptr, unread_head_ptr, unread_tail_ptr, seq_len,
                                   KV_BLOCK_SIZE, CHUNK)  # fmt: skip
    nxt, nxt_own, nxt_window = tl.associative_scan(
        (tl.where(read > 0, blk, num_blocks), own, window), 0, _lowest_block, reverse=True)
    beyond = nxt == num_blocks  # none in the chunk: the one ahead (its window the last block's)
    nxt_own = tl.where(beyond, ahead_own, nxt_own)
    nxt_window = tl.where(beyond, last_window, nxt_window)
    nxt = tl.where(beyond, ahead, nxt)
    # A block's shift if it opens a span: its next read block's, if in the same span.
    as_opener = tl.where((nxt < num_blocks) & (nxt_window == window), nxt_own, own)
    opener, opened = tl.associative_scan((tl.where(valid & (kind != 0), blk, -1), as_opener), 0, _highest_block)
    shift = tl.where(window < 0, own, tl.where(opener >= 0, opened, span_shift))
    return shift, (head > 0) | (tail > 0), read_before, _at(shift, blk, last)


@triton.jit
def _unread_and_read_ends(blk, valid, phys, seq_len, first_row, unread_head_ptr, unread_tail_ptr,
                          KV_BLOCK_SIZE: tl.constexpr):
    """The chunk's first and last unread slots (``seq_len`` and -1 if none), its last read one (-1 if
    none) and its first read one from ``first_row`` on (``seq_len`` if none), as token positions
    (`_unread_before_read_rows`, `_unread_after_read_rows`)."""
    head = tl.load(unread_head_ptr + phys, mask=valid, other=0)
    tail = tl.load(unread_tail_ptr + phys, mask=valid, other=0)
    start = blk * KV_BLOCK_SIZE
    present = tl.minimum(tl.maximum(seq_len - start, 0), KV_BLOCK_SIZE)
    first_unread = tl.where(head > 0, start, tl.where(tail > 0, start + KV_BLOCK_SIZE - tail, seq_len))
    first_unread = tl.where(valid & (first_unread < seq_len), first_unread, seq_len)
    read_end = tl.minimum(present, KV_BLOCK_SIZE - tail)
    last_read = tl.where(valid & (read_end > head), start + read_end - 1, -1)
    last_slot_unread = (present > 0) & ((present <= head) | (present > read_end))
    last_unread = tl.where(last_slot_unread, start + present, tl.where((present > 0) & (head > 0), start + head, 0))
    last_unread = tl.where(valid, last_unread - 1, -1)
    first_read_row = tl.maximum(start + head, first_row)
    first_read_row = tl.where(valid & (first_read_row < start + read_end), first_read_row, seq_len)
    return tl.min(first_unread, 0), tl.max(last_read, 0), tl.max(last_unread, 0), tl.min(first_read_row, 0)


@triton.jit
def _kept_slots(phys, valid, present, compacted, unread_head_ptr, unread_tail_ptr, KV_BLOCK_SIZE: tl.constexpr):
    """The slots ``lo <= slot < hi`` of a block a request keeps on scratch pages (`kept_slots`, hidden
    blocks aside): its ``present`` ones; with ``compacted`` (a compactable request in the compact
    reading) its read ones only."""
    read = tl.where(compacted, valid, False)
    head = tl.load(unread_head_ptr + phys, mask=read, other=0)
    tail = tl.load(unread_tail_ptr + phys, mask=read, other=0)
    return head, tl.minimum(present, KV_BLOCK_SIZE - tail)


@triton.jit
def _store_query_shifts(query_shift_ptr, shift, start, blk, valid, q_begin, q_len, seq_len, num_tokens,
                        KV_BLOCK_SIZE: tl.constexpr, CHUNK: tl.constexpr):
    """Each query row of the request in the chunk's blocks (below ``num_tokens``) gets its block's
    shift: one store per slot of the blocks, so registers stay one chunk wide at any block size,
    and none in a chunk without query rows (most of a decode's)."""
    ctx_len = seq_len - q_len
    if ((start + CHUNK) * KV_BLOCK_SIZE > ctx_len) & (start * KV_BLOCK_SIZE < seq_len):
        for slot in range(KV_BLOCK_SIZE):
            pos = blk * KV_BLOCK_SIZE + slot
            row = q_begin + pos - ctx_len
            tl.store(query_shift_ptr + row, shift, mask=valid & (pos >= ctx_len) & (pos < seq_len) & (row < num_tokens))


@triton.jit(do_not_specialize=["num_blocks", "num_tokens", "stride_flags", "stride_btr"])
def _derive_step_kernel(
    window_starts_ptr, flags_ptr, kept_len_ptr, kept_start_ptr, key_shift_ptr, query_shift_ptr,
    block_table_ptr, block_kind_ptr, block_origin_ptr, unread_head_ptr, unread_tail_ptr, query_start_loc_ptr,
    seq_lens_ptr, num_blocks, num_tokens, stride_flags, stride_btr, stride_btb,
    KV_BLOCK_SIZE: tl.constexpr, CHUNK: tl.constexpr,
    COMPACT: tl.constexpr,  # the compact reading: shifts from the unread records, ``query_shift`` written
):  # fmt: skip
    """Program r: request r's row of every output (`derive_step_tensors_reference`); the last
    program also zeroes the compact reading's padding query rows."""
    req = tl.program_id(0)
    seq_len = tl.load(seq_lens_ptr + req)
    q_begin = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_begin
    first_row_block = (seq_len - q_len) // KV_BLOCK_SIZE
    last_row_block = tl.where(seq_len > 0, (seq_len - 1) // KV_BLOCK_SIZE, -1)
    row_ptr = block_table_ptr + req.to(tl.int64) * stride_btr
    out_row = req.to(tl.int64) * num_blocks
    latest = tl.full((), -1, tl.int32)  # the latest marker block so far, as index * 4 + kind
    hidden_seen = tl.full((), 0, tl.int32)
    moved = tl.full((), 0, tl.int32)
    hidden = tl.full((), 0, tl.int32)
    masked = tl.full((), 0, tl.int32)
    span_rows = tl.full((), 0, tl.int32)
    read_before = tl.full((), 0, tl.int32)  # compact: read tokens before the chunk
    span_shift = tl.full((), 0, tl.int32)  # compact: the shift of the span open at the chunk's start
    unread_keys = tl.full((), 0, tl.int32)
    shifted = tl.full((), 0, tl.int32)  # compact: a shift among the request's blocks, or an unread key read past
    first_unread = seq_len  # compact: the request's first unread key
    last_read = tl.full((), -1, tl.int32)  # compact: its last read token
    last_unread = tl.full((), -1, tl.int32)  # compact: its last unread token
    first_read_row = seq_len  # compact: its first read query row
    for start in range(0, num_blocks, CHUNK):
        blk = start + tl.arange(0, CHUNK)
        valid = blk < num_blocks
        phys = tl.load(row_ptr + blk * stride_btb, mask=valid, other=0).to(tl.int64)
        kind = tl.load(block_kind_ptr + phys, mask=valid, other=0).to(tl.int32)
        origin = tl.load(block_origin_ptr + phys, mask=valid, other=0)
        in_request = valid & (blk * KV_BLOCK_SIZE < seq_len)
        marker = tl.where(valid & (kind != 0), blk * 4 + kind, -1)
        marker = tl.maximum(tl.associative_scan(marker, 0, _max), latest)
        latest = tl.maximum(latest, tl.max(marker, 0))
        marker_kind = marker & 3
        in_span = (marker >= 0) & ((marker_kind == _SSEP) | (marker_kind == _HSEP))
        window = tl.where(in_span, (marker >> 2) * KV_BLOCK_SIZE, _OUTSIDE_SPANS)
        tl.store(window_starts_ptr + out_row + blk, window, mask=valid)
        key_shift = (blk - origin) * KV_BLOCK_SIZE
        if COMPACT:
            shift, has_unread, read_before, span_shift = _compact_shifts(
                start, blk, valid, phys, kind, window, seq_len, num_blocks, read_before, span_shift, row_ptr,
                stride_btb, block_kind_ptr, unread_head_ptr, unread_tail_ptr, KV_BLOCK_SIZE, CHUNK,
            )  # fmt: skip
            key_shift -= shift
            unread_keys = tl.maximum(unread_keys, tl.max((in_request & has_unread).to(tl.int32), 0))
            shifted = tl.maximum(shifted, tl.max((in_request & (shift != 0)).to(tl.int32), 0))
            chunk_unread, chunk_read, chunk_last_unread, chunk_read_row = _unread_and_read_ends(
                blk, valid, phys, seq_len, seq_len - q_len, unread_head_ptr, unread_tail_ptr, KV_BLOCK_SIZE)
            first_unread = tl.minimum(first_unread, chunk_unread)
            last_read = tl.maximum(last_read, chunk_read)
            last_unread = tl.maximum(last_unread, chunk_last_unread)
            first_read_row = tl.minimum(first_read_row, chunk_read_row)
            _store_query_shifts(query_shift_ptr, shift, start, blk, valid, q_begin, q_len, seq_len, num_tokens,
                                KV_BLOCK_SIZE, CHUNK)  # fmt: skip
        tl.store(key_shift_ptr + out_row + blk, key_shift, mask=valid)
        is_hidden = (valid & (kind == _HSEP)).to(tl.int32)
        hidden_before = tl.maximum(tl.associative_scan(is_hidden, 0, _max), hidden_seen) > 0
        hidden_seen = tl.maximum(hidden_seen, tl.max(is_hidden, 0))
        rows = valid & (blk >= first_row_block) & (blk <= last_row_block)
        moved = tl.maximum(moved, tl.max((in_request & (key_shift != 0)).to(tl.int32), 0))
        hidden = tl.maximum(hidden, tl.max((in_request & (is_hidden > 0)).to(tl.int32), 0))
        row_masked = (window > 0) | ((window < 0) & hidden_before)
        masked = tl.maximum(masked, tl.max((rows & row_masked).to(tl.int32), 0))
        span_rows = tl.maximum(span_rows, tl.max((rows & (window >= 0)).to(tl.int32), 0))
    if COMPACT:
        hidden = tl.maximum(hidden, unread_keys)
        # Causal attention but for a read query row after an unread key (`_unread_before_read_rows`).
        before_read = (first_unread < last_read) & (last_read >= seq_len - q_len)
        shifted = tl.maximum(shifted, before_read.to(tl.int32))
        if req == tl.num_programs(0) - 1:  # padding rows after the last request's: no shift
            for pad_start in range(tl.load(query_start_loc_ptr + req + 1), num_tokens, CHUNK):
                pad = pad_start + tl.arange(0, CHUNK)
                tl.store(query_shift_ptr + pad, tl.zeros([CHUNK], tl.int32), mask=pad < num_tokens)
    # Rows outside spans, every unread token before the first read one (`_unread_after_read_rows`).
    after_read = (last_unread > first_read_row).to(tl.int32)
    masked = tl.maximum(masked, shifted)
    compactable = masked * (1 - span_rows) * (1 - after_read)
    tl.store(flags_ptr + 0 * stride_flags + req, moved.to(tl.int8))
    tl.store(flags_ptr + 1 * stride_flags + req, hidden.to(tl.int8))
    tl.store(flags_ptr + 2 * stride_flags + req, masked.to(tl.int8))
    tl.store(flags_ptr + 3 * stride_flags + req, compactable.to(tl.int8))
    compacted = compactable * COMPACT > 0
    kept_so_far = tl.full((), 0, tl.int32)
    for start in range(0, num_blocks, CHUNK):
        blk = start + tl.arange(0, CHUNK)
        valid = blk < num_blocks
        kept = tl.where(valid, tl.minimum(tl.maximum(seq_len - blk * KV_BLOCK_SIZE, 0), KV_BLOCK_SIZE), 0)
        if compactable > 0:  # a second look at the records, for this request only
            phys = tl.load(row_ptr + blk * stride_btb, mask=valid, other=0).to(tl.int64)
            kind = tl.load(block_kind_ptr + phys, mask=valid, other=0).to(tl.int32)
            lo, hi = _kept_slots(phys, valid, kept, compacted, unread_head_ptr, unread_tail_ptr, KV_BLOCK_SIZE)
            kept = tl.where(kind == _HSEP, 0, tl.maximum(hi - lo, 0))
        tl.store(kept_start_ptr + out_row + blk, tl.where(kept > 0, kept_so_far + tl.cumsum(kept, 0) - kept, -1),
                 mask=valid)  # fmt: skip
        kept_so_far += tl.sum(kept, 0)
    tl.store(kept_len_ptr + req, kept_so_far)


def derive_step_tensors(
    block_table: torch.Tensor,
    block_kind: torch.Tensor,
    block_origin: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    unread: tuple[torch.Tensor, torch.Tensor] | None = None,
    num_tokens: int = 0,
) -> StepTensors:
    """`derive_step_tensors_reference` in one launch, no host sync (graph-safe)."""
    num_reqs, num_blocks = block_table.shape
    device = block_table.device
    window_starts = torch.empty(num_reqs, num_blocks, dtype=torch.int32, device=device)
    kept_start = torch.empty(num_reqs, num_blocks, dtype=torch.int32, device=device)
    key_shift = torch.empty(num_reqs, num_blocks, dtype=torch.int32, device=device)
    flags = flag_rows(num_reqs, device)
    kept_len = torch.empty(num_reqs, dtype=torch.int32, device=device)
    query_shift = None
    if unread is not None:  # written by the kernel, padding rows included (all of them without requests)
        query_shift = (torch.empty if num_reqs else torch.zeros)(num_tokens, dtype=torch.int32, device=device)
    head, tail = unread if unread is not None else (block_origin, block_origin)  # read only in the compact reading
    if num_reqs:
        _derive_step_kernel[(num_reqs,)](
            window_starts, flags, kept_len, kept_start, key_shift,
            query_shift if query_shift is not None else key_shift, block_table, block_kind, block_origin, head, tail,
            query_start_loc, seq_lens, num_blocks, num_tokens,
            flags.stride(0), *block_table.stride(), KV_BLOCK_SIZE=block_size, CHUNK=_CHUNK,
            COMPACT=unread is not None, num_warps=4,
        )  # fmt: skip
    return StepTensors(window_starts, flags, kept_len, kept_start, key_shift, query_shift)
