"""Cases comparing the GPU attention path with the torch reference (helper, not a test module).

`tests/test_triton_kernel.py` runs this file in a subprocess with ``TRITON_INTERPRET=1``
so the Triton interpreter never leaks into the pytest process (other modules import
vLLM, which imports Triton). Run directly:

    TRITON_INTERPRET=1 PYTHONPATH=kernels python tests/triton_kernel_cases.py [NAME ...]

It prints one JSON line per case: ``{"name", "ok", "max_err", "tol", "detail"}``; the
name ``warm_up_coverage`` instead checks that `warm_up` launches every kernel variant that
random serving steps launch (`warm_up_coverage`).
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from collections.abc import Callable
from typing import Any

import torch

from minipic_kernels import kv_write, rotary_pages, step_tensors, triton_attention, warmup
from minipic_kernels.attention import paged_rope_attention, plan_step
from minipic_kernels.block_kinds import BlockKind
from minipic_kernels.compact_shifts import read_keys
from minipic_kernels.reference import (
    paged_causal_attention_reference,
    paged_rope_attention_reference,
    rotate,
    unit_rotation_table,
    write_kv_reference,
)
from minipic_kernels.step_tensors import HIDDEN, derive_step_tensors, derive_step_tensors_reference
from minipic_kernels.triton_attention import AttentionConfig


@dataclasses.dataclass
class Case:
    name: str
    reqs: list[tuple[int, int]]  # (seq_len, query_len) per request
    block_size: int = 16
    num_kv_heads: int = 2
    group: int = 1
    head_size: int = 64
    rotary_dim: int | None = None  # None: head_size
    is_neox: bool = True
    dtype: torch.dtype = torch.float32
    # "plain" | "mixed" (SSep/PDep blocks) | "hidden" (HSep blocks too) | "hidden_heads" (only HSep
    # heads); in the last two, the first two requests start with an HSep block and end with a PDep one;
    # "one_hidden": only the first request does, the others are plain; "refreshed_heads": each
    # request laid out as `REFRESHED_STEP_LAYOUTS` says.
    kinds: str = "mixed"
    duplicate_block: bool = False  # one physical block twice in a table
    misplaced: float = 0.5  # share of blocks read away from their origin
    prefill: AttentionConfig | None = AttentionConfig(32, 16, 4, 1)
    decode: AttentionConfig | None = AttentionConfig(16, 32, 4, 1, num_splits=1)
    # "tiles": no stock kernel, the tile kernel takes every prefill request; "dense": a stock
    # paged kernel (the reference stands in for FlashAttention) over the cache and over moved
    # keys in scratch pages; "dense_over_budget": no scratch budget, the tile kernel takes
    # the misplaced requests.
    mode: str = "tiles"
    table_rows: int | None = None  # RoPE table length (default: longest request + 5)
    host_upper_bounds: int = 0  # plan from host lengths this much above the device's
    # The compact reading's unread records: "" none (outside it), "random" (`random_unread`; none in the first
    # request), "tails" (the last two keys of each request unread and nothing else: without hidden blocks no
    # block shifts, so blocks at their origin stay unmoved), "refreshed" (with kinds "refreshed_heads": a marker
    # opening each PDep block and pads ending each block before one, as the SDK lays final prompts out)
    unread: str = ""
    span_bias: float = 0.0  # the server's span bias (`paged_rope_attention_reference`)
    seed: int = 0


def random_unread(g: torch.Generator, num_phys: int, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``(unread_head, unread_tail)`` records: most blocks read whole, some with a
    PDep-like head, trailing pads, or nothing read at all."""
    head = (torch.rand(num_phys, generator=g) < 0.3).to(torch.int32)
    tail = torch.where(torch.rand(num_phys, generator=g) < 0.3, torch.randint(0, bs, (num_phys,), generator=g), 0)
    unread_whole = torch.rand(num_phys, generator=g) < 0.15
    head[unread_whole], tail[unread_whole] = 1, bs - 1
    return head, tail.to(torch.int32)


