"""Cases comparing the Triton kernel with the torch reference (helper, not a test module).

`tests/test_triton_kernel.py` runs this file in a subprocess with ``TRITON_INTERPRET=1``
so the Triton interpreter never leaks into the pytest process (other modules import
vLLM, which imports Triton). Run directly:

    TRITON_INTERPRET=1 PYTHONPATH=kernels python tests/triton_kernel_cases.py [NAME ...]

It prints one JSON line per case: ``{"name", "ok", "max_err", "tol", "detail"}``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import torch

from minipic_kernels.block_kinds import BlockKind
from minipic_kernels.reference import paged_rope_attention_reference
from minipic_kernels.triton_attention import (
    AttentionConfig,
    paged_rope_attention,
    rotate_kv_to_dense_pages,
)


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
    prefill: AttentionConfig = AttentionConfig(32, 16, 4, 1)
    decode: AttentionConfig = AttentionConfig(16, 16, 4, 1, num_splits=1)
    max_query_len_given: bool = True
    public_api: bool = False  # call paged_rope_attention (default configs) instead
    prepass: bool = False  # rotate_kv_to_dense_pages, then the kernel with rotary_dim=0
    prepass_bytes: int | None = 0  # tile launch: 0 rotates in-kernel, > 0 pre-pass budget
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # set while the case runs
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
    max_pos = max(s for s, _ in case.reqs) + 5
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
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
        max_query_len=max(qlens) if case.max_query_len_given else None,
    )


F32, F16 = torch.float32, torch.float16
MIXED = [(37, 37), (70, 1), (50, 20), (16, 1), (90, 3)]

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
    Case(
        "f32_wide_tiles",
        MIXED,
        prefill=AttentionConfig(16, 32, 4, 1),
        decode=AttentionConfig(16, 32, 4, 1, num_splits=1),
        seed=10,
    ),
    Case(
        "f32_splits",
        [(96, 40), (120, 1), (64, 2)],
        group=2,
        prefill=AttentionConfig(32, 16, 4, 1, num_splits=3),
        decode=AttentionConfig(16, 16, 4, 1, num_splits=4),
        seed=11,
    ),
    Case("f32_no_max_query_len", MIXED, max_query_len_given=False, seed=12),
    Case("f32_decode_only", [(70, 1), (33, 1), (100, 1)], group=4, seed=13),
    Case("f32_public_api_defaults", [(150, 150), (90, 1), (70, 9)], group=2, public_api=True, seed=14),
    Case("f16_public_api_d128", [(130, 130), (66, 1)], group=4, head_size=128, dtype=F16,
         public_api=True, seed=15),
    Case("f16_public_api_prepass", [(130, 130), (66, 1), (90, 17)], group=2, dtype=F16, public_api=True,
         env={"MINIPIC_ATTN_PREPASS_MIN_TOKENS": "0"}, seed=21),
    Case("f32_prepass_neox_partial", MIXED, group=2, rotary_dim=32, prepass=True, seed=16),
    # The tile launch over scratch pages written by the built-in pre-pass.
    Case("f32_builtin_prepass_gptj", MIXED, group=2, is_neox=False, prepass_bytes=1 << 30, seed=18),
    Case("f16_builtin_prepass_dup_partial", [(80, 80), (48, 2), (33, 1), (64, 20)], rotary_dim=32,
         dtype=F16, duplicate_block=True, prepass_bytes=1 << 30, seed=19),
    Case("f32_builtin_prepass_over_budget", MIXED, prepass_bytes=1024, seed=20),
    Case("f16_prepass_gptj_dup", [(80, 80), (48, 2)], is_neox=False, dtype=F16, duplicate_block=True,
         prepass=True, seed=17),
]


def run_case(case: Case) -> dict:
    saved = {k: os.environ.get(k) for k in case.env}
    os.environ.update(case.env)
    try:
        return _run_case(case)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_case(case: Case) -> dict:
    inputs = build(case)
    max_query_len = inputs.pop("max_query_len")
    ref = paged_rope_attention_reference(**inputs)
    out = torch.full_like(inputs["query"], float("nan"))
    if case.public_api:
        paged_rope_attention(**inputs, output=out, max_query_len=max_query_len)
    elif case.prepass:
        k_rot, v_dense, table = rotate_kv_to_dense_pages(
            inputs["key_cache"], inputs["value_cache"], inputs["block_table"], inputs["seq_lens"],
            inputs["cos_sin"], inputs["rotary_dim"], inputs["is_neox"],
        )  # fmt: skip
        # Window starts follow the original table's block kinds.
        from minipic_kernels.block_kinds import window_starts_per_block

        ws = window_starts_per_block(inputs["block_table"], inputs["block_kind"], case.block_size)
        rest = {k: v for k, v in inputs.items() if k not in ("key_cache", "value_cache", "block_table")}
        rest.update(rotary_dim=0)
        paged_rope_attention(
            **rest, key_cache=k_rot, value_cache=v_dense, block_table=table, output=out,
            max_query_len=max_query_len, window_starts=ws,
            prefill_config=case.prefill, decode_config=case.decode,
        )  # fmt: skip
    else:
        paged_rope_attention(
            **inputs,
            output=out,
            max_query_len=max_query_len,
            prefill_config=case.prefill,
            decode_config=case.decode,
            prepass_max_bytes=case.prepass_bytes,
        )
    tol = 2e-2 if case.dtype == torch.float16 else 1e-3
    err = (out.float() - ref.float()).abs()
    max_err = float(err.nan_to_num(float("inf")).max())
    return {"name": case.name, "ok": max_err <= tol, "max_err": max_err, "tol": tol}


def main(names: list[str]) -> None:
    chosen = [c for c in CASES if not names or c.name in names]
    for case in chosen:
        try:
            result = run_case(case)
        except Exception as exc:  # report, keep going
            result = {"name": case.name, "ok": False, "max_err": None, "detail": repr(exc)}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
