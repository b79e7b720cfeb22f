"""Activation, marker choice, `minipic serve` arguments and start-up guards (no model server)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.rotary_embedding import get_rope

from minipic_protocol import MarkerIds
from minipic_server.config import MiniPICConfigError, PicConfig, pic_config_of, pic_enabled
from minipic_server.guards import check_engine_config, check_kv_cache_groups, check_rope_class
from minipic_server.info_endpoint import server_info
from minipic_server.serve import CPU_BLOCK_SIZE, plugin_allowlist, serve_args, serve_defaults, vllm_serve_parser

MARKERS = {"ssep_token_id": 5, "pdep_token_id": 6, "pad_token_id": 7}
PICKED = {**MARKERS, "hsep_token_id": 2048}  # the tiny model's HSep, picked after the three


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
    with pytest.raises(MiniPICConfigError, match="require_cache_salt must be true or false, got 'yes'"):
        PicConfig.from_section({**MARKERS, "require_cache_salt": "yes"})
    assert PicConfig.from_section({**MARKERS, "require_cache_salt": True}).require_cache_salt
    with pytest.raises(MiniPICConfigError, match="compact must be true or false, got 1"):
        PicConfig.from_section({**MARKERS, "compact": 1})
    assert PicConfig.from_section({**MARKERS, "compact": True}).compact
    for bias in (float("nan"), float("inf"), "-0.5", True):
        with pytest.raises(MiniPICConfigError, match="minipic.span_bias must be a finite number"):
            PicConfig.from_section({**MARKERS, "span_bias": bias})
    assert PicConfig.from_section({**MARKERS, "span_bias": -1}).span_bias == -1
    assert PicConfig(**MARKERS).span_bias == 0.0
    with pytest.raises(MiniPICConfigError, match="must differ.*hsep_token_id=5"):
        PicConfig(5, 6, 7, 5)
    with pytest.raises(MiniPICConfigError, match="minipic.hsep_token_id must be a non-negative integer"):
        PicConfig(5, 6, 7, True)  # type: ignore[arg-type]


def test_sections_with_and_without_hsep() -> None:
    assert PicConfig.from_section(MARKERS).hsep_token_id is None  # written before hidden heads existed
    pic = PicConfig.from_section(PICKED)
    assert pic.markers == PICKED and pic.marker_ids == (5, 6, 7, 2048) and pic.kind_marker_ids == (5, 6, 2048)
    assert PicConfig(**MARKERS).marker_ids == (5, 6, 7)


def test_activation_is_part_of_vllms_config_hash(tiny_model_dir: Path) -> None:
    with_pic = engine_config(tiny_model_dir)
    without = engine_config(tiny_model_dir, markers=None)
    assert pic_config_of(with_pic) == PicConfig(**MARKERS)
    assert pic_config_of(without) is None
    assert pic_enabled(with_pic) and not pic_enabled(without)
    assert with_pic.compute_hash() != without.compute_hash()


def parse_serve(
    model: Path, *vllm_args: str, on_cpu: bool = True, markers: MarkerIds | None = MarkerIds(**MARKERS)
):
    parser, _ = vllm_serve_parser(serve_defaults(on_cpu))
    return serve_args(parser, str(model), list(vllm_args), markers)


def test_serve_defaults_sit_under_the_users_flags(tiny_model_dir: Path) -> None:
    args = parse_serve(tiny_model_dir)
    assert args.enable_prefix_caching and args.enable_prompt_tokens_details
    assert args.block_size == CPU_BLOCK_SIZE and args.kv_cache_memory_bytes > 0
    assert args.additional_config == {"minipic": PICKED}
    gpu = parse_serve(tiny_model_dir, on_cpu=False)
    assert gpu.block_size is None and gpu.kv_cache_memory_bytes is None
    # Every spelling vLLM accepts wins over a default (the underscore one was lost before).
    for flags in (["--kv_cache_memory_bytes", "5"], ["--kv-cache-memory-bytes=5"]):
        assert parse_serve(tiny_model_dir, *flags).kv_cache_memory_bytes == 5
    assert parse_serve(tiny_model_dir, "--block_size", "64").block_size == 64
    assert parse_serve(tiny_model_dir, "--no-enable-prefix-caching").enable_prefix_caching is False


def test_serve_merges_the_minipic_section_into_the_users_additional_config(tiny_model_dir: Path) -> None:
    config = {"x": 1, "minipic": PICKED}
    assert parse_serve(tiny_model_dir, "--additional-config", '{"x": 1}').additional_config == config
    assert parse_serve(tiny_model_dir, "--additional-config.x", "1").additional_config == config
    user = parse_serve(tiny_model_dir, "--additional-config", '{"minipic": {"pad_token_id": 9}, "y": [1]}')
    assert user.additional_config == {"y": [1], "minipic": {**PICKED, "pad_token_id": 9}}
    salted = serve_args(vllm_serve_parser({})[0], str(tiny_model_dir), [], MarkerIds(**MARKERS),
                        require_cache_salt=True)
    assert salted.additional_config == {"minipic": {**PICKED, "require_cache_salt": True}}


def test_serve_picks_markers_from_the_tokenizer_vllm_will_load(tiny_model_dir: Path) -> None:
    args = parse_serve(Path("m"), "--tokenizer", str(tiny_model_dir), markers=None)
    assert args.additional_config == {"minipic": PICKED}


def test_an_hsep_override_is_checked_like_the_other_markers(tiny_model_dir: Path) -> None:
    parser, _ = vllm_serve_parser(serve_defaults(True))
    args = serve_args(parser, str(tiny_model_dir), [], None, hsep_token_id=2048)
    assert args.additional_config == {"minipic": PICKED}
    with pytest.raises(MiniPICConfigError, match="^hsep_token_id=100 cannot be a MiniPIC marker: '}' is an ordinary"):
        serve_args(parser, str(tiny_model_dir), [], None, hsep_token_id=100)
    with pytest.raises(MiniPICConfigError, match="must differ"):
        serve_args(parser, str(tiny_model_dir), [], MarkerIds(**MARKERS), hsep_token_id=7)


def test_markers_embedded_as_an_ordinary_token(tiny_model_dir: Path) -> None:
    parser = vllm_serve_parser({})[0]
    newline = serve_args(parser, str(tiny_model_dir), [], MarkerIds(**MARKERS), embed_markers_as="newline")
    assert newline.additional_config == {"minipic": {**PICKED, "embed_markers_as": 206}}
    pic = PicConfig.from_section(newline.additional_config["minipic"])
    assert pic.embedded_markers == (5, 6, 2048)  # the pad keeps its own row
    assert serve_args(parser, str(tiny_model_dir), [], None, embed_markers_as="72").additional_config == {
        "minipic": {**PICKED, "embed_markers_as": 72}}
    for spec, message in (("tab", "takes 'newline' or a token id, got 'tab'"),
                          ("5", "5: not an ordinary token"), ("99999", "99999: not an ordinary token")):
        with pytest.raises(MiniPICConfigError, match=message):
            serve_args(parser, str(tiny_model_dir), [], None, embed_markers_as=spec)
    with pytest.raises(MiniPICConfigError, match="embed_markers_as must be an ordinary token, not the marker 6"):
        PicConfig.from_section({**MARKERS, "embed_markers_as": 6})
    with pytest.raises(MiniPICConfigError, match="embed_markers_as must be a token id, got '206'"):
        PicConfig.from_section({**MARKERS, "embed_markers_as": "206"})


def test_the_compact_reading_is_the_default_and_the_flag_wins(tiny_model_dir: Path, monkeypatch) -> None:
    """`minipic serve` reads compactly unless told (--no-compact, or the user's minipic section);
    the command line wins over the section."""
    from typer.testing import CliRunner

    import minipic_server.serve
    from minipic_client.cli import app

    def reading(compact: bool | None, *flags: str) -> bool:
        args = serve_args(vllm_serve_parser({})[0], str(tiny_model_dir), list(flags), None, compact=compact)
        return PicConfig.from_section(args.additional_config["minipic"]).compact

    section_plain = ("--additional-config", '{"minipic": {"compact": false}}')
    assert reading(None) is True and reading(False) is False
    assert reading(None, *section_plain) is False and reading(True, *section_plain) is True
    assert PicConfig(**MARKERS).compact is True  # a section written without the key: `vllm serve`
    given: list[bool | None] = []
    monkeypatch.setattr(minipic_server.serve, "serve_main", lambda *a, compact, **k: given.append(compact))
    for flags in ([], ["--compact"], ["--no-compact"]):
        assert CliRunner().invoke(app, ["serve", "some/model", *flags]).exit_code == 0
    assert given == [None, True, False]


def test_the_span_bias_flag_reaches_the_section_and_wins_over_it(tiny_model_dir: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    import minipic_server.serve
    from minipic_client.cli import app

    def bias(span_bias: float | None, *flags: str) -> float:
        args = serve_args(vllm_serve_parser({})[0], str(tiny_model_dir), list(flags), None, span_bias=span_bias)
        return PicConfig.from_section(args.additional_config["minipic"]).span_bias

    section = ("--additional-config", '{"minipic": {"span_bias": -1.0}}')
    assert bias(None) == 0.0 and bias(-0.5) == -0.5
    assert bias(None, *section) == -1.0 and bias(0.25, *section) == 0.25
    given: list[float | None] = []
    monkeypatch.setattr(minipic_server.serve, "serve_main", lambda *a, span_bias, **k: given.append(span_bias))
    for flags in ([], ["--span-bias", "-0.5"]):
        assert CliRunner().invoke(app, ["serve", "some/model", *flags]).exit_code == 0
    assert given == [None, -0.5]
    refused = CliRunner().invoke(app, ["serve", "some/model", "--span-bias", "low"])
    assert refused.exit_code != 0 and "--span-bias" in refused.output


def test_plugin_allowlist_keeps_other_plugins() -> None:
    assert plugin_allowlist("other") == "other,minipic,minipic_info"
    assert {"minipic", "minipic_info"} <= set(plugin_allowlist(None).split(","))


def test_info_names_a_local_tokenizer_by_its_absolute_path(tiny_model_dir: Path, monkeypatch) -> None:
    monkeypatch.chdir(tiny_model_dir.parent)
    config = engine_config(Path(tiny_model_dir.name))
    assert config.model_config.tokenizer == tiny_model_dir.name  # vLLM keeps it relative
    assert server_info(config, "tiny", "id").tokenizer == str(tiny_model_dir)


@pytest.mark.parametrize(
    ("markers", "kwargs", "message"),
    [
        (MARKERS, {"enable_prefix_caching": False}, "needs prefix caching"),
        ({**MARKERS, "pad_token_id": 50000}, {}, "pad_token_id=50000 is outside the model's embedding table"),
        ({**MARKERS, "ssep_token_id": 100}, {}, "ssep_token_id=100 cannot be a MiniPIC marker: '}' is an ordinary"),
        ({**MARKERS, "hsep_token_id": 100}, {}, "hsep_token_id=100 cannot be a MiniPIC marker: '}' is an ordinary"),
        ({**MARKERS, "hsep_token_id": 5000}, {}, "hsep_token_id=5000 is outside the model's embedding table"),
        (MARKERS, {"enable_lora": True}, "does not support LoRA"),
        (MARKERS, {"kv_transfer_config": {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}},
         r"does not support the KV connector LMCacheConnectorV1 yet"),
        (MARKERS, {"kv_transfer_config": {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                                          "kv_connector_extra_config": {"blocks_per_chunk": 4}}},
         r"needs KV offloading in entries of one block, got blocks_per_chunk=4: "),
        (MARKERS, {"tensor_parallel_size": 2}, "does not support tensor parallelism yet"),
        (MARKERS, {"enable_prompt_embeds": True}, r"does not support prompt embeddings \(--enable-prompt-embeds\)"),
        (MARKERS, {"kv_cache_dtype": "fp8"}, r"quantized KV cache \(--kv-cache-dtype fp8\)"),
        (MARKERS, {"attention_backend": "FLEX_ATTENTION"}, "--attention-backend FLEX_ATTENTION cannot be used"),
    ],
)
def test_engine_config_guards(tiny_model_dir: Path, markers, kwargs, message) -> None:
    with pytest.raises(MiniPICConfigError, match=message):
        engine_config(tiny_model_dir, markers, **kwargs)


def test_multimodal_models_are_refused() -> None:
    model = SimpleNamespace(use_mla=False, is_multimodal_model=True, enable_prompt_embeds=False)
    config = SimpleNamespace(
        model_config=model, cache_config=SimpleNamespace(enable_prefix_caching=True, block_size=16),
        parallel_config=SimpleNamespace(pipeline_parallel_size=1, tensor_parallel_size=1, enable_dbo=False),
        lora_config=None,
        speculative_config=None, kv_transfer_config=None,
    )
    with pytest.raises(MiniPICConfigError, match="does not support multimodal models"):
        check_engine_config(config, PicConfig(**MARKERS))


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


REFUSED_STARTS = {
    "MiniPIC needs prefix caching": ["--no-enable-prefix-caching"],
    "MiniPIC does not support a quantized KV cache (--kv-cache-dtype fp8)": ["--kv-cache-dtype", "fp8"],
    "--attention-backend FLEX_ATTENTION cannot be used with MiniPIC": ["--attention-backend", "FLEX_ATTENTION"],
    "ssep_token_id=100 cannot be a MiniPIC marker: '}' is an ordinary token, which text produces":
        ["--ssep-token-id", "100", "--pdep-token-id", "6", "--pad-token-id", "7"],
    "hsep_token_id=100 cannot be a MiniPIC marker: '}' is an ordinary token": ["--hsep-token-id", "100"],
}  # fmt: skip


@pytest.fixture(scope="module")
def refused_starts(tiny_model_dir: Path) -> dict[str, subprocess.CompletedProcess]:
    """Every refused `minipic serve` start at once: each imports vLLM and stops before any engine,
    so together they take about what two take one after the other."""

    def start(flags: list[str]) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "minipic_client.cli", "serve", str(tiny_model_dir), *flags, "--port", "0"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(len(REFUSED_STARTS)) as pool:
        return dict(zip(REFUSED_STARTS, pool.map(start, REFUSED_STARTS.values())))


@pytest.mark.server
@pytest.mark.parametrize("message", list(REFUSED_STARTS))
def test_a_refused_start_ends_with_minipics_one_line(
    refused_starts: dict[str, subprocess.CompletedProcess], message: str
) -> None:
    result = refused_starts[message]
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("minipic serve: error: ") and message in last
    assert "Traceback" not in result.stderr


def test_pic_picks_its_own_attention_backend_and_refuses_others(tiny_model_dir: Path) -> None:
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    with set_current_vllm_config(engine_config(tiny_model_dir)):
        path = current_platform.get_attn_backend_cls(None, None)
        assert path == "minipic_server.backends.cpu.PicCpuAttentionBackend"
        with pytest.raises(MiniPICConfigError, match="--attention-backend FLASH_ATTN cannot be used"):
            current_platform.get_attn_backend_cls(AttentionBackendEnum.FLASH_ATTN, None)


def test_native_cpu_offloading_in_one_block_entries_is_accepted(tiny_model_dir: Path) -> None:
    """--kv-offloading-size becomes vLLM's OffloadingConnector, one block per CPU entry
    (tests/gpu/test_offload.py serves it on the H200)."""
    config = engine_config(tiny_model_dir, kv_offloading_size=1.0)
    assert config.kv_transfer_config.kv_connector == "OffloadingConnector"
