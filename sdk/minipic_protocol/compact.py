"""The compact reading of a prompt: pads and PDep markers unread and given no position.

A MiniPIC prompt carries tokens the model never saw in training: pads that fill a segment to
a block boundary and the PDep marker opening a block. Read as text they cost an off-the-shelf
model answers (docs/accuracy.md); hidden but left in place they leave holes in the positions,
which costs more. In the compact reading they are *unread* (no read token attends them, nor
sees what they compute, which is therefore unspecified but finite: a reference reads them
causally, a kernel may give them fewer keys) and take no position:
every token the prompt's readers see sits right after the one before it, as in the plain
prompt, and each span keeps its own spacing, placed so that its first read token follows what
precedes it (a hidden head, read only by its own span, then overlaps the positions of the
in-context copy before it).

`benchmarks/accuracy_emulation.py` (``+compact``) answers with it in transformers; a server
started with ``--compact`` serves it. The forms below are per token; a read token's position
differs from its index by one shift per block (`tests/test_compact.py`), so the server carries
the rule as block records (`unread_ends_of_blocks`) and derives the shifts per step
(`minipic_kernels.compact_shifts`). Only pads that run to the end of a block wholly inside
the prompt are unread (the SDK lays every pad so); a pad anywhere else is read as text.
"""

from __future__ import annotations

from collections.abc import Sequence

from minipic_protocol.blocks import OUTSIDE_SPANS, hidden_of_prompt, window_starts_of_prompt
from minipic_protocol.markers import MarkerIds


def unread_of_prompt(token_ids: Sequence[int], block_size: int, markers: MarkerIds) -> list[bool]:
    """Whether each token is unread: a PDep marker opening a block, or a pad in the run of pads
    that ends a block wholly inside the prompt."""
    heads, tails = unread_ends_of_blocks(token_ids, block_size, markers)
    unread = []
    for index in range(len(token_ids)):
        block, slot = divmod(index, block_size)
        unread.append(slot < heads[block] or slot >= block_size - tails[block])
    return unread


def unread_ends_of_blocks(
    token_ids: Sequence[int], block_size: int, markers: MarkerIds, first_block: int = 0
) -> tuple[list[int], list[int]]:
    """Per block from ``first_block`` on: its unread head (1 when a PDep marker opens it) and
    its unread tail (its trailing pads; none in a block the prompt ends inside, which generated
    tokens continue), the two records a server keeps per KV block."""
    heads, tails = [], []
    for start in range(first_block * block_size, len(token_ids), block_size):
        block = token_ids[start : start + block_size]
        heads.append(int(block[0] == markers.pdep_token_id))
        read_end = len(block)
        while len(block) == block_size and read_end > 0 and block[read_end - 1] == markers.pad_token_id:
            read_end -= 1
        tails.append(len(block) - read_end)
    return heads, tails


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
