"""MiniPIC's GPU attention against vLLM's FlashAttention, same run, same inputs (needs a GPU + vLLM).

    python benchmarks/attention_kernel.py --out benchmarks/results/attention-h200.json

Shape: Llama-3-8B attention (32 query heads, 8 kv heads, head size 128, bf16, block size
16, neox RoPE, theta 500000, fp32 cos/sin table), the cache in vLLM's TRITON_ATTN layout
(strided K/V views of one packed tensor), random data. Cases named ``..._moved`` read
their cached context away from where it was computed (a final prompt over reused spans);
FlashAttention (FA3 on Hopper, the kernel stock vLLM runs) reads a copy of the cache whose
keys were moved beforehand, so it does none of the rotation work that MiniPIC's path
includes. Times are medians of CUDA graph replays (`triton.testing.do_bench_cudagraph`):
GPU time, no launch overhead; the CPU cost of dispatch is reported separately. Sections:

- ``correctness``: every path against the fp32 torch reference (rel. L2 error), for head
  sizes 64/128/256, neox/gptj, partial rotary, a block twice in one table, moved blocks;
- ``kv_write``: MiniPIC's cache write / vLLM's Triton write;
- ``prefill``, ``chunked``, ``windowed``, ``decode``: times, ours / FA3;
- ``decode_variants`` (not by default): the decode launch alone over keys at their origin,
  over moved keys and over keys without rotation support, a few launch shapes;
- ``decode_configs`` (not by default): the whole decode call at a few launch shapes, at origin
  and over moved blocks;
- ``prefill_parts`` (not by default): each launch of a short window-free prefill alone;
- ``jit``: after `warm_up`, a random mix of batches compiles no kernel;
- ``dispatch`` (not by default): the host time of one layer's launches for a cached final
  prompt over 1 and 32 moved documents, piece by piece, beside stock vLLM's write and FA3
  call, and a cProfile of MiniPIC's layer (what the GPU waits for when steps are host-bound).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import platform
import random
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from minipic_kernels.attention import paged_rope_attention, plan_step
from minipic_kernels.block_kinds import BlockKind
from minipic_kernels.block_origins import key_shifts
from minipic_kernels.reference import paged_rope_attention_reference, rotate
from minipic_kernels.step_tensors import derive_step_tensors
from minipic_kernels.triton_attention import AttentionConfig, TileLaunch, decode_config, launch
from minipic_kernels.warmup import LayerShape, warm_up

from provenance import provenance

DEVICE = torch.device("cuda")


@dataclasses.dataclass(frozen=True)
class Shape:
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_size: int = 128
    rotary_dim: int = 128
    is_neox: bool = True
    block_size: int = 16
    dtype: torch.dtype = torch.bfloat16
    theta: float = 500000.0


LLAMA3 = Shape()


def cos_sin_table(shape: Shape, positions: int) -> torch.Tensor:
    rot = shape.rotary_dim
    inv_freq = 1.0 / (shape.theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)


@dataclasses.dataclass
class Batch:
    """One step: requests as (seq_len, query_len), tensors laid out as vLLM hands them over."""

    shape: Shape
    reqs: list[tuple[int, int]]
    spans: int = 0  # 0: no windows; n: SSep every n blocks, then a PDep tail block
    duplicate_block: bool = False
    moved: int = 0  # context blocks of each request computed elsewhere (a cached span reused here)
    moved_span: int = 0  # 0: moved blocks all 7 blocks from their origin; n: spans of n blocks, each block
    # stored at its offset in its span (as a reused passage is), so each span moves by its own distance
    pool_blocks: int = 0  # > the blocks the requests read: a cache of that many blocks, theirs scattered over it
    seed: int = 0

    def __post_init__(self) -> None:
        s, g = self.shape, torch.Generator().manual_seed(self.seed)
        bs = s.block_size
        blocks = [-(-n // bs) for n, _ in self.reqs]
        used = sum(blocks) + 8
        values = torch.randn(used, s.num_kv_heads, bs, 2 * s.head_size, generator=g).to(s.dtype)
        if self.pool_blocks > used:
            packed = torch.zeros(self.pool_blocks, *values.shape[1:], dtype=s.dtype, device=DEVICE)
            perm = torch.randperm(self.pool_blocks, generator=g)[:used]
            packed[perm.to(DEVICE)] = values.to(DEVICE)
        else:
            packed, perm = values.to(DEVICE), torch.randperm(used, generator=g)
        num_phys = packed.shape[0]
        self.key_cache, self.value_cache = packed.transpose(1, 2).split(s.head_size, dim=-1)
        table = torch.zeros(len(self.reqs), max(blocks) + 1, dtype=torch.int32)
        kinds = torch.zeros(num_phys, dtype=torch.int8)
        origin = torch.zeros(num_phys, dtype=torch.int32)
        at = 0
        for r, n in enumerate(blocks):
            ids = perm[at : at + n]
            at += n
            table[r, :n] = ids.to(torch.int32)
            logical = torch.arange(n)
            stored = logical % self.moved_span if self.moved_span else logical + 7
            origin[ids] = torch.where(logical < self.moved, stored, logical).to(torch.int32)
            if self.spans:
                for b in range(0, n - 1, self.spans):
                    kinds[ids[b]] = BlockKind.SSEP
                kinds[ids[n - 1]] = BlockKind.PDEP
        if self.duplicate_block:
            table[0, blocks[0] - 1] = table[0, 0]
        self.block_table = table.to(DEVICE)
        self.block_kind = kinds.to(DEVICE)
        self.block_origin = origin.to(DEVICE)
        q_lens = [q for _, q in self.reqs]
        qsl = torch.zeros(len(self.reqs) + 1, dtype=torch.int32)
        qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0)
        self.query_start_loc = qsl.to(DEVICE)
        self.seq_lens = torch.tensor([n for n, _ in self.reqs], dtype=torch.int32, device=DEVICE)
        num_tokens = int(qsl[-1])
        width = (s.num_q_heads + 2 * s.num_kv_heads) * s.head_size  # a slice of the fused qkv
        qkv = torch.randn(num_tokens, width, generator=g).to(s.dtype).to(DEVICE)
        self.query = qkv[:, : s.num_q_heads * s.head_size].view(num_tokens, s.num_q_heads, s.head_size)
        self.cos_sin = cos_sin_table(s, max(n for n, _ in self.reqs) + 256)
        self.key_cos_sin = self.cos_sin.to(s.dtype)  # what attention reads, as the server passes it
        self.scale = s.head_size**-0.5
        self.step = derive_step_tensors(self.block_table, self.block_kind, self.block_origin, self.query_start_loc,
                                        self.seq_lens, bs)  # fmt: skip

    def plan(self, budget: int = 1 << 30):
        """The step's plan, routed as the server routes it (one host sync, here outside the timing)."""
        return self.unrouted_plan(budget).routed(self.step)

    def unrouted_plan(self, budget: int = 1 << 30):
        """The step's plan as the metadata builder makes it."""
        s = self.shape
        return plan_step(
            [q for _, q in self.reqs], [n for n, _ in self.reqs], max_seq_len=max(n for n, _ in self.reqs),
            block_size=s.block_size, group=s.num_q_heads // s.num_kv_heads,
            page_bytes=2 * s.block_size * s.num_kv_heads * s.head_size * torch.finfo(s.dtype).bits // 8,
            scratch_budget_bytes=budget,
        )  # fmt: skip

    def args(self) -> dict:
        s = self.shape
        return dict(
            query=self.query, key_cache=self.key_cache, value_cache=self.value_cache,
            block_table=self.block_table, query_start_loc=self.query_start_loc, seq_lens=self.seq_lens,
            block_kind=self.block_kind, block_origin=self.block_origin, cos_sin=self.cos_sin,
            rotary_dim=s.rotary_dim, is_neox=s.is_neox, scale=self.scale,
        )  # fmt: skip

    def ours(
        self, out: torch.Tensor, fa, *, budget: int = 1 << 30, decode: AttentionConfig | None = None,
    ):  # fmt: skip
        plan = self.plan(budget)
        return lambda: paged_rope_attention(
            **{**self.args(), "cos_sin": self.key_cos_sin}, output=out, plan=plan, step=self.step,
            paged_attention=fa, scratch_budget_bytes=budget, decode=decode,
        )  # fmt: skip

    def tile_launch(self) -> TileLaunch:
        """The batch as one kernel launch sees it (the cache's keys where they were computed)."""
        s = self.shape
        return TileLaunch(self.query, self.key_cache, self.value_cache, self.block_table, self.block_kind,
                          self.block_origin, self.step.key_shift, self.step.moved, self.step.hidden,
                          self.query_start_loc, self.seq_lens,
                          self.step.window_starts, self.key_cos_sin, s.rotary_dim, s.is_neox, self.scale,
                          max(n for n, _ in self.reqs))  # fmt: skip

    def reference(self) -> torch.Tensor:
        args = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in self.args().items()}
        return paged_rope_attention_reference(**args, window_starts=self.step.window_starts)

    def rotated_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        """FA3's own layout (blocks, block_size, heads, head) with every block's keys moved to
        where its request reads it (the timed FA3 cases have one request, or equal layouts):
        the keys a stock server would hold."""
        s = self.shape
        k = self.key_cache.contiguous().clone()
        v = self.value_cache.contiguous()
        shifts = key_shifts(self.block_table, self.block_origin, s.block_size)
        for r, (n, _) in enumerate(self.reqs):
            nb = -(-n // s.block_size)
            ids = self.block_table[r, :nb].long()
            keys = k[ids].reshape(-1, s.num_kv_heads, s.head_size)
            moved = shifts[r, :nb].repeat_interleave(s.block_size)
            k[ids] = rotate(keys, moved, self.cos_sin, s.rotary_dim, s.is_neox).to(s.dtype).view(
                nb, s.block_size, s.num_kv_heads, s.head_size)
        return k, v


def flash_attention():
    """MiniPIC's FA3 entry (`PagedAttention`) and vLLM's own call of it, for the baseline."""
    from vllm.v1.attention.backends.fa_utils import get_flash_attn_version
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    from minipic_server.backends.cuda import flash_attention_for

    version = get_flash_attn_version(head_size=128)
    return flash_attention_for(LLAMA3.dtype, LLAMA3.head_size), flash_attn_varlen_func, version


def stock_fa(batch: Batch, out: torch.Tensor, fa_func, version):
    k, v = batch.rotated_cache()
    max_q = max(q for _, q in batch.reqs)
    max_k = max(n for n, _ in batch.reqs)
    return lambda: fa_func(
        q=batch.query, k=k, v=v, out=out, cu_seqlens_q=batch.query_start_loc, max_seqlen_q=max_q,
        seqused_k=batch.seq_lens, max_seqlen_k=max_k, softmax_scale=batch.scale, causal=True,
        block_table=batch.block_table, fa_version=version,
    )  # fmt: skip


def graph_ms(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")


def cpu_us(fn, n: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / n * 1e6


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def section_correctness(fa) -> list[dict]:
    cases = {
        "mixed_windowed_llama": (LLAMA3, [(2048, 2048), (1500, 1500), (3000, 700)] + [(900, 1)] * 22, 4),
        "head64_gptj_g4": (Shape(16, 4, 64, 64, False), [(1200, 1200), (700, 300), (500, 1)], 3),
        "head256_g2": (Shape(8, 4, 256, 256), [(1000, 1000), (600, 1)], 2),
        "partial_rotary_bs32": (Shape(8, 8, 128, 64, block_size=32), [(900, 900), (400, 2)], 3),
        "window_free_llama": (LLAMA3, [(1024, 1024), (800, 1), (2000, 100), (3000, 300)], 0),
    }
    rows = []
    for name, (shape, reqs, spans) in cases.items():
        for dup, moved in ((False, 0), (True, 0), (False, 5)):
            batch = Batch(shape, reqs, spans=spans, duplicate_block=dup, moved=moved, seed=len(rows))
            ref = batch.reference()
            for path, kwargs in {
                "default": {},
                "in_kernel_rotation": {"budget": 0},
                "decode_one_block_per_tile": {"decode": dataclasses.replace(decode_config(shape.head_size),
                                                                            block_n=shape.block_size)},
                "no_stock_kernel": {"fa": None},
            }.items():
                out = torch.full_like(batch.query, float("nan"))
                batch.ours(out, kwargs.pop("fa", fa), **kwargs)()
                rows.append({"case": name, "duplicate_block": dup, "moved_blocks": moved, "path": path,
                             "rel_l2": rel_l2(out, ref), "nan": bool(out.isnan().any())})  # fmt: skip
    # A decode batch captured in a CUDA graph and replayed equals the eager result.
    batch = Batch(LLAMA3, [(3000, 1)] * 16 + [(700, 1)] * 5, spans=4, moved=20, seed=99)
    eager, graphed = torch.empty_like(batch.query), torch.empty_like(batch.query)
    batch.ours(eager, fa)()
    fn = batch.ours(graphed, fa)
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graphed.zero_()
    graph.replay()
    torch.cuda.synchronize()
    rows.append({"case": "decode_cuda_graph_replay_vs_eager", "path": "default",
                 "rel_l2": rel_l2(graphed, eager), "nan": bool(graphed.isnan().any())})  # fmt: skip
    return rows


def timed_case(name: str, batch: Batch, fa, fa_func, version, *, compare_full: Batch | None = None) -> dict:
    out = torch.empty_like(batch.query)
    ours = batch.ours(out, fa)
    row = {"case": name, "ours_ms": graph_ms(ours), "ours_cpu_us": cpu_us(ours)}
    base = compare_full or batch
    row["fa3_ms"] = graph_ms(stock_fa(base, torch.empty_like(base.query), fa_func, version))
    row["ours_in_kernel_ms"] = graph_ms(batch.ours(out, fa, budget=0))
    row["ratio"] = row["ours_ms"] / row["fa3_ms"]
    print(json.dumps(row), flush=True)
    return row


def section_times(fa, fa_func, version, sections: set[str]) -> list[dict]:
    rows = []
    if "prefill" in sections:
        for n in (1024, 8192, 32768):
            rows.append(timed_case(f"prefill_{n}", Batch(LLAMA3, [(n, n)]), fa, fa_func, version))
    if "chunked" in sections:
        rows.append(timed_case("chunk_1024_over_16k", Batch(LLAMA3, [(16384 + 1024, 1024)]), fa, fa_func, version))
        rows.append(timed_case("chunk_256_over_16k", Batch(LLAMA3, [(16384 + 256, 256)]), fa, fa_func, version))
        rows.append(timed_case("8x_512_over_2k", Batch(LLAMA3, [(2048 + 512, 512)] * 8), fa, fa_func, version))
        # A final prompt over 16k of cached spans computed elsewhere: the keys are moved first.
        moved = Batch(LLAMA3, [(16384 + 1024, 1024)], moved=1024)
        rows.append(timed_case("chunk_1024_over_16k_moved", moved, fa, fa_func, version))
    if "windowed" in sections:
        n = 32 * 1024 + 256
        spans = Batch(LLAMA3, [(n, n)], spans=64)  # 32 spans of 1,024 tokens, then a PDep tail
        rows.append(timed_case("windowed_32x1k_spans", spans, fa, fa_func, version,
                               compare_full=Batch(LLAMA3, [(n, n)])))  # fmt: skip
    if "decode" in sections:
        for name, batch in decode_batches().items():
            rows.append(timed_case(name, batch, fa, fa_func, version))
    return rows


def decode_batches() -> dict[str, Batch]:
    """The decode cases: three batch shapes at origin, then decode after a final prompt over
    reused spans (200 blocks moved by one distance; 28 passages of 7 blocks, each moved by its
    own, so 3 of every 7 key tiles hold two distances)."""
    batches = {f"decode_{reqs}x{ctx}": Batch(LLAMA3, [(ctx, 1)] * reqs)
               for reqs, ctx in ((64, 4096), (8, 32768), (256, 1024))}  # fmt: skip
    batches["decode_64x4096_moved"] = Batch(LLAMA3, [(4096, 1)] * 64, moved=200)
    batches["decode_64x4096_moved_spans"] = Batch(LLAMA3, [(4096, 1)] * 64, moved=196, moved_span=7)
    batches.update(served_decode_batches())
    return batches


def served_decode_batches() -> dict[str, Batch]:
    """Decode as a served Table 1 step at 32 tokens has it (docs/benchmarks.md, the GPU profile at
    674608a: 1.6 ns a key there against 1.0 here at one length): 146 final prompts decoding over
    1,000-1,500 keys of passages of 8 blocks, each moved by its own distance; then the same step
    with 24 final prompts of 32 tokens over such a context beside them, as the step's prefills; and
    the decode alone with its blocks scattered over a cache of the served run's size (57,344 blocks a
    layer: `GPU KV cache size: 917,472 tokens` in its log)."""
    rng = random.Random(0)
    decodes = [(rng.randrange(1000, 1500), 1) for _ in range(146)]
    finals = [(rng.randrange(1000, 1500), 32) for _ in range(24)]
    return {"decode_146_served_moved_spans": Batch(LLAMA3, decodes, moved=96, moved_span=8),
            "decode_146_served_with_finals": Batch(LLAMA3, decodes + finals, moved=96, moved_span=8),
            "decode_146_served_big_cache": Batch(LLAMA3, decodes, moved=96, moved_span=8, pool_blocks=57_344)}


def section_prefill_parts(fa, fa_func, version) -> list[dict]:
    """Where short window-free prefill time goes: the whole call, FA3 on keys already in
    place, and for moved contexts the pass moving keys into scratch pages alone."""
    from minipic_kernels.rotary_pages import rotate_into_pages

    rows = []
    for name, reqs in (("prefill_1024", [(1024, 1024)]), ("chunk_256_over_16k", [(16384 + 256, 256)]),
                       ("8x_512_over_2k", [(2048 + 512, 512)] * 8)):  # fmt: skip
        for moved in (0, 1 << 20):
            batch, s = Batch(LLAMA3, reqs, moved=moved), LLAMA3
            plan, out = batch.plan(), torch.empty_like(batch.query)
            row = {"case": name, "moved": bool(moved), "whole_ms": graph_ms(batch.ours(out, fa)),
                   "fa3_ms": graph_ms(stock_fa(batch, torch.empty_like(batch.query), fa_func, version))}  # fmt: skip
            scratch = plan.routes.scratch if plan.routes else None
            if scratch is not None:
                row["move_pass_ms"] = graph_ms(functools.partial(
                    rotate_into_pages, batch.key_cache, batch.value_cache, batch.block_table, batch.step.key_shift,
                    batch.seq_lens, scratch.page_start, scratch.kept_start, scratch.compactable, batch.key_cos_sin,
                    s.rotary_dim, s.is_neox, num_pages=scratch.num_pages, max_pages=scratch.max_pages))  # fmt: skip
            row["ratio"] = row["whole_ms"] / row["fa3_ms"]
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def section_decode_variants(fa_func, version) -> list[dict]:
    """Where decode time goes: the decode launch alone over keys at their origin (no
    rotation), over moved keys (every tile rotated in registers) and over keys with
    rotation compiled out, for the default launch shape (first) and fixed key splits,
    against FA3 on keys in place. GB/s counts K and V read once."""
    rows = []
    s = LLAMA3
    default = decode_config(s.head_size)
    configs = [default, dataclasses.replace(default, num_splits=4), dataclasses.replace(default, num_splits=16)]
    for reqs, ctx in ((64, 4096), (8, 32768), (256, 1024)):
        at_origin, moved = Batch(s, [(ctx, 1)] * reqs), Batch(s, [(ctx, 1)] * reqs, moved=1 << 20)
        fa3_ms = graph_ms(stock_fa(at_origin, torch.empty_like(at_origin.query), fa_func, version))
        gbytes = reqs * ctx * s.num_kv_heads * s.head_size * 2 * 2 / 1e9
        launches = {"at_origin": at_origin.tile_launch(), "moved": moved.tile_launch(),
                    "no_rotation": dataclasses.replace(at_origin.tile_launch(), rotary_dim=0)}  # fmt: skip
        out = torch.empty_like(at_origin.query)
        for cfg in configs:
            for name, work in launches.items():
                ms = graph_ms(lambda w=work, c=cfg: launch(w, out, c, decode=True, num_tokens=reqs, max_query_len=1))
                row = {"case": f"decode_{reqs}x{ctx}", "variant": name, "config": dataclasses.asdict(cfg),
                       "ms": ms, "fa3_ms": fa3_ms, "ratio": ms / fa3_ms, "gb_per_s": gbytes / ms * 1e3}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


DECODE_CONFIGS = [(64, 2, 3), (64, 2, 4), (64, 2, 5), (64, 4, 3), (32, 2, 3), (128, 4, 3)]  # BLOCK_N, warps, stages


def section_decode_configs(fa, fa_func, version) -> list[dict]:
    """The whole decode call at a few launch shapes (`DECODE_CONFIGS`, key splits auto) on the
    decode cases (`decode_batches`), against FA3 on keys in place: how the decode configuration
    of head size 128 was chosen."""
    batches = decode_batches()
    fa3_ms = {name: graph_ms(stock_fa(b, torch.empty_like(b.query), fa_func, version)) for name, b in batches.items()}
    rows = []
    for block_n, warps, stages in DECODE_CONFIGS:
        cfg = AttentionConfig(16, block_n, warps, stages)
        for name, batch in batches.items():
            ms = graph_ms(batch.ours(torch.empty_like(batch.query), fa, decode=cfg))
            row = {"case": name, "config": dataclasses.asdict(cfg), "ms": ms, "fa3_ms": fa3_ms[name],
                   "ratio": ms / fa3_ms[name]}  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def new_keys_and_values(s: Shape, block_table: torch.Tensor, first: int, tokens: int):
    """``tokens`` new keys and values from positions ``first`` on of request 0, as strided slices of
    a fused qkv projection (as the model hands them over), and their slots in ``block_table``."""
    width = (s.num_q_heads + 2 * s.num_kv_heads) * s.head_size
    qkv = torch.randn(tokens, width, device=DEVICE).to(s.dtype)
    key = qkv[:, s.num_q_heads * s.head_size : (s.num_q_heads + s.num_kv_heads) * s.head_size]
    value = qkv[:, (s.num_q_heads + s.num_kv_heads) * s.head_size :]
    pos = torch.arange(first, first + tokens, device=DEVICE)
    slots = block_table[0, pos // s.block_size].long() * s.block_size + pos % s.block_size
    return key.view(tokens, s.num_kv_heads, s.head_size), value.view(tokens, s.num_kv_heads, s.head_size), slots


def origin_writer(s: Shape, num_blocks: int):
    """MiniPIC's cache write into a cache of ``num_blocks`` with every block at its origin (no
    write shift: a copy, as vLLM's), its shift records and table made once, outside any timing:
    ``(key, value, key_cache, value_cache, slots)``."""
    from minipic_kernels.kv_write import write_kv

    shifts = torch.zeros(num_blocks, dtype=torch.int32, device=DEVICE)
    table = cos_sin_table(s, 16).to(s.dtype)
    return lambda key, value, key_cache, value_cache, slots: write_kv(
        key, value, key_cache, value_cache, slots, shifts, table, s.rotary_dim, s.is_neox)


def section_kv_write() -> list[dict]:
    """MiniPIC's cache write against vLLM's own Triton write."""
    from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash

    s, rows = LLAMA3, []
    for tokens in (256, 8192):
        batch = Batch(s, [(tokens, tokens)])
        key, value, slots = new_keys_and_values(s, batch.block_table, 0, tokens)
        one = torch.ones((), device=DEVICE)
        write = origin_writer(s, batch.key_cache.shape[0])
        ours = graph_ms(lambda: write(key, value, batch.key_cache, batch.value_cache, slots))
        stock = graph_ms(lambda: triton_reshape_and_cache_flash(key, value, batch.key_cache, batch.value_cache, slots,
                                                                "auto", one, one))  # fmt: skip
        row = {"case": f"kv_write_{tokens}", "ours_ms": ours, "vllm_ms": stock, "ratio": ours / stock}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


@triton.jit
def _no_op_kernel(a, b, c, d, e, f, g, h, i, s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13,
                  C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr):
    """As many arguments as `rotate_into_pages`'s kernel, no work: Triton's launcher alone."""
    pass


def section_dispatch(fa, fa_func, version) -> list[dict]:
    """Host microseconds per call of each launch one attention layer makes for a cached final
    prompt (30 query tokens after k moved documents of 1,024 tokens: keys rotated into scratch
    pages, then FA3), beside stock vLLM's cache write and FA3 call, and the functions of
    MiniPIC's layer under cProfile."""
    import cProfile
    import pstats

    from vllm import _custom_ops as vllm_ops

    from minipic_kernels.rotary_pages import rotate_into_pages
    from minipic_server.backends.common import PicAttentionMetadata, split_kv_cache
    from minipic_server.block_records import BlockRecords, derive_step

    s, rows = LLAMA3, []
    for docs in (1, 32):
        q_len = 30
        batch = Batch(s, [(docs * 1024 + q_len, q_len)], moved=1 << 20)  # every block 7 blocks from its origin
        plan, out = batch.plan(), torch.empty_like(batch.query)
        scratch = plan.routes.scratch
        key, value, slots = new_keys_and_values(s, batch.block_table, docs * 1024, q_len)
        write = origin_writer(s, batch.key_cache.shape[0])
        one = torch.ones((), device=DEVICE)
        kv_cache = torch.empty(batch.key_cache.shape[0], s.num_kv_heads, s.block_size, 2 * s.head_size,
                               dtype=s.dtype, device=DEVICE)  # fmt: skip
        k_dup, v_dup = batch.key_cache.contiguous(), batch.value_cache.contiguous()
        records = BlockRecords(DEVICE)
        records.kind, records.origin = batch.block_kind, batch.block_origin

        def step_metadata(b: Batch = batch, slots: torch.Tensor = slots) -> PicAttentionMetadata:
            seq_len = b.reqs[0][0]
            return PicAttentionMetadata(
                q_len, q_len, seq_len, s.block_size, b.query_start_loc, b.seq_lens, b.block_table, slots,
                plan=b.unrouted_plan(),
            )  # fmt: skip

        ours = batch.ours(out, fa)
        stock = stock_fa(batch, torch.empty_like(batch.query), fa_func, version)
        pieces = {
            "ours_attention": ours,
            "ours_write_kv": lambda: write(key, value, batch.key_cache, batch.value_cache, slots),
            "ours_rotate_into_pages": lambda: rotate_into_pages(
                batch.key_cache, batch.value_cache, batch.block_table, batch.step.key_shift, batch.seq_lens,
                scratch.page_start, scratch.kept_start, scratch.compactable, batch.key_cos_sin, s.rotary_dim, s.is_neox,
                num_pages=scratch.num_pages,
                max_pages=scratch.max_pages),
            "ours_fa3_call": lambda: fa(batch.query, k_dup, v_dup, batch.block_table, batch.query_start_loc,
                                        scratch.query_used, batch.seq_lens, q_len, docs * 1024 + q_len,
                                        batch.scale, out),
            "ours_split_kv_cache": lambda: split_kv_cache(kv_cache),
            "ours_route": lambda: batch.plan(),
            "ours_derive_step_tensors": lambda: derive_step_tensors(
                batch.block_table, batch.block_kind, batch.block_origin, batch.query_start_loc, batch.seq_lens,
                s.block_size),
            "ours_derive_step": lambda: derive_step(step_metadata(), records, first_layer=True),
            "torch_empty_pair": lambda: [torch.empty(scratch.num_pages, s.block_size, s.num_kv_heads, s.head_size,
                                                     dtype=s.dtype, device=DEVICE) for _ in range(2)],
            "triton_no_op_23_args": lambda: _no_op_kernel[(1,)](*([out] * 9), *range(14), C0=1, C1=2, C2=3),
            "stock_fa3": stock,
            "stock_write_cuda": lambda: vllm_ops.reshape_and_cache_flash(
                key, value, k_dup, v_dup, slots, "auto", one, one),
        }
        host_syncing = {"ours_route", "ours_derive_step"}  # not capturable: host time only
        for name, fn in pieces.items():
            row = {"docs": docs, "piece": name}
            try:  # a piece this vLLM lacks: recorded, the others still run
                row["cpu_us"] = cpu_us(fn)
                if name not in host_syncing:
                    row["gpu_ms"] = graph_ms(fn)
            except Exception as error:
                row["error"] = f"{type(error).__name__}: {error}"[:300]
            print(json.dumps(row), flush=True)
            rows.append(row)
        rows.append({"docs": docs, "piece": "stock_write_cuda_into_our_layout",
                     "equals_write_kv": _stock_write_matches_ours(key, value, slots, s, batch.key_cache.shape[0])})
        profile = cProfile.Profile()
        layer = pieces["ours_attention"], pieces["ours_write_kv"]
        profile.enable()
        for _ in range(200):
            for fn in layer:
                fn()
        profile.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(profile).sort_stats("tottime")
        top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:25]
        rows.append({"docs": docs, "piece": "cprofile_ours_layer_top_tottime_us_per_layer",
                     "functions": [[f"{fn[2]} ({Path(fn[0]).name}:{fn[1]})", round(st[2] / 200 * 1e6, 1),
                                    round(st[3] / 200 * 1e6, 1)] for fn, st in top]})  # fmt: skip
        print(json.dumps(rows[-1])[:3000], flush=True)
    return rows


def _stock_write_matches_ours(key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor, s: Shape,
                              num_blocks: int) -> bool | str:
    """Does vLLM's CUDA cache write (a tenth of the host time of MiniPIC's Triton write) fill
    MiniPIC's strided cache views (K and V side by side in each token's row) exactly as
    `write_kv` does, for blocks written at their origin? What an eager step could launch instead."""
    from vllm import _custom_ops as vllm_ops

    from minipic_server.backends.common import split_kv_cache

    caches = [torch.zeros(num_blocks, s.num_kv_heads, s.block_size, 2 * s.head_size, dtype=s.dtype, device=DEVICE)
              for _ in range(2)]  # fmt: skip
    views = [split_kv_cache(cache) for cache in caches]
    origin_writer(s, num_blocks)(key, value, *views[0], slots)
    one = torch.ones((), device=DEVICE)
    try:
        vllm_ops.reshape_and_cache_flash(key, value, *views[1], slots, "auto", one, one)
    except Exception as error:  # the op refusing these strides is an answer too
        return f"{type(error).__name__}: {error}"[:300]
    torch.cuda.synchronize()
    return bool(torch.equal(caches[0], caches[1]))


def section_jit(fa) -> dict:
    """Compile counts after `warm_up`, over a random mix of steps like a server sees."""
    compiled: list[str] = []
    hook_owner = triton.knobs.runtime
    previous = hook_owner.jit_post_compile_hook

    def hook(**kwargs):  # Triton's hook signature varies between releases: keywords only
        compiled.append(getattr(kwargs.get("fn"), "name", "?"))
        return previous(**kwargs) if previous else None

    shape = LLAMA3
    layer = LayerShape(shape.num_q_heads, shape.num_kv_heads, shape.head_size, shape.block_size, shape.dtype,
                       shape.rotary_dim, shape.is_neox)  # fmt: skip
    table = cos_sin_table(shape, 40960)
    start = time.perf_counter()
    warm_up(layer, table, shape.head_size**-0.5, fa, table_width=2560)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - start
    hook_owner.jit_post_compile_hook = hook
    rng = random.Random(0)
    try:
        for i in range(30):
            reqs = []
            for _ in range(rng.randint(1, 40)):
                ctx = rng.randint(1, 6000)
                q = rng.choice([1, 1, 1, rng.randint(2, 4), rng.randint(5, 600)])
                reqs.append((ctx + q, q))
            batch = Batch(shape, reqs, spans=rng.choice([0, 0, 3, 8]), moved=rng.choice([0, 0, 2, 50]), seed=i)
            out = torch.empty_like(batch.query)
            batch.ours(out, fa, budget=rng.choice([1 << 30, 1 << 30, 0]))()
        torch.cuda.synchronize()
    finally:
        hook_owner.jit_post_compile_hook = previous
    return {"warm_up_s": warm_s, "steps": 30, "compilations_after_warm_up": len(compiled), "kernels": compiled}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", default="jit,correctness,kv_write,prefill,chunked,windowed,decode")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    fa, fa_func, version = flash_attention()
    result: dict = {
        "provenance": provenance(),
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "fa_version": version,
    }
    try:
        import vllm

        result["vllm"] = vllm.__version__
    except ImportError:
        pass
    if "jit" in sections:  # first: a fresh process, nothing compiled yet
        result["jit"] = section_jit(fa)
        print(json.dumps({k: v for k, v in result["jit"].items() if k != "kernels"}), flush=True)
    if "correctness" in sections:
        result["correctness"] = section_correctness(fa)
        worst = max(r["rel_l2"] for r in result["correctness"])
        print(json.dumps({"correctness_worst_rel_l2": worst,
                          "any_nan": any(r["nan"] for r in result["correctness"])}), flush=True)  # fmt: skip
    if "decode_variants" in sections:
        result["decode_variants"] = section_decode_variants(fa_func, version)
    if "decode_configs" in sections:
        result["decode_configs"] = section_decode_configs(fa, fa_func, version)
    if "prefill_parts" in sections:
        result["prefill_parts"] = section_prefill_parts(fa, fa_func, version)
    if "kv_write" in sections:
        result["kv_write"] = section_kv_write()
    if "dispatch" in sections:
        result["dispatch"] = section_dispatch(fa, fa_func, version)
    result["times"] = section_times(fa, fa_func, version, sections)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    for row in result["times"]:
        print(f"{row['case']:<24} ours {row['ours_ms']:.4f} ms  fa3 {row['fa3_ms']:.4f} ms  "
              f"x{row['ratio']:.2f}  in-kernel {row['ours_in_kernel_ms']:.4f}  cpu {row['ours_cpu_us']:.0f} us")


if __name__ == "__main__":
    main()
