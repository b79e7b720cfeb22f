"""The boundary's run-time side: the vLLM version check, run-time patches, attention-impl arguments,
the start-up checks (KV-cache layout, FA3 op schema), and that no other module imports vLLM."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
import torch
import vllm
from vllm.v1.kv_cache_interface import FullAttentionSpec

from minipic_server import boundary, plugin
from minipic_server.backends.common import PositionFreeAttention, split_kv_cache
from minipic_server.backends.cuda import PicTritonAttentionImpl, _fa3_paged_attention
from minipic_server.boundary import ALLOW_UNSUPPORTED_ENV, UnsupportedVLLMError, table_version, v0_26
from minipic_server.boundary.checks import (
    assumed_kv_cache_shape,
    check_kv_cache_shape,
    check_op_arguments,
    schema_argument_names,
)
from minipic_server.config import MiniPICConfigError
from minipic_server.impl_args import bind_impl_args

REPO = Path(__file__).resolve().parent.parent
# vLLM's attention layer passes these ten positionally (0.26 and 0.32), then extras by keyword.
LAYER_ARGS = (8, 64, 0.125, 2, None, None, "auto", None, "decoder", None)


@pytest.mark.parametrize(("version", "platform", "expected"), [
    ("0.32.0", "cpu", "0.32"), ("0.32.1+cpu", "cpu", "0.32"), ("0.26.0", "cuda", "0.26"), ("0.26.2rc1", "cuda", "0.26"),
])
def test_supported_releases(version: str, platform: str, expected: str) -> None:
    assert table_version(version, platform, environ={}) == expected


@pytest.mark.parametrize(("version", "platform"), [("0.27.0", "cuda"), ("0.32.0", "cuda"), ("0.26.0", "cpu")])
def test_unsupported_release_fails_with_one_line(version: str, platform: str) -> None:
    with pytest.raises(UnsupportedVLLMError) as failure:
        table_version(version, platform, environ={})
    message = str(failure.value)
    assert "\n" not in message
    assert f"vLLM {version} on {platform}" in message and ALLOW_UNSUPPORTED_ENV in message


def test_override_uses_the_platform_release_loudly(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="vllm.minipic"):
        assert table_version("0.27.3", "cuda", environ={ALLOW_UNSUPPORTED_ENV: "1"}) == "0.26"
    assert any("UNTESTED" in r.message and "0.27.3" in r.message for r in caplog.records)
    with pytest.raises(UnsupportedVLLMError, match="nothing is supported on rocm"):
        table_version("0.26.0", "rocm", environ={ALLOW_UNSUPPORTED_ENV: "1"})


def test_register_refuses_an_unsupported_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_UNSUPPORTED_ENV, raising=False)
    monkeypatch.setattr(vllm, "__version__", "0.31.0")
    with pytest.raises(UnsupportedVLLMError, match=r"this is vLLM 0\.31\.0 on cpu"):
        plugin.register()


def test_patch_instance_takes_only_declared_entries() -> None:
    class Engine:
        request_block_hasher = None

    engine = Engine()
    boundary.patch_instance(boundary.REQUEST_BLOCK_HASHER, engine, len)
    assert engine.request_block_hasher is len
    undeclared = boundary.patch("vllm.v1.engine.core:EngineCore.scheduler", "not in the table")
    with pytest.raises(ValueError, match="not declared"):
        boundary.patch_instance(undeclared, engine, None)
    with pytest.raises(ValueError, match="not declared"):
        boundary.patch_instance(boundary.TABLE[0], engine, None)  # a start-up hook, not a run-time patch


def test_cuda_impl_binds_vllm_arguments_by_name() -> None:
    impl = PicTritonAttentionImpl(*LAYER_ARGS, sinks=None, use_alibi_sqrt=False, chunk_lookback=-1)
    assert (impl.num_heads, impl.head_size, impl.num_kv_heads) == (8, 64, 2)


@pytest.mark.parametrize(("extra", "error"), [
    ({"chunk_lookback": 8}, "chunk_lookback=8"),
    ({"use_alibi_sqrt": True}, "use_alibi_sqrt=True"),
    ({"sinks": object()}, "attention sinks"),
    ({"new_feature": 1}, "does not take"),
])
def test_cuda_impl_refuses_what_it_cannot_honour(extra: dict, error: str) -> None:
    with pytest.raises(MiniPICConfigError, match=error):
        PicTritonAttentionImpl(*LAYER_ARGS, **extra)


def test_positional_arguments_are_named_by_the_stock_signature() -> None:
    """A sliding window passed 6th is a sliding window, whatever the release's argument list."""
    with pytest.raises(MiniPICConfigError, match="sliding windows"):
        PicTritonAttentionImpl(8, 64, 0.125, 2, None, 4096, "auto")


