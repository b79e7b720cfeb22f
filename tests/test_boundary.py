"""The boundary's run-time side: the vLLM version check, run-time patches, attention-impl arguments."""

from __future__ import annotations

import logging

import pytest
import vllm

from minipic_server import boundary, plugin
from minipic_server.backends.cuda import PicTritonAttentionImpl
from minipic_server.boundary import ALLOW_UNSUPPORTED_ENV, UnsupportedVLLMError, table_version
from minipic_server.config import MiniPICConfigError
from minipic_server.impl_args import bind_impl_args

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
