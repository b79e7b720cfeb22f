"""The compact reading (`minipic_protocol.compact`): which tokens are unread, each token's
position, and that a block's read tokens move by one shift (what block records could carry)."""

from __future__ import annotations

import random

from minipic_protocol.compact import compact_positions_of_prompt, unread_of_prompt
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
