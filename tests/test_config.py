"""Activation, marker choice, `minipic serve` arguments and start-up guards (no model server)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.rotary_embedding import get_rope

from minipic_server.config import MiniPICConfigError, PicConfig, pic_config_of
from minipic_server.guards import check_kv_cache_groups, check_rope_class
from minipic_server.markers import MarkerIds, pick_marker_ids
from minipic_server.serve import build_vllm_argv, plugin_allowlist

MARKERS = {"ssep_token_id": 5, "pdep_token_id": 6, "pad_token_id": 7}


def engine_config(model_dir: Path, markers: dict | None = MARKERS, **kwargs):
    additional = {"minipic": markers} if markers is not None else {}
    args = EngineArgs(
        model=str(model_dir),
        dtype="float32",
        block_size=16,
        max_model_len=1024,
        kv_cache_memory_bytes=16 << 20,
        additional_config=additional,
        **kwargs,
    )
    return args.create_engine_config()


def test_section_parsing_names_the_problem() -> None:
    assert pic_config_of(type("C", (), {"additional_config": {}})()) is None
    with pytest.raises(MiniPICConfigError, match="must differ"):
        PicConfig(5, 5, 7)
    with pytest.raises(MiniPICConfigError, match="missing \\['pad_token_id'\\]"):
        PicConfig.from_section({"ssep_token_id": 1, "pdep_token_id": 2})
    with pytest.raises(MiniPICConfigError, match="unknown \\['sep'\\]"):
        PicConfig.from_section({**MARKERS, "sep": 1})
    with pytest.raises(MiniPICConfigError, match="non-negative integer"):
        PicConfig(-1, 2, 3)


def test_activation_is_part_of_vllms_config_hash(tiny_model_dir: Path) -> None:
    with_pic = engine_config(tiny_model_dir)
    without = engine_config(tiny_model_dir, markers=None)
    assert pic_config_of(with_pic) == PicConfig(**MARKERS)
    assert pic_config_of(without) is None
    assert with_pic.compute_hash() != without.compute_hash()


def test_markers_are_picked_from_the_tokenizer(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert pick_marker_ids(tokenizer) == MarkerIds(**MARKERS)
    llama3_like = type("T", (), {"get_vocab": lambda self: {
        f"<|reserved_special_token_{i}|>": 128000 + i for i in range(20)}})()
    assert pick_marker_ids(llama3_like) == MarkerIds(128010, 128011, 128012)
    with pytest.raises(ValueError, match="--ssep-token-id"):
        pick_marker_ids(type("T", (), {"get_vocab": lambda self: {"a": 0}})())


def test_serve_arguments_merge_user_config_and_let_user_flags_win() -> None:
    argv = build_vllm_argv(
        "m", ["--additional-config", '{"x": 1}', "--no-enable-prefix-caching"],
        MarkerIds(**MARKERS), on_cpu=True,
    )
    assert argv.index("--enable-prefix-caching") < argv.index("--no-enable-prefix-caching")
    assert "--enable-prompt-tokens-details" in argv
    assert json.loads(argv[argv.index("--additional-config") + 1]) == {"x": 1, "minipic": MARKERS}
    assert int(argv[argv.index("--kv-cache-memory-bytes") + 1]) > 0
    assert "--kv-cache-memory-bytes" not in build_vllm_argv("m", [], MarkerIds(**MARKERS), on_cpu=False)
    assert plugin_allowlist("other") == "other,minipic,minipic_info"
    assert {"minipic", "minipic_info"} <= set(plugin_allowlist(None).split(","))


@pytest.mark.parametrize(
    ("markers", "kwargs", "message"),
    [
        (MARKERS, {"enable_prefix_caching": False}, "needs prefix caching"),
        ({**MARKERS, "pad_token_id": 50000}, {}, "pad_token_id=50000 is outside the tokenizer's vocabulary"),
        (MARKERS, {"enable_lora": True}, "does not support LoRA"),
    ],
)
def test_engine_config_guards(tiny_model_dir: Path, markers, kwargs, message) -> None:
    with pytest.raises(MiniPICConfigError, match=message):
        engine_config(tiny_model_dir, markers, **kwargs)


def test_guards_leave_stock_configs_alone(tiny_model_dir: Path) -> None:
    engine_config(tiny_model_dir, markers=None, enable_prefix_caching=False)


def test_rope_and_kv_group_guards() -> None:
    with set_current_vllm_config(VllmConfig()):
        _check_rope_guards()
    with pytest.raises(MiniPICConfigError, match="exactly one KV-cache group"):
        check_kv_cache_groups(2)


def _check_rope_guards() -> None:
    check_rope_class(get_rope(64, 4096, rope_parameters={"rope_type": "default", "rope_theta": 1e4}), "l0")
    llama3 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    check_rope_class(get_rope(128, 8192, rope_parameters=llama3), "l0")
    mrope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [16, 8, 8]}
    with pytest.raises(MiniPICConfigError, match="cannot re-apply MRotaryEmbedding"):
        check_rope_class(get_rope(64, 4096, rope_parameters=mrope), "l0")


@pytest.mark.server
def test_real_server_start_fails_with_the_guard_message(tiny_model_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "minipic_client.cli", "serve", str(tiny_model_dir),
         "--no-enable-prefix-caching", "--port", "0"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    assert "MiniPIC needs prefix caching" in result.stdout + result.stderr


def test_pic_picks_its_own_attention_backend_and_refuses_others(tiny_model_dir: Path) -> None:
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    with set_current_vllm_config(engine_config(tiny_model_dir)):
        path = current_platform.get_attn_backend_cls(None, None)
        assert path == "minipic_server.backends.cpu.PicCpuAttentionBackend"
        with pytest.raises(MiniPICConfigError, match="--attention-backend FLASH_ATTN cannot be used"):
            current_platform.get_attn_backend_cls(AttentionBackendEnum.FLASH_ATTN, None)