def build(case: Case) -> dict:
    g = torch.Generator().manual_seed(case.seed)
    bs, hkv, d = case.block_size, case.num_kv_heads, case.head_size
    rot = case.rotary_dim or d
    blocks_per_req = [-(-s // bs) for s, _ in case.reqs]
    max_blocks = max(blocks_per_req) + 1  # a spare column holding junk ids
    num_phys = sum(blocks_per_req) + 3
    # Packed cache as vLLM hands it out: (blocks, heads, block_size, 2*d) -> strided K/V views.
    packed = torch.randn(num_phys, hkv, bs, 2 * d, generator=g).to(case.dtype)
    key_cache, value_cache = packed.transpose(1, 2).split(d, dim=-1)
    perm = torch.randperm(num_phys, generator=g)
    table = torch.randint(0, num_phys, (len(case.reqs), max_blocks), generator=g, dtype=torch.int32)
    at = 0
    for r, nb in enumerate(blocks_per_req):
        table[r, :nb] = perm[at : at + nb].to(torch.int32)
        at += nb
    if case.duplicate_block:
        r = max(range(len(case.reqs)), key=lambda i: blocks_per_req[i])
        assert blocks_per_req[r] >= 3
        table[r, blocks_per_req[r] - 1] = table[r, 0]
    # Origins: where each block was computed; a share of the blocks sits elsewhere (reused spans).
    origin = torch.randint(0, max_blocks, (num_phys,), generator=g, dtype=torch.int32)
    for r, nb in enumerate(blocks_per_req):
        for b in range(nb):
            if torch.rand((), generator=g) >= case.misplaced:
                origin[table[r, b]] = b
    kind = torch.zeros(num_phys, dtype=torch.int8)
    if case.kinds == "mixed":
        pattern = torch.randint(0, 5, (num_phys,), generator=g)
        kind[pattern == 1] = BlockKind.SSEP
        kind[pattern == 2] = BlockKind.SSEP
        kind[pattern == 3] = BlockKind.PDEP
    if case.kinds == "hidden":
        pattern = torch.randint(0, 5, (num_phys,), generator=g)
        kind[pattern == 1] = BlockKind.SSEP
        kind[pattern == 2] = BlockKind.HSEP
        kind[pattern == 3] = BlockKind.PDEP
    if case.kinds.startswith("hidden") or case.kinds == "one_hidden":
        # Hidden heads at block 0 (the corner case) that the rows after a PDep block must skip.
        for r in range(1 if case.kinds == "one_hidden" else 2):
            kind[table[r, 0].long()] = BlockKind.HSEP
            kind[table[r, blocks_per_req[r] - 1].long()] = BlockKind.PDEP
        if case.kinds == "hidden_heads":  # nothing else: only the hidden mask tells a causal kernel apart
            kind[table[2:, 0].long()] = BlockKind.HSEP
    if case.kinds == "refreshed_heads":
        for r, layout in enumerate(REFRESHED_STEP_LAYOUTS):
            for b, block_kind in enumerate(layout[: blocks_per_req[r]]):
                kind[table[r, b].long()] = block_kind
    seq_lens = torch.tensor([s for s, _ in case.reqs], dtype=torch.int32)
    qlens = [q for _, q in case.reqs]
    qsl = torch.zeros(len(qlens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(qlens), 0)
    num_tokens = int(qsl[-1])
    query = torch.randn(num_tokens, hkv * case.group, d, generator=g).to(case.dtype)
    max_pos = case.table_rows or max_blocks * bs + 5
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    compact = {}
    if case.unread == "random":  # all but the first request's blocks: it reads every key, as outside the reading
        head, tail = random_unread(g, num_phys, bs)
        head[table[0, : blocks_per_req[0]].long()], tail[table[0, : blocks_per_req[0]].long()] = 0, 0
        compact["unread"] = (head, tail)
    if case.unread == "tails":
        tail = torch.zeros(num_phys, dtype=torch.int32)
        for r, (n, _) in enumerate(case.reqs):
            tail[table[r, (n - 1) // bs].long()] = min(bs - 1, bs - (n - 1) % bs + 1)
        compact["unread"] = (torch.zeros(num_phys, dtype=torch.int32), tail)
    if case.unread == "refreshed":
        head, tail = (kind == BlockKind.PDEP).to(torch.int32), torch.zeros(num_phys, dtype=torch.int32)
        for r, layout in enumerate(REFRESHED_STEP_LAYOUTS):
            for b in range(min(len(layout), blocks_per_req[r]) - 1):
                if layout[b + 1] == BlockKind.PDEP:
                    tail[table[r, b].long()] = 3 + (b + r) % 5
        compact["unread"] = (head, tail)
    return dict(
        **compact,
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_table=table,
        query_start_loc=qsl,
        seq_lens=seq_lens,
        block_kind=kind,
        block_origin=origin,
        cos_sin=cos_sin,
        rotary_dim=rot,
        is_neox=case.is_neox,
        scale=d**-0.5,
    )


F32, F16 = torch.float32, torch.float16
P, S, D, H = BlockKind.PLAIN, BlockKind.SSEP, BlockKind.PDEP, BlockKind.HSEP
# Refreshed-heads prompts by logical block: [prefix][PDep head][HSep span, 2 blocks][PDep head]
# [HSep span][PDep question ...], and one opening with its first span (a hidden head at block 0).
REFRESHED, REFRESHED_AT_0 = (P, D, H, P, D, H, D), (H, P, D, H, D)
# A step of 16-token blocks: two final prompts computing only their question (every row outside
# spans: the stock kernel over scratch pages without their hidden heads), a whole prompt computed
# (span rows: tiles), a plain prefill, a decode after a final prompt, an SSep span's rows (tiles)
# and a final prompt's last few tokens (scratch pages without the hidden heads, as the first two).
REFRESHED_STEP = [(130, 34), (100, 36), (120, 120), (64, 64), (70, 1), (50, 40), (130, 12)]
REFRESHED_STEP_LAYOUTS = (REFRESHED, REFRESHED_AT_0, REFRESHED, (), REFRESHED, (P, S, P, D), REFRESHED)
MIXED = [(37, 37), (70, 1), (50, 20), (16, 1), (90, 3)]
ONE_HIDDEN = [(90, 1), (70, 1), (100, 1), (50, 2)]
MOVED_DECODE = [(100, 1), (37, 1), (64, 2)]
DENSE = [(64, 64), (70, 1), (90, 40), (48, 48), (33, 2)]

CASES = [
    Case("f32_neox_bs16_g1", MIXED),
    Case("f32_gptj_bs16_g2", MIXED, group=2, is_neox=False, seed=1),
    Case("f32_neox_bs32_g4", MIXED, block_size=32, group=4, seed=2),
    Case("f32_partial_neox", MIXED, rotary_dim=32, group=2, seed=3),
    Case("f32_partial_gptj", MIXED, rotary_dim=32, is_neox=False, seed=4),
    Case("f16_neox_g4_d128", [(75, 75), (40, 1), (60, 4)], group=4, head_size=128, dtype=F16, seed=5),
    Case("f16_gptj_bs32_g2", MIXED, block_size=32, group=2, is_neox=False, dtype=F16, seed=6),
    Case("f32_dup_block", [(80, 80), (48, 2)], duplicate_block=True, group=2, seed=7),
    Case("f32_plain_windows", MIXED, kinds="plain", seed=8),
    Case("f32_group3_padded", [(45, 45), (33, 1)], group=3, seed=9),
    Case("f32_wide_tiles", MIXED, prefill=AttentionConfig(16, 32, 4, 1),
         decode=AttentionConfig(16, 64, 4, 1, num_splits=1), seed=10),
    Case("f32_decode_splits", [(96, 40), (120, 1), (64, 2)], group=2,
         decode=AttentionConfig(16, 32, 4, 1, num_splits=4), seed=11),
    Case("f32_decode_one_block_per_tile", [(120, 1), (64, 2), (40, 40), (77, 1)], group=2, block_size=32,
         decode=AttentionConfig(16, 16, 4, 1, num_splits=3), seed=12),
    Case("f32_decode_only", [(70, 1), (33, 1), (100, 1)], group=4, seed=13),
    Case("f32_default_configs", [(150, 150), (90, 1), (70, 9)], group=2, prefill=None, decode=None,
         seed=14),
    Case("f16_default_configs_d128", [(130, 130), (66, 1)], group=4, head_size=128, dtype=F16,
         prefill=None, decode=None, seed=15),
    Case("f32_dense_over_budget", DENSE, group=2, is_neox=False, mode="dense_over_budget", seed=16),
    Case("f16_dense_over_budget_dup_partial", [(80, 80), (48, 2), (33, 1), (64, 20)], rotary_dim=32,
         dtype=F16, duplicate_block=True, mode="dense_over_budget", seed=17),
    Case("f32_all_at_origin", DENSE, group=2, kinds="plain", misplaced=0.0, mode="dense", seed=24),
    Case("f32_all_misplaced", DENSE, group=2, kinds="plain", misplaced=1.0, mode="dense", seed=25),
    Case("f32_dense_mixed", DENSE, group=2, mode="dense", seed=18),
    Case("f32_dense_plain", DENSE, group=4, kinds="plain", mode="dense", seed=19),
    Case("f16_dense_gptj_dup", [(80, 80), (48, 2), (64, 30)], is_neox=False, dtype=F16,
         duplicate_block=True, mode="dense", seed=20),
    Case("f32_short_table", [(20, 20), (12, 1)], table_rows=33,
         decode=AttentionConfig(16, 64, 4, 1, num_splits=1), seed=22),
    Case("f32_host_upper_bounds", DENSE, group=2, mode="dense", host_upper_bounds=40, seed=23),
    # Many short prefills: tile ids leave gaps between requests, so the grid must cover them all.
    Case("f32_many_short_prefills", [(96 + 16 * (i % 4) + i, 40) for i in range(16)], group=2, prefill=None,
         decode=None, seed=26),
    # Short requests (a few more tokens than decode takes: a cached prompt's last tokens) over
    # moved, windowed and hidden blocks, beside decodes and longer prefill.
    Case("f32_short_moved_splits", [(300, 20), (120, 1), (200, 32)], group=2, kinds="plain",
         misplaced=1.0, seed=27),
    Case("f32_short_windows_hidden_g4", [(160, 30), (75, 5), (64, 64), (140, 17)], group=4, kinds="hidden",
         seed=28),
    Case("f16_short_dense_d128", [(150, 150), (200, 20), (90, 1), (120, 40), (96, 9)], group=4, head_size=128,
         dtype=F16, misplaced=0.7, mode="dense", prefill=None, decode=None, seed=29),
    # Hidden (HSep) blocks: masked in tiles and decode, moved and at origin; with a stock kernel,
    # the requests whose rows must skip one go to the tile kernel, or, their rows all outside
    # spans, to the stock kernel over scratch pages without it.
    Case("f32_hidden_tiles", MIXED, group=2, kinds="hidden", seed=40),
    Case("f16_hidden_tiles_g4", MIXED, group=4, kinds="hidden", dtype=F16, seed=41),
    Case("f32_hidden_at_origin", MIXED, kinds="hidden", misplaced=0.0, seed=42),
    Case("f32_hidden_decode_splits", [(96, 1), (120, 1), (64, 2), (150, 3)], group=2, kinds="hidden",
         decode=AttentionConfig(16, 32, 4, 1, num_splits=3), seed=43),
    Case("f32_hidden_dense", DENSE, group=2, kinds="hidden", mode="dense", seed=44),
    Case("f32_hidden_dense_at_origin", DENSE, group=2, kinds="hidden", misplaced=0.0, mode="dense", seed=45),
    Case("f32_hidden_heads_dense", DENSE, group=2, kinds="hidden_heads", mode="dense", seed=47),
    # Refreshed-heads final prompts: the stock kernel over their keys less their hidden heads, at
    # the origin and moved, next to requests the tile kernel takes.
    Case("f32_refreshed_heads_at_origin", REFRESHED_STEP, group=2, kinds="refreshed_heads", misplaced=0.0,
         mode="dense", seed=60),
    Case("f32_refreshed_heads_moved_gptj", REFRESHED_STEP, group=2, kinds="refreshed_heads", misplaced=1.0,
         is_neox=False, mode="dense", seed=61),
    Case("f16_refreshed_heads_partial_g4", REFRESHED_STEP, group=4, rotary_dim=32, kinds="refreshed_heads",
         dtype=F16, mode="dense", seed=62),
    Case("f32_refreshed_heads_host_upper_bounds", REFRESHED_STEP, group=2, kinds="refreshed_heads", mode="dense",
         host_upper_bounds=40, seed=63),
    Case("f32_refreshed_heads_over_budget", REFRESHED_STEP, group=2, kinds="refreshed_heads",
         mode="dense_over_budget", seed=64),
    Case("f32_hidden_default_configs", [(150, 150), (90, 1), (70, 9)], group=2, kinds="hidden", prefill=None,
         decode=None, seed=46),
    # Decode: one request with a hidden head among requests without (the per-request flag turns
    # the mask on for it alone), moved and at origin, 2 and 1 KV blocks per key tile.
    Case("f32_decode_one_hidden", ONE_HIDDEN, group=2, kinds="one_hidden", seed=50),
    Case("f16_decode_one_hidden_bs32", ONE_HIDDEN, block_size=32, group=4, kinds="one_hidden", dtype=F16,
         is_neox=False, seed=51),
    # Moved decode: whole-head rotation by pair halves (neox, gptj), partial rotary and a head
    # whose size is no power of two by the general path.
    Case("f32_moved_decode_neox", MOVED_DECODE, group=2, kinds="plain", misplaced=1.0, seed=52),
    Case("f32_moved_decode_gptj", MOVED_DECODE, group=2, kinds="plain", misplaced=1.0, is_neox=False, seed=53),
    Case("f16_moved_decode_neox_d128", MOVED_DECODE, group=4, head_size=128, kinds="hidden", misplaced=0.7,
         dtype=F16, decode=None, seed=54),
    Case("f32_moved_decode_partial_neox", MOVED_DECODE, rotary_dim=32, kinds="plain", misplaced=1.0, seed=55),
    Case("f32_moved_decode_partial_gptj", MOVED_DECODE, rotary_dim=32, kinds="one_hidden", misplaced=1.0,
         is_neox=False, seed=56),
    Case("f32_moved_decode_head80", MOVED_DECODE, head_size=80, kinds="plain", misplaced=1.0, seed=57),
    # The compact reading: each block's keys moved by the step's key shift (its compact shift
    # included), unread keys masked for every row but their own; decode and tiles, moved and at
    # origin, hidden blocks and windows, key splits; with a stock kernel, compact requests go to tiles
    # and a moved request without unread keys (the first) to scratch pages.
    Case("f32_compact_tiles", MIXED, group=2, kinds="hidden", unread="random", seed=70),
    Case("f32_compact_tails_at_origin", MIXED, misplaced=0.0, unread="tails", seed=71),
    Case("f32_compact_decode_splits", [(96, 1), (120, 1), (64, 2), (150, 3)], group=2, kinds="hidden",
         unread="random", decode=AttentionConfig(16, 32, 4, 1, num_splits=3), seed=72),
    Case("f16_compact_partial_gptj_bs32", MIXED, block_size=32, group=4, rotary_dim=32, is_neox=False, dtype=F16,
         kinds="hidden", unread="random", seed=73),
    Case("f32_compact_dense", DENSE, group=2, kinds="plain", misplaced=1.0, mode="dense", unread="random", seed=74),
    Case("f32_compact_tails_dense_at_origin", DENSE, group=2, kinds="plain", misplaced=0.0, mode="dense",
         unread="tails", seed=75),
    # Final prompts in the compact reading (`REFRESHED_STEP`, pads and markers unread): a PDep question or head
    # after cached spans, its unread keys and rows all before its read rows, reads its kept keys from
    # scratch pages (`compact_final_prompts_on_the_stock_kernel`), at origin and moved, partial rotary.
    Case("f32_compact_final_prompts_at_origin", REFRESHED_STEP, group=2, kinds="refreshed_heads", misplaced=0.0,
         mode="dense", unread="refreshed", seed=80),
    Case("f32_compact_final_prompts_moved_gptj", REFRESHED_STEP, group=2, kinds="refreshed_heads", misplaced=1.0,
         is_neox=False, mode="dense", unread="refreshed", seed=81),
    Case("f16_compact_final_prompts_partial_g4", REFRESHED_STEP, group=4, rotary_dim=32, kinds="refreshed_heads",
         dtype=F16, mode="dense", unread="refreshed", seed=82),
    Case("f32_compact_final_prompts_host_upper_bounds", REFRESHED_STEP, group=2, kinds="refreshed_heads",
         mode="dense", unread="refreshed", host_upper_bounds=40, seed=83),
    # The query rotation fused into both launches (`compact_query_rotation_case`): partial rotary neox, and
    # gptj pair halves in fp16 at the default configurations.
    Case("f32_compact_partial_neox", MIXED, group=2, rotary_dim=32, kinds="hidden", unread="random", seed=76),
    Case("f16_compact_gptj_d128", [(75, 75), (40, 1), (60, 4), (90, 2), (120, 30)], group=4, head_size=128,
         is_neox=False, dtype=F16, kinds="hidden", unread="random", prefill=None, decode=None, seed=77),
    # A span bias: span keys weighed for rows outside spans, in tiles and decode (key splits too), and with a
    # stock kernel, which cannot weigh them, the final prompts it took above go to tiles instead.
    Case("f32_span_bias_tiles", MIXED, group=2, kinds="hidden", span_bias=-0.7, seed=90),
    Case("f32_span_bias_decode_splits", [(96, 1), (120, 1), (64, 2), (150, 3)], group=2, kinds="hidden",
         span_bias=1.3, decode=AttentionConfig(16, 32, 4, 1, num_splits=3), seed=91),
    Case("f32_span_bias_refreshed_heads_dense", REFRESHED_STEP, group=2, kinds="refreshed_heads", mode="dense",
         span_bias=-0.5, seed=92),
    Case("f32_span_bias_compact_final_prompts_dense", REFRESHED_STEP, group=2, kinds="refreshed_heads",
         misplaced=1.0, mode="dense", unread="refreshed", span_bias=-1.0, seed=93),
    Case("f16_span_bias_compact_d128", [(75, 75), (40, 1), (60, 4), (90, 2), (120, 30)], group=4, head_size=128,
         dtype=F16, kinds="hidden", unread="random", span_bias=-0.5, prefill=None, decode=None, seed=94),
]


def _compact_step(case: Case, inputs: dict) -> step_tensors.StepTensors:
    """The step's tensors in the compact reading (`derive_step_tensors_reference`)."""
    return derive_step_tensors_reference(
        *(inputs[name] for name in ("block_table", "block_kind", "block_origin", "query_start_loc", "seq_lens")),
        case.block_size, inputs["unread"], inputs["query"].shape[0],
    )  # fmt: skip


def _read_rows(inputs: dict, block_size: int) -> torch.Tensor:
    """``(num_tokens,)`` bool: whether each query row's token is read (`compact_shifts.read_keys`).
    The compact reading leaves an unread row's result unspecified but finite, so kernels are
    compared with the reference on read rows only there."""
    head, tail = inputs["unread"]
    qsl, rows = inputs["query_start_loc"].tolist(), []
    for r, seq_len in enumerate(inputs["seq_lens"].tolist()):
        positions = torch.arange(seq_len - (qsl[r + 1] - qsl[r]), seq_len)
        phys = inputs["block_table"][r, positions // block_size].long()
        rows.append(read_keys(positions % block_size, head[phys], tail[phys], block_size))
    return torch.cat(rows)


def _compared(out: torch.Tensor, ref: torch.Tensor, case: Case, inputs: dict) -> float:
    """The largest error over the rows the reading specifies (every row outside the compact
    reading); inf where any row, unread ones included, is not finite."""
    err = (out.float() - ref.float()).abs().nan_to_num(float("inf"))
    if case.unread:
        err = torch.where(out.isfinite().all(), err[_read_rows(inputs, case.block_size)], float("inf"))
    return float(err.max())


def _run_case(case: Case) -> dict:
    """`paged_rope_attention` against the reference; in the compact reading the reference reads
    each block's key shift and each query row's shift from the step, and both rotate the
    queries (as the model rotated them) back by theirs (the stock kernel's route in ``query``
    itself, so the reference goes first)."""
    inputs = build(case)
    ref_step = {}
    if case.unread:
        step = _compact_step(case, inputs)
        ref_step = dict(key_shift=step.key_shift, query_shift=step.query_shift)
    ref = paged_rope_attention_reference(**inputs, **ref_step, span_bias=case.span_bias)
    out = torch.full_like(inputs["query"], float("nan"))
    extra: dict = {"prefill": case.prefill, "decode": case.decode}
    if case.mode.startswith("dense"):
        extra["paged_attention"] = paged_causal_attention_reference
    if case.mode == "dense_over_budget":
        extra["scratch_budget_bytes"] = 0
    if case.host_upper_bounds:
        qsl = inputs["query_start_loc"].tolist()
        lengths = [n + case.host_upper_bounds for n in inputs["seq_lens"].tolist()]
        key_cache = inputs["key_cache"]
        extra["plan"] = plan_step(
            [b - a for a, b in zip(qsl, qsl[1:])], lengths, max_seq_len=max(lengths), block_size=case.block_size,
            group=case.group,
            page_bytes=2 * key_cache[0].numel() * key_cache.element_size(),
            scratch_budget_bytes=1 << 30,
        )  # fmt: skip
    paged_rope_attention(**inputs, output=out, span_bias=case.span_bias, **extra)
    tol = 2e-2 if case.dtype == torch.float16 else 1e-3
    max_err = _compared(out, ref, case, inputs)
    if case.span_bias:  # a case the bias changes nothing in could not tell a kernel that ignores it
        unbiased = paged_rope_attention_reference(**inputs, **ref_step)
        moved_by_bias = _compared(unbiased, ref, case, inputs)
        if moved_by_bias <= 10 * tol:
            return {"name": case.name, "ok": False, "max_err": max_err, "tol": tol,
                    "detail": f"the bias moves the reference by only {moved_by_bias}"}  # fmt: skip
    return {"name": case.name, "ok": max_err <= tol, "max_err": max_err, "tol": tol}


def _rope_table(rows: int, rot: int, scale: float = 1.0) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    freqs = torch.outer(torch.arange(rows, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1) * scale


def write_kv_case(seed: int, *, is_neox: bool = True) -> dict:
    """`kv_write.write_kv` equals `write_kv_reference`: strided key/value views of a fused
    qkv, padding slots (-1), rows past the slot mapping left alone, and blocks written away
    from their origin (positive and negative write shifts) rotated back on the way."""
    g = torch.Generator().manual_seed(seed)
    bs, hkv, d, rot, tokens = 16, 3, 64, 48, 40
    qkv = torch.randn(tokens + 4, (2 + 2 * hkv) * d, generator=g)
    key = qkv[:, 2 * d : (2 + hkv) * d].view(tokens + 4, hkv, d)
    value = qkv[:, (2 + hkv) * d :].view(tokens + 4, hkv, d)
    slots = torch.randperm(6 * bs, generator=g)[:tokens]
    slots[[3, 17]] = -1
    write_shift = torch.tensor([0, 2, 0, -1, 5, 0], dtype=torch.int32)
    cos_sin = unit_rotation_table(_rope_table(160, rot, 1.0))
    caches = []
    for write in (write_kv_reference, kv_write.write_kv):
        packed = torch.zeros(6, hkv, bs, 2 * d)
        key_cache, value_cache = packed.transpose(1, 2).split(d, dim=-1)
        write(key, value, key_cache, value_cache, slots, write_shift, cos_sin, rot, is_neox)
        caches.append(packed)
    max_err = float((caches[0] - caches[1]).abs().max())
    name = "write_kv" if is_neox else "write_kv_gptj"
    return {"name": name, "ok": max_err <= 1e-5, "max_err": max_err, "tol": 1e-5}


def write_then_attend_case(dtype: torch.dtype, seed: int, *, path: str = "dense", is_neox: bool = True) -> dict:
    """The convention end to end, against plain causal attention (no pages, no MiniPIC code):
    keys rotated by the model table (scaled like YaRN) where first computed and written by
    `write_kv`; a decode and a chunk then read some of those blocks at other positions
    (before and after their origin), and `paged_rope_attention` (its unit table) must equal
    attention over the same raw keys rotated at the reading request's positions.
    ``path``: "dense" (stock kernel stand-in), "tiles" (no stock kernel) or "reference"
    (the CPU backend's pair, `write_kv_reference` and the reference)."""
    write = write_kv_reference if path == "reference" else kv_write.write_kv
    g = torch.Generator().manual_seed(seed)
    bs, hkv, group, d = 16, 2, 2, 64
    table = _rope_table(160, d, 1.25)
    rope = lambda x, pos: rotate(x, pos, table, d, is_neox).to(dtype)  # noqa: E731 - the model's rotation
    packed = torch.zeros(24, hkv, bs, 2 * d, dtype=dtype)
    key_cache, value_cache = packed.transpose(1, 2).split(d, dim=-1)
    origin = torch.zeros(24, dtype=torch.int32)
    write_shift = torch.zeros(24, dtype=torch.int32)
    free = iter(torch.randperm(24, generator=g).tolist())
    # Request 0 computes 75 tokens (blocks at their origin but block 3, stored at origin 1);
    # request 1 (a decode over 50 keys) reads its blocks 2-3 first; request 2 (30 new tokens
    # over 90) reads its blocks 0-2 from logical 2 on.
    reuse = {1: {0: 2, 1: 3}, 2: {2: 0, 3: 1, 4: 2}}
    lens = [(75, 75), (50, 1), (90, 30)]
    raw_keys: list[torch.Tensor] = []
    block_table = torch.zeros(len(lens), 6, dtype=torch.int32)
    queries, expected = [], []
    for r, (n, q) in enumerate(lens):
        keys = torch.randn(n, hkv, d, generator=g).to(dtype)
        values = torch.randn(n, hkv, d, generator=g).to(dtype)
        for b in range(-(-n // bs)):
            source = reuse.get(r, {}).get(b)
            if source is None:
                block_table[r, b] = next(free)
                write_shift[block_table[r, b]] = 2 if (r, b) == (0, 3) else 0
                origin[block_table[r, b]] = b - write_shift[block_table[r, b]]
                pos = torch.arange(b * bs, min(n, (b + 1) * bs))
                slots = block_table[r, b].long() * bs + pos % bs
                write(rope(keys[pos], pos), values[pos], key_cache, value_cache, slots, write_shift,
                      unit_rotation_table(table), d, is_neox)
            else:  # the other request's block: its raw keys and values, here
                block_table[r, b] = block_table[0, source]
                keys[b * bs : (b + 1) * bs] = raw_keys[0][source * bs : (source + 1) * bs]
                values[b * bs : (b + 1) * bs] = value_cache[block_table[0, source]]
        raw_keys.append(keys)
        query = rope(torch.randn(q, hkv * group, d, generator=g), torch.arange(n - q, n))
        queries.append(query)
        k = rope(keys, torch.arange(n)).float().repeat_interleave(group, 1).transpose(0, 1)
        scores = query.float().transpose(0, 1) @ k.transpose(1, 2) * d**-0.5
        causal = torch.arange(n)[None, :] <= torch.arange(n - q, n)[:, None]
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        expected.append((probs @ values.float().repeat_interleave(group, 1).transpose(0, 1)).transpose(0, 1))
    qsl = torch.tensor([0, 75, 76, 106], dtype=torch.int32)
    args = (torch.cat(queries), key_cache, value_cache, block_table, qsl,
            torch.tensor([n for n, _ in lens], dtype=torch.int32), torch.zeros(24, dtype=torch.int8), origin,
            unit_rotation_table(table), d, is_neox, d**-0.5)  # fmt: skip
    if path == "reference":
        out = paged_rope_attention_reference(*args)
    else:
        stock = paged_causal_attention_reference if path == "dense" else None
        out = paged_rope_attention(*args, paged_attention=stock)
    max_err = float((out.float() - torch.cat(expected)).abs().max())
    tol = 2e-2 if dtype == torch.float16 else 1e-3
    name = f"write_then_attend_{str(dtype).split('.')[-1]}_{path}{'' if is_neox else '_gptj'}"
    return {"name": name, "ok": max_err <= tol, "max_err": max_err, "tol": tol}


def decode_over_rotated_keys_case(seed: int) -> dict:
    """The decode launch over keys already in place (``rotary_dim`` 0, as the benchmarks'
    pre-rotated baseline runs it) attends every key of a multi-block key tile: equal to a
    stock paged causal kernel over the same pages."""
    g = torch.Generator().manual_seed(seed)
    bs, hkv, group, d = 16, 2, 2, 64
    lens = [150, 64, 17]
    blocks = [-(-n // bs) for n in lens]
    packed = torch.randn(sum(blocks), hkv, bs, 2 * d, generator=g)
    key_cache, value_cache = packed.transpose(1, 2).split(d, dim=-1)
    block_table = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    perm, at = torch.randperm(sum(blocks), generator=g).to(torch.int32), 0
    for r, n in enumerate(blocks):
        block_table[r, :n] = perm[at : at + n]
        at += n
    query = torch.randn(len(lens), hkv * group, d, generator=g)
    qsl = torch.arange(len(lens) + 1, dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    work = triton_attention.TileLaunch(
        query, key_cache, value_cache, block_table, torch.zeros(sum(blocks), dtype=torch.int8),
        torch.zeros(sum(blocks), dtype=torch.int32), torch.zeros_like(block_table),
        torch.zeros(len(lens), dtype=torch.int8), torch.zeros(len(lens), dtype=torch.int8), qsl, seq_lens,
        torch.zeros_like(block_table), _rope_table(max(lens), d), 0, True, d**-0.5, max(lens),
    )  # fmt: skip
    out, expected = torch.full_like(query, float("nan")), torch.empty_like(query)
    triton_attention.launch(work, out, AttentionConfig(16, 64, 2, 1), decode=True, num_tokens=len(lens),
                            max_query_len=1)  # fmt: skip
    paged_causal_attention_reference(query, key_cache, value_cache, block_table, qsl, torch.ones_like(seq_lens),
                                     seq_lens, 1, max(lens), d**-0.5, expected)  # fmt: skip
    max_err = float((out - expected).abs().nan_to_num(float("inf")).max())
    return {"name": "decode_over_rotated_keys", "ok": max_err <= 1e-3, "max_err": max_err, "tol": 1e-3}


def hidden_flag_gates_the_mask_case() -> dict:
    """The per-request hidden flag is what turns the hidden-block mask on: flagged for the one
    request with a hidden head, decode equals the reference; with every flag cleared, that
    request's rows attend the head they must skip (a mutation the cases above would miss
    otherwise)."""
    case = next(c for c in CASES if c.name == "f32_decode_one_hidden")
    inputs = build(case)
    ref = paged_rope_attention_reference(**inputs)
    step = derive_step_tensors(inputs["block_table"], inputs["block_kind"], inputs["block_origin"],
                               inputs["query_start_loc"], inputs["seq_lens"], case.block_size)  # fmt: skip
    flags = step.hidden.tolist()
    unflagged = step.flags.clone()
    unflagged[HIDDEN] = 0
    errors = []
    for derived in (step, dataclasses.replace(step, flags=unflagged)):
        out = paged_rope_attention(**inputs, step=derived, decode=case.decode)
        errors.append(float((out - ref).abs().nan_to_num(float("inf")).max()))
    ok = flags == [1, 0, 0, 0] and errors[0] <= 1e-3 and errors[1] > 1e-2
    return {"name": "hidden_flag_gates_the_mask", "ok": ok, "max_err": errors[0], "tol": 1e-3,
            "detail": f"flags={flags} unflagged_err={errors[1]}"}  # fmt: skip


def compact_query_rotation_case(name: str) -> dict:
    """The compact reading's query rotation is the kernels' (`triton_attention._rotated_query`):
    case ``name``'s step has rows with nonzero query shifts in both the decode and the tile
    launch, and equals the reference; with every query shift cleared (the rows left where the
    model rotated them) it does not (a mutation the cases above would miss if no row shifted)."""
    case = next(c for c in CASES if c.name == name)
    inputs = build(case)
    step = _compact_step(case, inputs)
    ref = paged_rope_attention_reference(**inputs, key_shift=step.key_shift, query_shift=step.query_shift)
    qsl = inputs["query_start_loc"].tolist()
    decode_limit = triton_attention.decode_query_limit(case.group)
    shifted = {"decode": 0, "tiles": 0}
    for begin, end in zip(qsl, qsl[1:]):
        launch = "decode" if end - begin <= decode_limit else "tiles"
        shifted[launch] += int((step.query_shift[begin:end] != 0).sum())
    errors = []
    for query_shift in (step.query_shift, torch.zeros_like(step.query_shift)):
        out = paged_rope_attention(**inputs, step=dataclasses.replace(step, query_shift=query_shift),
                                   prefill=case.prefill, decode=case.decode)  # fmt: skip
        errors.append(float((out.float() - ref.float()).abs().nan_to_num(float("inf")).max()))
    tol = 2e-2 if case.dtype == torch.float16 else 1e-3
    ok = min(shifted.values()) > 0 and errors[0] <= tol and errors[1] > 10 * tol
    return {"name": f"compact_query_rotation_{name}", "ok": ok, "max_err": errors[0], "tol": tol,
            "detail": f"rows shifted {shifted} unrotated_err={errors[1]}"}  # fmt: skip


def _recording_stock_kernel(launches: list[tuple[list[int], list[int]]]) -> Callable[..., None]:
    """The torch stand-in for the stock kernel (`paged_causal_attention_reference`), recording
    each launch's rows and keys per request (``query_used``, ``seq_used``) in ``launches``."""

    def stock(query: torch.Tensor, key_pages: torch.Tensor, value_pages: torch.Tensor, page_table: torch.Tensor,
              query_start_loc: torch.Tensor, query_used: torch.Tensor, seq_used: torch.Tensor, *rest: Any) -> None:
        launches.append((query_used.tolist(), seq_used.tolist()))
        paged_causal_attention_reference(query, key_pages, value_pages, page_table, query_start_loc, query_used,
                                         seq_used, *rest)  # fmt: skip

    return stock


def refreshed_heads_on_the_stock_kernel_case() -> dict:
    """The refreshed-heads final prompts' rows (their last 12 tokens alone too) are the stock
    kernel's, over pages without their two hidden heads (the tile kernel would pass the cases
    above too): one launch computes their rows alone with ``seq_used`` two blocks short, and
    the step equals the reference."""
    case = next(c for c in CASES if c.name == "f32_refreshed_heads_at_origin")
    inputs = build(case)
    launches: list[tuple[list[int], list[int]]] = []
    stock = _recording_stock_kernel(launches)
    out = paged_rope_attention(**inputs, paged_attention=stock, prefill=case.prefill, decode=case.decode)
    max_err = float((out - paged_rope_attention_reference(**inputs)).abs().nan_to_num(float("inf")).max())
    compacted = [s[:2] + s[6:] for q, s in launches if q == [34, 36, 0, 0, 0, 0, 12]]
    ok = max_err <= 1e-3 and compacted == [[130 - 32, 100 - 32, 130 - 32]]
    return {"name": "refreshed_heads_on_the_stock_kernel", "ok": ok, "max_err": max_err, "tol": 1e-3,
            "detail": f"launches={launches}"}  # fmt: skip


def _random_step_records(rng: random.Random, seed: int) -> tuple[tuple, dict]:
    """A random step's `derive_step_tensors` arguments and its compact reading's extra ones."""
    g = torch.Generator().manual_seed(seed)
    bs, num_reqs, width, num_phys = rng.choice([4, 16]), rng.randint(1, 6), rng.randint(1, 30), 40
    table = torch.randint(0, num_phys, (num_reqs, width), generator=g, dtype=torch.int32)
    kind = torch.randint(0, 4, (num_phys,), generator=g).to(torch.int8)
    kind[torch.rand(num_phys, generator=g) < 0.5] = BlockKind.PLAIN
    origin = torch.randint(0, width, (num_phys,), generator=g, dtype=torch.int32)
    seq = [rng.randint(0, width * bs) for _ in range(num_reqs)]
    qsl = torch.tensor([0] + [rng.randint(0, s) for s in seq]).cumsum(0).to(torch.int32)
    compact = dict(unread=random_unread(g, num_phys, bs), num_tokens=int(qsl[-1]) + rng.randint(0, 20))
    return (table, kind, origin, qsl, torch.tensor(seq, dtype=torch.int32), bs), compact


def _long_unread_spans() -> tuple[tuple, dict]:
    """Spans opened at a chunk's last block (8-block chunks) with nothing read for more than a
    chunk after: one reads on at block 21, one meets a PDep block (block 19) first."""
    bs, width = 4, 30
    table = torch.stack([torch.arange(width), torch.arange(width) + width]).to(torch.int32)
    kind = torch.zeros(2 * width, dtype=torch.int8)
    kind[[7, width + 7]], kind[width + 19] = BlockKind.HSEP, BlockKind.PDEP
    head, tail = torch.zeros(2 * width, dtype=torch.int32), torch.zeros(2 * width, dtype=torch.int32)
    head[[*range(8, 21), *range(width + 8, width + 21)]] = 1
    tail[[*range(8, 21), *range(width + 8, width + 21)]] = bs - 1
    seq = torch.tensor([width * bs - 3, width * bs], dtype=torch.int32)
    qsl = torch.tensor([0, width * bs - 3, 2 * width * bs - 3], dtype=torch.int32)
    origin = torch.arange(2 * width, dtype=torch.int32) % width
    return (table, kind, origin, qsl, seq, bs), dict(unread=(head, tail), num_tokens=2 * width * bs)


def _compact_final_prompts() -> tuple[tuple, dict]:
    """Final prompts over 20 blocks of 4 tokens (3 chunks of 8): hidden spans, a PDep marker
    opening each block after one and 2 pads ending each block before one. Rows from the last PDep
    block (1 leading unread row), from the pads before it (outside spans: 3), and (over a copy of
    the blocks whose block 18 ends with a pad) with an unread row after read ones; at the origin
    and moved."""
    bs, width = 4, 20
    span, question = [BlockKind.PLAIN, BlockKind.PDEP, BlockKind.HSEP, BlockKind.PLAIN], BlockKind.PDEP
    layout = (span + [BlockKind.PLAIN]) * 2 + span + [question, BlockKind.PLAIN, question, 0, 0, 0]
    kind = torch.tensor(layout * 3, dtype=torch.int8)
    head = (kind == BlockKind.PDEP).to(torch.int32)
    tail = torch.zeros(3 * width, dtype=torch.int32)
    tail[[b for b in range(3 * width - 1) if kind[b + 1] == BlockKind.PDEP]] = 2
    tail[2 * width + 18] = 1
    tables = [torch.arange(width) + width * copy for copy in (0, 0, 2, 1, 1, 2)]
    table = torch.stack(tables).to(torch.int32)
    seq = torch.tensor([width * bs, 17 * bs + 1, width * bs] * 2, dtype=torch.int32)
    q_lens = torch.tensor([4 * bs, 7, 4 * bs] * 2)
    qsl = torch.cat((torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0))).to(torch.int32)
    origin = (torch.arange(3 * width) % width + torch.tensor([0, 3, 0]).repeat_interleave(width)).to(torch.int32)
    return (table, kind, origin, qsl, seq, bs), dict(unread=(head, tail), num_tokens=int(qsl[-1]))


def step_derivation_case(steps: int = 120) -> dict:
    """`derive_step_tensors` (one launch, walking each table row in several chunks here) equals
    `derive_step_tensors_reference` on random steps: marker and hidden blocks anywhere, junk
    entries past a request's length, requests of no rows and padding requests of length 0;
    every other one also in the compact reading, with random unread records and padding query
    rows, spans whose first read block lies chunks ahead, and final prompts with leading unread
    rows (compactable) and with unread rows after read ones (not)."""
    rng, mismatches, compactable = random.Random(7), [], {False: 0, True: 0}
    chunk, step_tensors._CHUNK = step_tensors._CHUNK, 8
    try:
        cases = [_random_step_records(rng, seed) for seed in range(steps)]
        cases += [_long_unread_spans(), _compact_final_prompts()]
        for seed, (args, compact) in enumerate(cases):
            # The compact reading's walk is slower here: every other random step, and the fixed ones.
            for extra in ({}, compact) if seed % 2 == 0 or seed >= steps else ({},):
                got, want = derive_step_tensors(*args, **extra), derive_step_tensors_reference(*args, **extra)
                compactable[bool(extra)] += int(want.compactable.sum())
                for name in ("window_starts", "flags", "kept_len", "kept_start", "key_shift", "query_shift"):
                    a, b = getattr(got, name), getattr(want, name)
                    if (a is None) != (b is None) or (a is not None and not torch.equal(a.long(), b.long())):
                        mismatches.append(f"step {seed}{' compact' if extra else ''}: {name}")
    finally:
        step_tensors._CHUNK = chunk
    ok = not mismatches and min(compactable.values()) > 0
    return {"name": "step_derivation", "ok": ok, "max_err": len(mismatches),
            "detail": f"compactable requests (plain, compact) {compactable}; {mismatches[:5]}"}  # fmt: skip


def compact_tails_on_the_stock_kernel_case() -> dict:
    """In the compact reading a prefill whose unread keys all follow its read rows (each
    request's last two keys here, as the pads ending a span prefill) is causal attention, an
    unread row reading causally (`compact_shifts.read_keys`): the stock kernel computes every
    prefill row over the cache, and the step equals the reference."""
    case = next(c for c in CASES if c.name == "f32_compact_tails_dense_at_origin")
    inputs = build(case)
    launches: list[tuple[list[int], list[int]]] = []
    stock = _recording_stock_kernel(launches)
    out = paged_rope_attention(**inputs, paged_attention=stock, prefill=case.prefill, decode=case.decode)
    step = _compact_step(case, inputs)
    ref = paged_rope_attention_reference(**inputs, key_shift=step.key_shift, query_shift=step.query_shift)
    max_err = float((out - ref).abs().nan_to_num(float("inf")).max())
    prefill_rows = [q if q > triton_attention.decode_query_limit(case.group) else 0 for _, q in case.reqs]
    ok = max_err <= 1e-3 and [rows for rows, _ in launches] == [prefill_rows]
    return {"name": "compact_tails_on_the_stock_kernel", "ok": ok, "max_err": max_err, "tol": 1e-3,
            "detail": f"launches={launches}"}  # fmt: skip


def compact_final_prompts_on_the_stock_kernel_case() -> dict:
    """In the compact reading the final prompts' rows (a PDep question or head after cached spans:
    leading unread rows, then read ones) are the stock kernel's, over scratch pages holding only
    their kept tokens (one launch, ``seq_used`` their `StepTensors.kept_len`) with their queries
    rotated back first; the step equals the reference on every read row and is finite on all."""
    case = next(c for c in CASES if c.name == "f32_compact_final_prompts_moved_gptj")
    inputs = build(case)
    step = _compact_step(case, inputs)
    ref = paged_rope_attention_reference(**inputs, key_shift=step.key_shift, query_shift=step.query_shift)
    launches: list[tuple[list[int], list[int]]] = []
    stock = _recording_stock_kernel(launches)
    out = paged_rope_attention(**inputs, paged_attention=stock, prefill=case.prefill, decode=case.decode)
    max_err = _compared(out, ref, case, inputs)
    finals = (0, 1, 6)  # beside them on the pages: the plain prefill, its blocks moved
    kept = [step.kept_len[r].item() for r in finals]
    compacted = [[s[r] for r in finals] for q, s in launches if [q[r] for r in finals] == [34, 36, 12]]
    fewer = all(k < case.reqs[r][0] - 2 * case.block_size for k, r in zip(kept, finals))  # than less hidden heads
    ok = max_err <= 1e-3 and compacted == [kept] and fewer
    return {"name": "compact_final_prompts_on_the_stock_kernel", "ok": ok, "max_err": max_err, "tol": 1e-3,
            "detail": f"launches={launches} kept={kept}"}  # fmt: skip


def rotate_into_pages_compact_case() -> dict:
    """`rotary_pages.rotate_into_pages` against torch, in the compact reading: each kept slot
    (`step_tensors.kept_slots`) of each request with pages, its key rotated by its block's key
    shift plus its request's row shift (`reference.rotate`), and its value, at token
    ``page_start * block_size + kept_start + slot - lo``; compactable requests keep read, unhidden
    slots only, the others whole blocks."""
    case = next(c for c in CASES if c.name == "f32_compact_final_prompts_moved_gptj")
    inputs = build(case)
    step = _compact_step(case, inputs)
    bs, seq_lens = case.block_size, inputs["seq_lens"]
    pages = [-(-n // bs) for n in seq_lens.tolist()]
    pages[3] = 0  # a request without pages
    page_start = torch.tensor([a if p else -1 for a, p in zip([0, *torch.tensor(pages).cumsum(0).tolist()], pages)],
                              dtype=torch.int32)  # fmt: skip
    args = (inputs["key_cache"], inputs["value_cache"], inputs["block_table"], step.key_shift, seq_lens, page_start,
            step.kept_start, step.compactable, inputs["cos_sin"], inputs["rotary_dim"], inputs["is_neox"])
    row_shift = torch.arange(len(pages), dtype=torch.int32) * 3 - 5  # negative and positive
    key_pages, value_pages = rotary_pages.rotate_into_pages(*args, num_pages=sum(pages), max_pages=max(pages),
                                                            unread=inputs["unread"], row_shift=row_shift)  # fmt: skip
    lo, hi = step_tensors.kept_slots(inputs["block_table"], inputs["block_kind"], seq_lens, bs, step.compactable,
                                     inputs["unread"])  # fmt: skip
    keys, values = key_pages.flatten(0, 1), value_pages.flatten(0, 1)
    max_err, written, compact_blocks = 0.0, 0, 0
    for r, start in enumerate(page_start.tolist()):
        for b in range(pages[r] if start >= 0 else 0):
            if step.kept_start[r, b] < 0:
                continue
            slots = torch.arange(int(lo[r, b]), int(hi[r, b]))
            phys = inputs["block_table"][r, b].long()
            want_k = rotate(inputs["key_cache"][phys, slots], (step.key_shift[r, b] + row_shift[r]).repeat(len(slots)),
                            inputs["cos_sin"], inputs["rotary_dim"], inputs["is_neox"])  # fmt: skip
            at = start * bs + int(step.kept_start[r, b]) + slots - slots[0]
            max_err = max(max_err, float((keys[at] - want_k).abs().max()),
                          float((values[at] - inputs["value_cache"][phys, slots]).abs().max()))  # fmt: skip
            written += len(slots)
            compact_blocks += int(step.compactable[r]) * int(len(slots) < bs)
    expected = sum(int(step.kept_len[r]) for r in range(len(pages)) if page_start[r] >= 0)
    ok = max_err <= 1e-5 and written == expected and compact_blocks > 0
    return {"name": "rotate_into_pages_compact", "ok": ok, "max_err": max_err, "tol": 1e-5,
            "detail": f"written={written} expected={expected} compact_blocks={compact_blocks}"}  # fmt: skip


EXTRA_CASES: dict[str, Callable[[], dict]] = {
    "compact_final_prompts_on_the_stock_kernel": compact_final_prompts_on_the_stock_kernel_case,
    "rotate_into_pages_compact": rotate_into_pages_compact_case,
    "step_derivation": step_derivation_case,
    "refreshed_heads_on_the_stock_kernel": refreshed_heads_on_the_stock_kernel_case,
    "compact_tails_on_the_stock_kernel": compact_tails_on_the_stock_kernel_case,
    "hidden_flag_gates_the_mask": hidden_flag_gates_the_mask_case,
    **{f"compact_query_rotation_{name}": (lambda name=name: compact_query_rotation_case(name))
       for name in ("f32_compact_tiles", "f16_compact_gptj_d128", "f16_compact_partial_gptj_bs32")},
    "decode_over_rotated_keys": lambda: decode_over_rotated_keys_case(35),
    "write_kv": lambda: write_kv_case(30),
    "write_kv_gptj": lambda: write_kv_case(31, is_neox=False),
    "write_then_attend_float32_dense": lambda: write_then_attend_case(torch.float32, 32),
    "write_then_attend_float16_dense": lambda: write_then_attend_case(torch.float16, 33),
    "write_then_attend_float32_tiles_gptj": lambda: write_then_attend_case(torch.float32, 36, path="tiles",
                                                                            is_neox=False),
    "write_then_attend_float32_reference": lambda: write_then_attend_case(torch.float32, 34, path="reference"),
}


def _specialisation(name: str, kernel: Any, args: tuple, kwargs: dict) -> tuple:
    """What makes Triton compile a kernel anew: its constexprs and launch options, argument
    dtypes, pointers' 16-byte alignment, integers equal to 1 or divisible by 16 (unless the
    kernel names them in ``do_not_specialize``)."""
    unspecialised = set(kernel.kwargs.get("do_not_specialize") or ())

    def of(arg_name: str, arg: Any) -> Any:
        if isinstance(arg, torch.Tensor):
            return str(arg.dtype), arg.data_ptr() % 16 == 0
        if isinstance(arg, bool) or arg_name in unspecialised:
            return arg if isinstance(arg, bool) else "int"
        if isinstance(arg, int):
            return arg == 1, arg % 16 == 0
        return type(arg).__name__

    specialised = tuple(of(arg_name, arg) for arg_name, arg in zip(kernel.arg_names, args))
    return name, specialised, tuple(sorted((k, repr(v)) for k, v in kwargs.items()))


class _LaunchRecorder:
    """Stands in for a ``@triton.jit`` kernel: records each launch's specialisation, then launches."""

    def __init__(self, name: str, kernel: Any, seen: set[tuple]) -> None:
        self.name, self.kernel, self.seen = name, kernel, seen

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any, **kwargs: Any) -> Any:
            self.seen.add(_specialisation(self.name, self.kernel, args, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch


KERNELS = ((triton_attention, "_decode_kernel"), (triton_attention, "_prefill_kernel"),
           (triton_attention, "_merge_splits_kernel"),
           (rotary_pages, "_rotate_into_pages_kernel"),
           (kv_write, "_write_kv_kernel"),
           (step_tensors, "_derive_step_kernel"))  # fmt: skip


def _launches(run: Callable[[], None]) -> set[tuple]:
    seen: set[tuple] = set()
    originals = [(module, name, getattr(module, name)) for module, name in KERNELS]
    for module, name, kernel in originals:
        setattr(module, name, _LaunchRecorder(name, kernel, seen))
    try:
        run()
    finally:
        for module, name, kernel in originals:
            setattr(module, name, kernel)
    return seen


def _random_step(rng: random.Random, limit: int) -> list[tuple[int, int]]:
    """(seq_len, query_len) per request: decodes, multi-token decodes, prefills, chunks over a context."""
    reqs = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.choice(("decode", "multi", "prefill", "chunk"))
        seq = rng.randint(1, 300)
        query = {"decode": 1, "multi": min(seq, rng.randint(2, limit)), "prefill": seq,
                 "chunk": rng.randint(1, seq)}[kind]  # fmt: skip
        reqs.append((seq, query))
    return reqs


def warm_up_coverage(steps: int = 16, compact_steps: int = 6, seed: int = 0) -> dict:
    """Kernel variants that random serving steps launch and `warm_up` did not, with a stock
    kernel for window-free prefill (the reference stands in for FlashAttention) and without,
    and with one in the compact reading (fewer steps: the interpreter is slow)."""
    shape = warmup.LayerShape(num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16, dtype=torch.float32,
                              rotary_dim=64, is_neox=True)  # fmt: skip
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    freqs = torch.outer(torch.arange(4096, dtype=torch.float32), inv_freq)  # a server-length table
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    rng = random.Random(seed)
    limit = triton_attention.decode_query_limit(shape.num_q_heads // shape.num_kv_heads)
    missing, warmed, stepped = [], 0, 0
    stock = paged_causal_attention_reference
    for paged_attention, compact, count in ((None, False, steps), (stock, False, steps), (stock, True, compact_steps)):
        warm = _launches(lambda: warmup.warm_up(shape, cos_sin, 0.125, paged_attention, compact=compact))
        serving = _launches(lambda: [
            warmup._run(shape, cos_sin, 0.125, paged_attention, reqs, rng.choice((1 << 30, 1 << 30, 0)), 64,
                        moved=rng.randrange(-1, len(reqs)), compact=compact)
            for reqs in (_random_step(rng, limit) for _ in range(count))
        ])  # fmt: skip
        missing += [repr(variant) for variant in serving - warm]
        warmed, stepped = warmed + len(warm), stepped + len(serving)
    return {"name": "warm_up_coverage", "ok": not missing, "variants_warmed": warmed,
            "variants_stepped": stepped, "missing": missing[:5]}  # fmt: skip


def main(names: list[str]) -> None:
    if "warm_up_coverage" in names:
        try:
            result = warm_up_coverage()
        except Exception as exc:  # report, keep going
            result = {"name": "warm_up_coverage", "ok": False, "variants_stepped": 0, "missing": [repr(exc)]}
        print(json.dumps(result), flush=True)
    for name, run in EXTRA_CASES.items():
        if not names or name in names:
            try:
                result = run()
            except Exception as exc:  # report, keep going
                result = {"name": name, "ok": False, "max_err": None, "detail": repr(exc)}
            print(json.dumps(result), flush=True)
    chosen = [c for c in CASES if not names or c.name in names]
    for case in chosen:
        try:
            result = _run_case(case)
        except Exception as exc:  # report, keep going
            result = {"name": case.name, "ok": False, "max_err": None, "detail": repr(exc)}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
