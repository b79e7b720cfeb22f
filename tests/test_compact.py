"""The compact reading (`minipic_protocol.compact`): which tokens are unread, each token's
position, and that a block's read tokens move by one shift (what block records could carry)."""

from __future__ import annotations

import random

import torch

from minipic_kernels.block_kinds import window_starts_per_block
from minipic_kernels.compact_shifts import compact_shifts_per_block
from minipic_protocol.blocks import block_kind_of
from minipic_protocol.compact import compact_positions_of_prompt, unread_ends_of_blocks, unread_of_prompt
from minipic_protocol.markers import MarkerIds

SSEP, PDEP, PAD, HSEP, TEXT = 1, 2, 3, 4, 9
MARKERS = MarkerIds(SSEP, PDEP, PAD, HSEP)
B = 4


def test_a_refreshed_head_reads_as_the_plain_prompt() -> None:
    # [text x3 pad][PDep text x3][HSep text x3][text text pad pad][PDep text x3]
    prompt = [TEXT] * 3 + [PAD, PDEP] + [TEXT] * 3 + [HSEP] + [TEXT] * 5 + [PAD, PAD, PDEP] + [TEXT] * 3
    positions = compact_positions_of_prompt(prompt, B, MARKERS)
    assert positions == [0, 1, 2, 3, 3, 3, 4, 5, 2, 3, 4, 5, 6, 7, 8, 9, 8, 8, 9, 10]
    unread = unread_of_prompt(prompt, B, MARKERS)
    assert [i for i, u in enumerate(unread) if u] == [3, 4, 14, 15, 16]
    # the span's hidden head (8..11) overlaps the in-context head (5..7) it copies: both end at 5
    assert positions[5:8] == positions[9:12]


def test_a_pdep_token_inside_a_block_is_read() -> None:
    assert unread_of_prompt([TEXT, PDEP, TEXT, TEXT, PDEP], B, MARKERS) == [False, False, False, False, True]


def test_a_prompt_without_markers_keeps_its_indices() -> None:
    assert compact_positions_of_prompt([TEXT] * 11, B, MARKERS) == list(range(11))


def _sdk_like_prompt(rng: random.Random) -> list[int]:
    """Text, then segments that each open a block with a marker and end padded to a boundary."""
    prompt = [TEXT] * rng.randrange(1, 12)
    for _ in range(rng.randrange(1, 6)):
        prompt += [PAD] * (-len(prompt) % B)
        prompt += [rng.choice([SSEP, PDEP, HSEP])] + [TEXT] * rng.randrange(0, 14)
    return prompt


def test_every_block_moves_its_read_tokens_by_one_shift() -> None:
    """In prompts laid out as the SDK lays them (pads only before a marker block), a block's read
    tokens keep their spacing, so one shift per block gives every read position."""
    rng = random.Random(0)
    for _ in range(500):
        prompt = _sdk_like_prompt(rng)
        positions = compact_positions_of_prompt(prompt, B, MARKERS)
        unread = unread_of_prompt(prompt, B, MARKERS)
        for start in range(0, len(prompt), B):
            shifts = {positions[i] - i for i in range(start, min(start + B, len(prompt))) if not unread[i]}
            assert len(shifts) <= 1, (prompt, start)
        read = [positions[i] for i in range(len(prompt)) if not unread[i]]
        assert read[0] == 0 and all(b - a <= 1 for a, b in zip(read, read[1:]) if b > a)  # no holes going forward


def test_only_pads_ending_a_whole_block_are_unread() -> None:
    # a pad inside text and pads ending the prompt mid-block are read; a PDep inside a block is read
    prompt = [TEXT, PAD, TEXT, PAD, PDEP, TEXT, PAD, PAD, TEXT, PDEP, PAD]
    assert [i for i, u in enumerate(unread_of_prompt(prompt, B, MARKERS)) if u] == [3, 4, 6, 7]
    assert unread_ends_of_blocks(prompt, B, MARKERS) == ([0, 1, 0], [1, 2, 0])


def test_the_block_records_give_every_read_position() -> None:
    """The server's form: per-block unread heads and tails, scattered into physical blocks, and
    one shift per logical block derived from them (`compact_shifts_per_block`) give each read
    token (and each token of a hidden block) its compact position."""
    rng = random.Random(1)
    for _ in range(300):
        prompt = _sdk_like_prompt(rng)
        num_blocks = -(-len(prompt) // B)
        heads, tails = unread_ends_of_blocks(prompt, B, MARKERS)
        physical = torch.randperm(num_blocks + 3)[:num_blocks].to(torch.int32)
        kind = torch.zeros(num_blocks + 3, dtype=torch.int8)
        head, tail = torch.zeros(num_blocks + 3, dtype=torch.int32), torch.zeros(num_blocks + 3, dtype=torch.int32)
        kinds = [block_kind_of(prompt[b * B], *MARKERS.kind_ids) for b in range(num_blocks)]
        kind[physical.long()] = torch.tensor([int(k) for k in kinds], dtype=torch.int8)
        head[physical.long()] = torch.tensor(heads, dtype=torch.int32)
        tail[physical.long()] = torch.tensor(tails, dtype=torch.int32)
        table, seq_lens = physical[None, :], torch.tensor([len(prompt)])
        windows = window_starts_per_block(table, kind, B)
        shifts = compact_shifts_per_block(table, kind, head, tail, windows, seq_lens, B)[0].tolist()
        positions = compact_positions_of_prompt(prompt, B, MARKERS)
        unread = unread_of_prompt(prompt, B, MARKERS)
        got = [i - shifts[i // B] for i in range(len(prompt)) if not unread[i]]
        assert got == [p for p, u in zip(positions, unread) if not u], prompt
