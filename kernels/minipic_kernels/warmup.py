"""Compile every Triton kernel variant a layer shape can dispatch to, before serving.

Triton compiles a kernel the first time it meets a new set of compile-time constants
(and integer/pointer specialisations). A step writes its keys and values (`kv_write`),
then `paged_rope_attention` picks among a fixed set of variants per layer shape: the
decode launch for single-token and multi-token decodes, each with and without key splits
(plus their merge), the pre-pass moving keys into scratch pages, and the tile launch (the prefill a stock kernel
cannot take, every prefill without one). `warm_up` runs one small batch per variant, with
tensors strided exactly like vLLM's, so serving never waits for a compiler. The compact
reading compiles its own variants (the step derivation's and attention's), which
``compact=True`` warms instead.
"""

from __future__ import annotations

import dataclasses

import torch

from minipic_kernels.attention import PagedAttention, paged_rope_attention
from minipic_kernels.block_kinds import BlockKind
from minipic_kernels.kv_write import write_kv
from minipic_kernels.triton_attention import decode_programs_to_fill, decode_query_limit

__all__ = ["LayerShape", "warm_up"]


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """What selects kernel variants: one entry per distinct attention layer of a model."""

    num_q_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: torch.dtype
    rotary_dim: int
    is_neox: bool


def warm_up(
    shape: LayerShape,
    cos_sin: torch.Tensor,
    scale: float,
    paged_attention: PagedAttention | None,
    *,
    table_width: int = 64,
    compact: bool = False,
) -> None:
    """Run every variant once on small random inputs (results are discarded).

    ``cos_sin`` stands in for the unit rotation table attention reads. ``table_width`` is the
    block-table width the server uses (its row stride is not specialised on, so any width
    compiles the same kernels). ``compact``: the server's steps are in the compact reading.
    """
    device = cos_sin.device
    group = shape.num_q_heads // shape.num_kv_heads
    limit = decode_query_limit(group)
    # Enough decode requests to fill the GPU without key splits; one alone splits.
    many = -(-decode_programs_to_fill(device, shape.head_size) // shape.num_kv_heads) + 1
    batches = [
        # windowed tiles, stock kernel at origin and over moved keys; split decode
        [(96, 96), (80, 64), (64, 40), (600, 1)],
        [(50, 1)] * many,  # decode without splits
        [(40, 40), (600, limit)],  # multi-token decode, split
        [(50, limit)] * many,  # multi-token decode without splits
    ]
    for reqs in batches:
        _run(shape, cos_sin, scale, paged_attention, reqs, 1 << 30, table_width, moved=2, compact=compact)
    # Over the scratch budget: the tile kernel takes the misplaced request.
    _run(shape, cos_sin, scale, paged_attention, [(64, 40), (30, limit)], 0, table_width, moved=0, compact=compact)


def _run(
    shape: LayerShape,
    cos_sin: torch.Tensor,
    scale: float,
    paged_attention: PagedAttention | None,
    reqs: list[tuple[int, int]],
    scratch_budget_bytes: int,
    table_width: int,
    *,
    moved: int,
    compact: bool = False,
) -> None:
    """One step over fresh random tensors; request ``moved`` (if any) reads its first block
    away from where it was computed. With ``compact``, in the compact reading, where the first
    request's second block and the moved one's (if any) open with an unread marker."""
    device, bs = cos_sin.device, shape.block_size
    hq, hkv, d = shape.num_q_heads, shape.num_kv_heads, shape.head_size
    blocks = [-(-seq // bs) for seq, _ in reqs]
    num_blocks = sum(blocks) + 1
    # vLLM's layout: one (blocks, kv heads, block size, 2 * head) tensor per layer, K and V
    # side by side; the query is a slice of the fused qkv projection.
    packed = torch.randn(num_blocks, hkv, bs, 2 * d, device=device).to(shape.dtype)
    key_cache, value_cache = packed.transpose(1, 2).split(d, dim=-1)
    table = torch.zeros(len(reqs), max(table_width, max(blocks)), dtype=torch.int32, device=device)
    first = 1
    for r, n in enumerate(blocks):
        table[r, :n] = torch.arange(first, first + n, dtype=torch.int32)
        first += n
    kinds = torch.zeros(num_blocks, dtype=torch.int8, device=device)
    kinds[2] = BlockKind.SSEP  # a window inside the first request
    origin = torch.zeros(num_blocks, dtype=torch.int32)
    for r, n in enumerate(blocks):
        origin[table[r, :n].long().cpu()] = torch.arange(n, dtype=torch.int32)
    if 0 <= moved < len(reqs):
        origin[int(table[moved, 0])] = 1
    origin = origin.to(device)
    # The step's new tokens into their slots, as the backend's cache write does.
    positions = torch.cat([torch.arange(seq - q, seq) for seq, q in reqs])
    owners = torch.cat([torch.full((q,), r) for r, (_, q) in enumerate(reqs)])
    slots = (table.cpu()[owners, positions // bs].long() * bs + positions % bs).to(device)
    q_lens = torch.tensor([q for _, q in reqs], dtype=torch.int32)
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_lens, 0)
    num_tokens = int(qsl[-1])
    qkv = torch.randn(num_tokens, (hq + 2 * hkv) * d, device=device).to(shape.dtype)
    query = qkv[:, : hq * d].view(num_tokens, hq, d)
    key = qkv[:, hq * d : (hq + hkv) * d].view(num_tokens, hkv, d)
    value = qkv[:, (hq + hkv) * d :].view(num_tokens, hkv, d)
    # Every block but the first written at its origin; the first rotated back (both branches).
    write_shift = torch.zeros(num_blocks, dtype=torch.int32, device=device)
    write_shift[int(table[0, 0])] = 1
    write_kv(key, value, key_cache, value_cache, slots, write_shift, cos_sin, shape.rotary_dim, shape.is_neox)
    out = torch.empty(num_tokens, hq, d, device=device, dtype=shape.dtype)
    unread: tuple[torch.Tensor, torch.Tensor] | None = None
    if compact:  # the server's records: int32 per physical block
        head = torch.zeros(num_blocks, dtype=torch.int32, device=device)
        # An unread marker opening the first request's second block (rows after it in a span: the tile kernel)
        # and the moved one's (rows outside spans after it: scratch pages of read keys moved by the rows' shift).
        for r in {0, moved} & set(range(len(reqs))):
            if blocks[r] > 1:
                head[int(table[r, 1])] = 1
        unread = (head, torch.zeros_like(head))
    paged_rope_attention(
        query, key_cache, value_cache, table, qsl.to(device),
        torch.tensor([s for s, _ in reqs], dtype=torch.int32, device=device), kinds, origin, cos_sin,
        shape.rotary_dim, shape.is_neox, scale, out, paged_attention=paged_attention,
        scratch_budget_bytes=scratch_budget_bytes, unread=unread,
    )  # fmt: skip
