"""The cache-write kernel compiles for the H200 (sm_90) in bf16 and fp16, here, without a GPU.

`TRITON_INTERPRET=1` (tests/test_triton_kernel.py) runs kernels in numpy, which accepts
programs the compiler refuses (a variable changing dtype inside a branch); Triton's own
front end and NVIDIA back end run on any machine, so a compile error shows up in CI and not
as a server that cannot start on the GPU.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from minipic_kernels import kv_write  # noqa: E402

H200 = GPUTarget("cuda", 90, 32)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("is_neox", [True, False])
def test_write_kv_compiles_for_sm90(dtype: str, is_neox: bool) -> None:
    kernel = kv_write._write_kv_kernel
    names = list(kernel.arg_names)
    constants = dict(NUM_KV_HEADS=8, HEADS_P=8, HEAD=128, HEAD_P=128, ROT_HALF=64, IS_NEOX=is_neox, KV_BLOCK_SIZE=16)
    pointers = {"slot_mapping_ptr": "*i64", "write_shift_ptr": "*i32", "cos_sin_ptr": "*fp32"}
    signature = {
        name: "constexpr" if name in constants else pointers.get(name, f"*{dtype}" if name.endswith("_ptr") else "i32")
        for name in names
    }
    source = ASTSource(kernel, signature, constexprs={(names.index(k),): v for k, v in constants.items()})
    assert triton.compile(source, target=H200).asm["ptx"]
