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

from minipic_kernels import kv_write, rotary_pages, triton_attention, warmup
from minipic_kernels.attention import paged_rope_attention, plan_step
from minipic_kernels.block_kinds import BlockKind
from minipic_kernels.reference import (
    paged_causal_attention_reference,
    paged_rope_attention_reference,
    rotate,
    unit_rotation_table,
    write_kv_reference,
)
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
    kinds: str = "mixed"  # "plain" | "mixed" (SSep/PDep blocks)
    duplicate_block: bool = False  # one physical block twice in a table
    prefill: AttentionConfig | None = AttentionConfig(32, 16, 4, 1)
    decode: AttentionConfig | None = AttentionConfig(16, 32, 4, 1, num_splits=1)
    # "scratch": prefill by the tile kernel over rotated scratch pages; "dense": window-free
    # prefill by a stock paged kernel (the reference stands in for FlashAttention);
    # "in_kernel": no scratch budget, keys rotated in the tile kernel.
    mode: str = "scratch"
    table_scale: float = 1.0  # YaRN-style magnitude scale folded into cos/sin
    table_rows: int | None = None  # RoPE table length (default: longest request + 5)
    host_upper_bounds: int = 0  # plan from host lengths this much above the device's
    seed: int = 0


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
    kind = torch.zeros(num_phys, dtype=torch.int8)
    if case.kinds == "mixed":
        pattern = torch.randint(0, 5, (num_phys,), generator=g)
        kind[pattern == 1] = BlockKind.SSEP
        kind[pattern == 2] = BlockKind.SSEP
        kind[pattern == 3] = BlockKind.PDEP
    seq_lens = torch.tensor([s for s, _ in case.reqs], dtype=torch.int32)
    qlens = [q for _, q in case.reqs]
    qsl = torch.zeros(len(qlens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(qlens), 0)
    num_tokens = int(qsl[-1])
    query = torch.randn(num_tokens, hkv * case.group, d, generator=g).to(case.dtype)
    max_pos = case.table_rows or max(s for s, _ in case.reqs) + 5
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1) * case.table_scale
    return dict(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_table=table,
        query_start_loc=qsl,
        seq_lens=seq_lens,
        block_kind=kind,
        cos_sin=cos_sin,
        rotary_dim=rot,
        is_neox=case.is_neox,
        scale=d**-0.5,
    )


F32, F16 = torch.float32, torch.float16
MIXED = [(37, 37), (70, 1), (50, 20), (16, 1), (90, 3)]
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
    Case("f32_in_kernel_rotation", MIXED, group=2, is_neox=False, mode="in_kernel", seed=16),
    Case("f16_in_kernel_dup_partial", [(80, 80), (48, 2), (33, 1), (64, 20)], rotary_dim=32,
         dtype=F16, duplicate_block=True, mode="in_kernel", seed=17),
    Case("f32_dense_mixed", DENSE, group=2, mode="dense", seed=18),
    Case("f32_dense_plain", DENSE, group=4, kinds="plain", mode="dense", seed=19),
    Case("f16_dense_gptj_dup", [(80, 80), (48, 2), (64, 30)], is_neox=False, dtype=F16,
         duplicate_block=True, mode="dense", seed=20),
    Case("f32_scaled_table", MIXED, group=2, table_scale=1.3, seed=21),
    Case("f32_short_table", [(20, 20), (12, 1)], table_rows=24,
         decode=AttentionConfig(16, 64, 4, 1, num_splits=1), seed=22),
    Case("f32_host_upper_bounds", DENSE, group=2, mode="dense", host_upper_bounds=40, seed=23),
]


def _run_case(case: Case) -> dict:
    inputs = build(case)
    ref = paged_rope_attention_reference(**inputs)
    out = torch.full_like(inputs["query"], float("nan"))
    extra: dict = {"prefill": case.prefill, "decode": case.decode}
    if case.mode == "dense":
        extra["paged_attention"] = paged_causal_attention_reference
    if case.mode == "in_kernel":
        extra["scratch_budget_bytes"] = 0
    if case.host_upper_bounds:
        qsl = inputs["query_start_loc"].tolist()
        lengths = [n + case.host_upper_bounds for n in inputs["seq_lens"].tolist()]
        key_cache = inputs["key_cache"]
        extra["plan"] = plan_step(
            [b - a for a, b in zip(qsl, qsl[1:])], lengths, inputs["query_start_loc"], inputs["seq_lens"],
            max_seq_len=max(lengths), block_size=case.block_size, group=case.group,
            page_bytes=2 * key_cache[0].numel() * key_cache.element_size(), scratch_budget_bytes=1 << 30,
        )  # fmt: skip
    paged_rope_attention(**inputs, output=out, **extra)
    tol = 2e-2 if case.dtype == torch.float16 else 1e-3
    err = (out.float() - ref.float()).abs()
    max_err = float(err.nan_to_num(float("inf")).max())
    return {"name": case.name, "ok": max_err <= tol, "max_err": max_err, "tol": tol}