def test_an_argument_minipic_does_not_know_is_refused() -> None:
    def stock_init(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                   kv_cache_dtype, logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
                   sinks=None, attention_chunk_size=None):
        """A future release that grew an argument."""

    with pytest.raises(MiniPICConfigError, match=r"\['attention_chunk_size'\].*not know"):
        bind_impl_args(stock_init, LAYER_ARGS, {"attention_chunk_size": None})
    assert bind_impl_args(stock_init, LAYER_ARGS, {})["kv_cache_dtype"] == "auto"


def test_minipic_serve_refuses_an_unsupported_vllm_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from minipic_client.cli import app

    monkeypatch.delenv(ALLOW_UNSUPPORTED_ENV, raising=False)
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    result = CliRunner().invoke(app, ["serve", "some/model"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: MiniPIC supports vLLM 0.26.x on cuda, vLLM 0.32.x on cpu; this is vLLM 0.33.0 on cpu. "
        f"Install a supported vLLM, or set {ALLOW_UNSUPPORTED_ENV}=1 to try anyway"
    ]


def test_only_the_boundary_package_imports_vllm() -> None:
    """Every vLLM name reaches MiniPIC through `minipic_server.boundary` (one place to port)."""
    boundary_dir = REPO / "server_patch" / "minipic_server" / "boundary"
    offenders = []
    for path in [p for top in ("server_patch", "kernels", "sdk") for p in (REPO / top).rglob("*.py")]:
        if boundary_dir in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            offenders += [f"{path.relative_to(REPO)}:{node.lineno} imports {n}" for n in names
                          if n.split(".")[0] == "vllm"]
    assert not offenders, "\n".join(offenders)


def test_the_release_module_is_the_installed_vllms() -> None:
    assert boundary.release.__name__ == "minipic_server.boundary.v0_32"
    assert boundary.release.PLATFORM == boundary.SUPPORTED_VLLM["0.32"] == boundary.device_type()


def test_kv_cache_layout_of_this_vllm_is_the_one_the_kernels_index() -> None:
    spec = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    assert boundary.release.kv_cache_shape(spec, 7) == (7, 2, 32, 128)
    boundary.check_kv_cache_layout(spec)
    key, value = split_kv_cache(torch.empty(assumed_kv_cache_shape(7, 32, 2, 64), device="meta"))
    assert key.shape == value.shape == (7, 32, 2, 64)  # [num_blocks, block_size, num_kv_heads, head_size]


def test_a_layer_splits_its_cache_once_and_anew_for_another_cache() -> None:
    layer = PositionFreeAttention()
    cache = torch.randn(assumed_kv_cache_shape(3, 16, 2, 8))
    key, value = layer.kv_views(cache)
    assert layer.kv_views(cache)[0] is key
    assert torch.equal(key, split_kv_cache(cache)[0]) and torch.equal(value, split_kv_cache(cache)[1])
    other = torch.randn(assumed_kv_cache_shape(3, 16, 2, 8))
    assert torch.equal(layer.kv_views(other)[0], split_kv_cache(other)[0])


@pytest.mark.parametrize("shape", [(7, 32, 2, 128), (7, 2, 32, 64), (2, 7, 2, 32, 64)])
def test_another_kv_cache_layout_is_refused_in_one_line(shape: tuple[int, ...]) -> None:
    with pytest.raises(MiniPICConfigError, match=r"lays out the KV cache as .* update minipic_server.boundary") as e:
        check_kv_cache_shape(shape, block_size=32, num_kv_heads=2, head_size=64)
    assert "\n" not in str(e.value)


def _fa3_schema(names: tuple[str, ...]) -> str:
    """A schema string written like `_vllm_fa3_C::fwd`'s (optional and mutable tensors, defaults)."""
    types = {"out": "Tensor(a!)?", "softmax_scale": "float", "is_causal": "bool", "pack_gqa": "bool?",
             "max_seqlen_q": "int?", "window_size_left": "int"}
    arguments = ", ".join(f"{types.get(n, 'Tensor?')} {n}" + ("=None" if n == "s_aux" else "") for n in names)
    return f"_vllm_fa3_C::fwd({arguments}) -> Tensor[]"


# `str(torch.ops._vllm_fa3_C.fwd.default._schema)` as vLLM 0.26.0's wheel builds it (printed on the H200).
FA3_SCHEMA_0_26 = (
    "_vllm_fa3_C::fwd(Tensor($0! -> ) q, Tensor k, Tensor v, Tensor? k_new, Tensor? v_new, Tensor? q_v, T"
    "ensor($1! -> )? out, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? cu_seqlens_k_new, Tensor? s"
    "eqused_q, Tensor? seqused_k, int? max_seqlen_q, int? max_seqlen_k, Tensor? page_table, Tensor? kv_ba"
    "tch_idx, Tensor? leftpad_k, Tensor? rotary_cos, Tensor? rotary_sin, Tensor? seqlens_rotary, Tensor? "
    "q_descale, Tensor? k_descale, Tensor? v_descale, float softmax_scale, bool is_causal, int window_siz"
    "e_left, int window_size_right, float softcap, bool is_rotary_interleaved, Tensor? scheduler_metadata"
    ", int num_splits, bool? pack_gqa, int sm_margin, Tensor? s_aux, int cp_world_size, int cp_rank, Tens"
    "or? cp_tot_seqused_k) -> Tensor[]"
)


def test_vllm_0_26_fa3_op_matches_the_declared_arguments() -> None:
    check_op_arguments(FA3_SCHEMA_0_26, v0_26.FA3_FWD_ARGUMENTS)


def test_fa3_schema_names_are_read_in_order() -> None:
    assert schema_argument_names("ns::op(Tensor q, int[]? sizes=None, *, float(a!) s=0., int n=1) -> Tensor") == (
        "q", "sizes", "s", "n")
    check_op_arguments(_fa3_schema(v0_26.FA3_FWD_ARGUMENTS), v0_26.FA3_FWD_ARGUMENTS)


@pytest.mark.parametrize("change", ["swap", "insert", "drop"])
def test_an_fa3_op_with_other_arguments_is_refused_in_one_line(change: str) -> None:
    names = list(v0_26.FA3_FWD_ARGUMENTS)
    if change == "swap":  # e.g. a release that reorders the window sizes
        names[25], names[26] = names[26], names[25]
    elif change == "insert":  # upstream FA3's attention_chunk after the window sizes
        names.insert(27, "attention_chunk")
    else:
        names.pop()
    with pytest.raises(MiniPICConfigError, match=r"fwd takes .* first difference at position (25|27|36):") as e:
        check_op_arguments(_fa3_schema(tuple(names)), v0_26.FA3_FWD_ARGUMENTS)
    assert "\n" not in str(e.value)


def test_the_fa3_call_passes_each_argument_under_its_declared_name() -> None:
    recorded: dict[str, object] = {}

    def fa3(*args: object) -> None:
        assert len(args) == len(v0_26.FA3_FWD_ARGUMENTS)
        recorded.update(zip(v0_26.FA3_FWD_ARGUMENTS, args))

    q, k, v, table, qsl, qused, kused, out = (object() for _ in range(8))
    _fa3_paged_attention(fa3)(q, k, v, table, qsl, qused, kused, 5, 9, 0.5, out)
    assert recorded["q"] is q and recorded["k"] is k and recorded["v"] is v and recorded["out"] is out
    assert recorded["page_table"] is table and recorded["cu_seqlens_q"] is qsl
    assert recorded["seqused_q"] is qused and recorded["seqused_k"] is kused
    assert (recorded["max_seqlen_q"], recorded["max_seqlen_k"], recorded["softmax_scale"]) == (5, 9, 0.5)
    assert recorded["is_causal"] is True and recorded["cu_seqlens_k"] is None
    assert (recorded["window_size_left"], recorded["window_size_right"], recorded["softcap"]) == (-1, -1, 0.0)
    assert (recorded["cp_world_size"], recorded["cp_rank"]) == (1, 0)
