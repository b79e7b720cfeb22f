"""The torch reference (what the CPU backend runs, and the contract of the Triton kernels)
against a dense attention with an explicit mask written from the segments, not from the rule.

Hidden (HSep) span heads, at block 0 and later, read at their origin and moved.
"""

from __future__ import annotations

import pytest
import torch

from minipic_kernels.block_kinds import BlockKind
from minipic_kernels.reference import paged_rope_attention_reference

BS, D, HQ, HKV = 4, 8, 4, 2


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Neox RoPE of ``x`` ``(tokens, heads, D)`` as complex rotation, written out here."""
    half = D // 2
    angles = positions[:, None].double() / (10000 ** (torch.arange(half, dtype=torch.float64) * 2 / D))
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * torch.polar(
        torch.ones_like(angles), angles
    )[:, None, :]
    return torch.cat((z.real, z.imag), dim=-1).float()


# (opener, blocks): "" plain text, "ssep"/"hsep" spans, "pdep" dependent segments.
LAYOUTS = {
    "hsep_at_block_0": [("hsep", 2), ("pdep", 1), ("hsep", 1), ("hsep", 2), ("ssep", 1), ("pdep", 2)],
    "epic_like": [("", 1), ("pdep", 1), ("hsep", 3), ("pdep", 1), ("hsep", 2), ("pdep", 1)],
}


def dense_mask(layout: list[tuple[str, int]]) -> torch.Tensor:
    """Who sees whom, from the segments: spans see themselves only, the rest everything before,
    except the first block of every hidden-head span other than their own."""
    n = sum(blocks for _, blocks in layout) * BS
    segment_of, start_of, hidden_keys = [], [], []
    at = 0
    for i, (opener, blocks) in enumerate(layout):
        segment_of += [i] * blocks * BS
        start_of.append(at)
        hidden_keys += [opener == "hsep" and j < BS for j in range(blocks * BS)]
        at += blocks * BS
    mask = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        s = segment_of[q]
        is_span = layout[s][0] in ("ssep", "hsep")
        for k in range(q + 1):
            if is_span and k < start_of[s]:
                continue
            if hidden_keys[k] and segment_of[k] != s:
                continue
            mask[q, k] = True
    return mask


@pytest.mark.parametrize("layout_name", sorted(LAYOUTS))
@pytest.mark.parametrize("moved", [False, True])
def test_reference_equals_dense_attention_with_hidden_heads(layout_name: str, moved: bool) -> None:
    layout = LAYOUTS[layout_name]
    g = torch.Generator().manual_seed(7)
    num_blocks = sum(blocks for _, blocks in layout)
    n = num_blocks * BS
    kinds_by_block: list[int] = []
    for opener, blocks in layout:
        first = {"": BlockKind.PLAIN, "ssep": BlockKind.SSEP, "hsep": BlockKind.HSEP, "pdep": BlockKind.PDEP}[opener]
        kinds_by_block += [int(first)] + [int(BlockKind.PLAIN)] * (blocks - 1)
    # Spans were computed elsewhere (their cached keys rotated at other positions) when moved.
    origins = [b + (5 if moved and kinds_by_block[b] != BlockKind.PDEP else 0) for b in range(num_blocks)]
    phys = torch.randperm(num_blocks + 2, generator=g)[:num_blocks]
    raw_keys = torch.randn(n, HKV, D, generator=g)
    values = torch.randn(n, HKV, D, generator=g)
    queries = torch.randn(n, HQ, D, generator=g)
    positions = torch.arange(n)
    key_cache = torch.zeros(num_blocks + 2, BS, HKV, D)
    value_cache = torch.zeros_like(key_cache)
    block_kind = torch.zeros(num_blocks + 2, dtype=torch.int8)
    block_origin = torch.zeros(num_blocks + 2, dtype=torch.int32)
    for b in range(num_blocks):
        rows = slice(b * BS, (b + 1) * BS)
        computed_at = positions[rows] + (origins[b] - b) * BS
        key_cache[phys[b]] = rope(raw_keys[rows], computed_at)
        value_cache[phys[b]] = values[rows]
        block_kind[phys[b]], block_origin[phys[b]] = kinds_by_block[b], origins[b]
    half = D // 2
    angles = torch.arange(n + 6 * BS)[:, None].double() / (10000 ** (torch.arange(half, dtype=torch.float64) * 2 / D))
    cos_sin = torch.cat((angles.cos(), angles.sin()), dim=-1).float()
    # Two requests over the same blocks: the whole prompt, and its last 3 tokens (a chunk / decode).
    table = phys[None, :].repeat(2, 1).to(torch.int32)
    q_rot = rope(queries, positions)
    query = torch.cat((q_rot, q_rot[-3:]))
    qsl = torch.tensor([0, n, n + 3], dtype=torch.int32)
    seq_lens = torch.tensor([n, n], dtype=torch.int32)
    out = paged_rope_attention_reference(
        query, key_cache, value_cache, table, qsl, seq_lens, block_kind, block_origin, cos_sin, D, True, D**-0.5
    )
    # Dense: every key at its place in the prompt, the segments' mask.
    k = rope(raw_keys, positions).repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)
    v = values.repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)
    scores = (q_rot.transpose(0, 1) @ k.transpose(1, 2)) * D**-0.5
    scores = scores.masked_fill(~dense_mask(layout), float("-inf"))
    expected = (torch.softmax(scores, dim=-1) @ v).transpose(0, 1)
    torch.testing.assert_close(out[:n], expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out[n:], expected[-3:], atol=1e-4, rtol=1e-4)