def _rope_table(rows: int, rot: int, scale: float = 1.0) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    freqs = torch.outer(torch.arange(rows, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1) * scale


def write_kv_case(is_neox: bool, rotary_dim: int, seed: int) -> dict:
    """`kv_write.write_kv` equals `write_kv_reference`: strided key/value views of a fused
    qkv, padding slots (-1) and rows past the slot mapping left alone."""
    g = torch.Generator().manual_seed(seed)
    bs, hkv, d, tokens = 16, 3, 64, 40
    qkv = torch.randn(tokens + 4, (2 + 2 * hkv) * d, generator=g)
    key = qkv[:, 2 * d : (2 + hkv) * d].view(tokens + 4, hkv, d)
    value = qkv[:, (2 + hkv) * d :].view(tokens + 4, hkv, d)
    slots = torch.randperm(6 * bs, generator=g)[:tokens]
    slots[[3, 17]] = -1
    table = _rope_table(bs, rotary_dim, 1.2)
    caches = []
    for write in (write_kv_reference, kv_write.write_kv):
        packed = torch.zeros(6, hkv, bs, 2 * d)
        key_cache, value_cache = packed.transpose(1, 2).split(d, dim=-1)
        write(key, value, key_cache, value_cache, slots, table, rotary_dim, is_neox)
        caches.append(packed)
    max_err = float((caches[0] - caches[1]).abs().max())
    name = f"write_kv_{'neox' if is_neox else 'gptj'}_rot{rotary_dim}"
    return {"name": name, "ok": max_err <= 1e-5, "max_err": max_err, "tol": 1e-5}


def write_then_attend_case(dtype: torch.dtype, seed: int, *, gpu_path: bool = True) -> dict:
    """The convention end to end: keys written by `write_kv` (model table, scaled like YaRN)
    and attended by `paged_rope_attention` (its unit table) equal plain causal attention
    over keys rotated by the model table at their positions (no pages, no MiniPIC code).
    ``gpu_path=False``: the CPU backend's pair, `write_kv_reference` and the reference."""
    write = kv_write.write_kv if gpu_path else write_kv_reference
    g = torch.Generator().manual_seed(seed)
    bs, hkv, group, d = 16, 2, 2, 64
    lens = [(75, 75), (50, 1), (90, 30)]  # (seq_len, query_len): a prefill, a decode, a chunk
    table = _rope_table(128, d, 1.25)
    blocks = [-(-n // bs) for n, _ in lens]
    block_table = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    perm = torch.randperm(sum(blocks) + 2, generator=g)
    packed = torch.zeros(sum(blocks) + 2, hkv, bs, 2 * d, dtype=dtype)
    key_cache, value_cache = packed.transpose(1, 2).split(d, dim=-1)
    queries, expected, at = [], [], 0
    for r, (n, q) in enumerate(lens):
        block_table[r, : blocks[r]] = perm[at : at + blocks[r]].to(torch.int32)
        at += blocks[r]
        keys = torch.randn(n, hkv, d, generator=g).to(dtype)
        values = torch.randn(n, hkv, d, generator=g).to(dtype)
        slots = block_table[r, torch.arange(n) // bs].long() * bs + torch.arange(n) % bs
        write(keys, values, key_cache, value_cache, slots, table, d, True)
        query = torch.randn(q, hkv * group, d, generator=g).to(dtype)
        queries.append(query)
        k = rotate(keys, torch.arange(n), table, d, True).repeat_interleave(group, 1).transpose(0, 1)
        scores = query.float().transpose(0, 1) @ k.transpose(1, 2) * d**-0.5
        causal = torch.arange(n)[None, :] <= torch.arange(n - q, n)[:, None]
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        expected.append((probs @ values.float().repeat_interleave(group, 1).transpose(0, 1)).transpose(0, 1))
    qsl = torch.tensor([0, 75, 76, 106], dtype=torch.int32)
    args = (torch.cat(queries), key_cache, value_cache, block_table, qsl,
            torch.tensor([n for n, _ in lens], dtype=torch.int32), torch.zeros(packed.shape[0], dtype=torch.int8),
            unit_rotation_table(table), d, True, d**-0.5)  # fmt: skip
    if gpu_path:
        out = paged_rope_attention(*args, paged_attention=paged_causal_attention_reference)
    else:
        out = paged_rope_attention_reference(*args)
    max_err = float((out.float() - torch.cat(expected)).abs().max())
    tol = 2e-2 if dtype == torch.float16 else 1e-3
    name = f"write_then_attend_{str(dtype).split('.')[-1]}{'' if gpu_path else '_reference'}"
    return {"name": name, "ok": max_err <= tol, "max_err": max_err, "tol": tol}


def decode_over_rotated_keys_case(seed: int) -> dict:
    """The decode launch over keys already rotated (``rotary_dim`` 0, as the benchmarks'
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
        query, key_cache, value_cache, block_table, qsl, seq_lens, torch.zeros_like(block_table),
        _rope_table(max(lens), d), 0, True, d**-0.5, max(lens),
    )  # fmt: skip
    out, expected = torch.full_like(query, float("nan")), torch.empty_like(query)
    triton_attention.launch(work, out, AttentionConfig(16, 64, 2, 1), decode=True, num_tokens=len(lens),
                            max_query_len=1)  # fmt: skip
    paged_causal_attention_reference(query, key_cache, value_cache, block_table, qsl, seq_lens, 1, max(lens),
                                     d**-0.5, expected)  # fmt: skip
    max_err = float((out - expected).abs().nan_to_num(float("inf")).max())
    return {"name": "decode_over_rotated_keys", "ok": max_err <= 1e-3, "max_err": max_err, "tol": 1e-3}


EXTRA_CASES: dict[str, Callable[[], dict]] = {
    "decode_over_rotated_keys": lambda: decode_over_rotated_keys_case(35),
    "write_kv_neox_rot64": lambda: write_kv_case(True, 64, 30),
    "write_kv_gptj_rot32": lambda: write_kv_case(False, 32, 31),
    "write_then_attend_float32": lambda: write_then_attend_case(torch.float32, 32),
    "write_then_attend_float16": lambda: write_then_attend_case(torch.float16, 33),
    "write_then_attend_float32_reference": lambda: write_then_attend_case(torch.float32, 34, gpu_path=False),
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


KERNELS = ((triton_attention, "_attention_kernel"), (triton_attention, "_merge_splits_kernel"),
           (rotary_pages, "_rotate_into_pages_kernel"), (kv_write, "_write_kv_kernel"))  # fmt: skip


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
    """(seq_len, query_len) per request: decodes, short queries, prefills, chunks over a context."""
    reqs = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.choice(("decode", "short", "prefill", "chunk"))
        seq = rng.randint(1, 300)
        query = {"decode": 1, "short": min(seq, rng.randint(2, limit)), "prefill": seq,
                 "chunk": rng.randint(1, seq)}[kind]  # fmt: skip
        reqs.append((seq, query))
    return reqs


def warm_up_coverage(steps: int = 16, seed: int = 0) -> dict:
    """Kernel variants that random serving steps launch and `warm_up` did not, with a stock
    kernel for window-free prefill (the reference stands in for FlashAttention) and without."""
    shape = warmup.LayerShape(num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16, dtype=torch.float32,
                              rotary_dim=64, is_neox=True)  # fmt: skip
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    freqs = torch.outer(torch.arange(4096, dtype=torch.float32), inv_freq)  # a server-length table
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    rng = random.Random(seed)
    limit = triton_attention.decode_query_limit(shape.num_q_heads // shape.num_kv_heads)
    missing, warmed, stepped = [], 0, 0
    for paged_attention in (None, paged_causal_attention_reference):
        warm = _launches(lambda: warmup.warm_up(shape, cos_sin, 0.125, paged_attention))
        serving = _launches(lambda: [
            warmup._run(shape, cos_sin, 0.125, paged_attention, _random_step(rng, limit),
                        rng.choice((1 << 30, 1 << 30, 0)), 64)
            for _ in range(steps)
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
