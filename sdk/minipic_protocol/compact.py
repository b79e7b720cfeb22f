"""The compact reading of a prompt: pads and PDep markers unread and given no position.

A MiniPIC prompt carries tokens the model never saw in training: pads that fill a segment to
a block boundary and the PDep marker opening a block. Read as text they cost an off-the-shelf
model answers (docs/accuracy.md); hidden but left in place they leave holes in the positions,
which costs more. In the compact reading they are *unread* (no other token attends them) and
take no position: every token the prompt's readers see sits right after the one before it, as
in the plain prompt, and each span keeps its own spacing, placed so that its first read token
follows what precedes it (a hidden head, read only by its own span, then overlaps the positions
of the in-context copy before it).

`benchmarks/accuracy_emulation.py` (``+compact``) answers with it in transformers; the server
does not compute it yet. Both forms below are per token; a read token's position differs from
its index by one shift per block (`tests/test_compact.py`), the form block records can carry.
"""

from __future__ import annotations

from collections.abc import Sequence

from minipic_protocol.blocks import OUTSIDE_SPANS, hidden_of_prompt, window_starts_of_prompt
from minipic_protocol.markers import MarkerIds


def unread_of_prompt(token_ids: Sequence[int], block_size: int, markers: MarkerIds) -> list[bool]:
    """Whether each token is unread: a pad, or a PDep marker opening a block."""
    return [
        token == markers.pad_token_id or (token == markers.pdep_token_id and index % block_size == 0)
        for index, token in enumerate(token_ids)
    ]


def compact_positions_of_prompt(token_ids: Sequence[int], block_size: int, markers: MarkerIds) -> list[int]:
    """Each token's position in the compact reading: outside spans, the number of *kept* tokens
    before it (kept: neither unread nor in a hidden block); in a span, the span's first kept
    token's position plus the token's distance from it."""
    unread = unread_of_prompt(token_ids, block_size, markers)
    hidden = hidden_of_prompt(token_ids, block_size, *markers.kind_ids)
    starts = window_starts_of_prompt(token_ids, block_size, *markers.kind_ids)
    kept = [not (u or h) for u, h in zip(unread, hidden, strict=True)]
    positions, count = [], 0
    for keep in kept:
        positions.append(count)
        count += keep
    anchors: dict[int, int] = {}  # span start -> its first kept token (the start if none is)
    for index, start in enumerate(starts):
        if start != OUTSIDE_SPANS and (start not in anchors or (kept[index] and not kept[anchors[start]])):
            anchors[start] = index
    return [
        positions[index] if start == OUTSIDE_SPANS else positions[anchors[start]] + index - anchors[start]
        for index, start in enumerate(starts)
    ]
