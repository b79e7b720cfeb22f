"""The cache-write and scratch-page kernels (bf16 and fp16) and the decode and prefill attention
launches (bf16) compile for the H200 (sm_90), here, without a GPU.

`TRITON_INTERPRET=1` (tests/test_triton_kernel.py) runs kernels in numpy, which accepts
programs the compiler refuses (a variable changing dtype inside a branch); Triton's own
front end and NVIDIA back end run on any machine, so a compile error shows up in CI and not
as a server that cannot start on the GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from minipic_kernels import kv_write, rotary_pages, step_tensors  # noqa: E402

H200 = GPUTarget("cuda", 90, 32)


def _ptx(kernel: Any, dtype: str, constants: dict[str, Any], pointers: dict[str, str], **options: Any) -> str:
    """``kernel`` compiled for sm_90 (with launch ``options``): ``constants`` as its constexprs,
    ``pointers`` typed as given, its other pointers to ``dtype``, every other argument an i32."""
    names = list(kernel.arg_names)
    signature = {
        name: "constexpr" if name in constants else pointers.get(name, f"*{dtype}" if name.endswith("_ptr") else "i32")
        for name in names
    }
    source = ASTSource(kernel, signature, constexprs={(names.index(k),): v for k, v in constants.items()})
    return triton.compile(source, target=H200, options=options or None).asm["ptx"]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("is_neox", [True, False])
def test_write_kv_compiles_for_sm90(dtype: str, is_neox: bool) -> None:
    constants = dict(NUM_KV_HEADS=8, HEADS_P=8, HEAD=128, HEAD_P=128, ROT_HALF=64, IS_NEOX=is_neox, KV_BLOCK_SIZE=16)
    pointers = {"slot_mapping_ptr": "*i64", "write_shift_ptr": "*i32", "cos_sin_ptr": "*fp32"}
    assert _ptx(kv_write._write_kv_kernel, dtype, constants, pointers)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("compact", [False, True])
def test_rotate_into_pages_compiles_for_sm90(dtype: str, compact: bool) -> None:
    constants = dict(NUM_KV_HEADS=8, HEAD=128, HEAD_P=128, ROT_HALF=64, IS_NEOX=True, KV_BLOCK_SIZE=16, COMPACT=compact)
    pointers = {
        **{name: "*i32" for name in ("block_table_ptr", "key_shift_ptr", "seq_lens_ptr", "page_start_ptr",
                                     "kept_start_ptr", "unread_head_ptr", "unread_tail_ptr", "row_shift_ptr")},
        "compactable_ptr": "*i8",
    }  # fmt: skip
    assert _ptx(rotary_pages._rotate_into_pages_kernel, dtype, constants, pointers)  # the table in the cache's dtype


@pytest.mark.parametrize("compact", [False, True])
def test_step_derivation_compiles_for_sm90(compact: bool) -> None:
    """One launch per step derives what every layer reads from the block records, in the compact
    reading too (its scans and read-ahead loop)."""
    pointers = {name: "*i8" for name in ("flags_ptr", "block_kind_ptr")}
    constants = dict(KV_BLOCK_SIZE=16, CHUNK=256, COMPACT=compact)
    assert _ptx(step_tensors._derive_step_kernel, "i32", constants, pointers)


_ATTENTION_POINTERS = {
    **{name: "*i32" for name in ("block_table_ptr", "unread_head_ptr", "unread_tail_ptr", "key_shift_ptr",
                                 "query_shift_ptr", "query_start_loc_ptr", "seq_lens_ptr", "window_starts_ptr",
                                 "req_flags_ptr")},
    **{name: "*i8" for name in ("block_kind_ptr", "req_moved_ptr", "req_hidden_ptr")},
    **{name: "*fp32" for name in ("part_acc_ptr", "part_ml_ptr")},  # the table is in the cache's dtype (bf16)
    "qk_scale": "fp32",
}  # fmt: skip
_LLAMA3 = dict(HEAD=128, HEAD_P=128, ROT_HALF=64, IS_NEOX=True, GROUP=4, GROUP_P=4, KV_BLOCK_SIZE=16,
               DOT_PRECISION="tf32")  # fmt: skip


@pytest.mark.parametrize(("move", "compact"), [(False, False), (True, False), (False, True), (True, True)])
def test_decode_attention_compiles_for_sm90(move: bool, compact: bool) -> None:
    """The decode launch as a Llama-3-8B server runs it in bf16, at its default configuration: at
    origin, and over moved blocks (key tiles rotated by pair halves, in bf16 with a bf16 table),
    in the compact reading too (unread keys masked, query rows rotated back: whole rows at origin,
    pair halves over moved blocks)."""
    from minipic_kernels import triton_attention

    cfg = triton_attention.decode_config(128)
    constants = dict(_LLAMA3, BLOCK_M=16, BLOCK_Q=1, BLOCK_N=cfg.block_n, TILE_BLOCKS=cfg.block_n // 16, MOVE=move,
                     PAIR_HALVES=move, COMPACT=compact, USE_SPLITS=True)  # fmt: skip
    assert _ptx(triton_attention._decode_kernel, "bf16", constants, _ATTENTION_POINTERS, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages)


def test_split_merge_compiles_for_sm90() -> None:
    """The merge of a decode launch's key splits (one request alone over a long context), Llama-3-8B's heads."""
    from minipic_kernels import triton_attention

    merge = dict(HEAD=128, HEAD_P=128, GROUP=4, GROUP_P=4, BLOCK_M=16, BLOCK_Q=triton_attention.decode_query_limit(4))
    assert _ptx(triton_attention._merge_splits_kernel, "bf16", merge, _ATTENTION_POINTERS, num_warps=4)


@pytest.mark.parametrize(("move", "compact"), [(False, False), (True, False), (False, True), (True, True)])
def test_prefill_attention_compiles_for_sm90(move: bool, compact: bool) -> None:
    """The tile launch (prefill with windows, hidden heads, moved keys over the scratch budget,
    or the compact reading's requests) as a Llama-3-8B server runs it in bf16, at its default
    configuration."""
    from minipic_kernels import triton_attention

    cfg = triton_attention.prefill_config(128)
    constants = dict(_LLAMA3, BLOCK_M=cfg.block_m, BLOCK_Q=cfg.block_m // 4, BLOCK_N=cfg.block_n,
                     TILE_BLOCKS=cfg.block_n // 16, MOVE=move, PAIR_HALVES=move, COMPACT=compact, SKIP_QLEN_LE=4,
                     USE_FLAGS=True)  # fmt: skip
    assert _ptx(triton_attention._prefill_kernel, "bf16", constants, _ATTENTION_POINTERS, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages)
