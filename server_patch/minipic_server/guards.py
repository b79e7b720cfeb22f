"""Start-up checks: refuse configurations MiniPIC cannot serve exactly, each with one clear error."""

from __future__ import annotations

from typing import Any

from minipic_protocol import MarkerIds
from minipic_server.config import MiniPICConfigError, PicConfig
from minipic_server.markers import check_marker_ids, load_tokenizer

# RoPE classes whose rotation is fully described by (cos_sin_cache, rotary_dim, is_neox_style),
# which is what the attention backends re-apply to keys. Exact class names, not isinstance:
# subclasses (Phi-3 LongRoPE, MRoPE, DeepSeek scaling, ...) rotate differently.
SUPPORTED_ROPE_CLASSES = frozenset(
    {
        "RotaryEmbedding",
        "Llama3RotaryEmbedding",
        "LinearScalingRotaryEmbedding",
        "DynamicNTKScalingRotaryEmbedding",
        "YaRNScalingRotaryEmbedding",
    }
)


def check_engine_config(vllm_config: Any, pic: PicConfig) -> None:
    """Checks that need only the engine configuration (API-server process, before the engine)."""
    model_config = vllm_config.model_config
    if not vllm_config.cache_config.enable_prefix_caching:
        raise MiniPICConfigError(
            "MiniPIC needs prefix caching: remove --no-enable-prefix-caching "
            "(span reuse is built on vLLM's prefix cache)"
        )
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        raise MiniPICConfigError(
            "MiniPIC does not support pipeline parallelism yet: use --pipeline-parallel-size 1"
        )
    if vllm_config.parallel_config.tensor_parallel_size > 1:
        raise MiniPICConfigError(
            "MiniPIC does not support tensor parallelism yet: use --tensor-parallel-size 1 "
            "(or several replicas with --data-parallel-size)"
        )
    check_kv_transfer(vllm_config.kv_transfer_config, vllm_config.cache_config.block_size)
    if vllm_config.parallel_config.enable_dbo:
        raise MiniPICConfigError(
            "MiniPIC does not support dual-batch overlap (--enable-dbo): block records are set per step, "
            "not per micro-batch; drop the flag"
        )
    if model_config.enable_prompt_embeds:
        raise MiniPICConfigError(
            "MiniPIC does not support prompt embeddings (--enable-prompt-embeds): markers and block records "
            "come from token ids; drop the flag"
        )
    if vllm_config.lora_config is not None:
        raise MiniPICConfigError("MiniPIC does not support LoRA adapters yet: remove --enable-lora")
    if vllm_config.speculative_config is not None:
        raise MiniPICConfigError("MiniPIC does not support speculative decoding yet")
    if model_config.use_mla:
        raise MiniPICConfigError("MiniPIC does not support MLA attention models (DeepSeek-style)")
    if model_config.is_multimodal_model:
        raise MiniPICConfigError(
            "MiniPIC does not support multimodal models yet: serve a text-only model "
            "(span hashes would need vLLM's per-image extra keys)"
        )
    if model_config.uses_mrope:
        raise MiniPICConfigError(
            "MiniPIC does not support multimodal RoPE (MRoPE): only RoPE classes "
            f"{sorted(SUPPORTED_ROPE_CLASSES)} are re-applied to keys"
        )
    if model_config.get_sliding_window() is not None:
        raise MiniPICConfigError("MiniPIC does not support sliding-window attention models")
    cache_dtype = vllm_config.cache_config.cache_dtype
    if cache_dtype != "auto":
        raise MiniPICConfigError(
            f"MiniPIC does not support a quantized KV cache (--kv-cache-dtype {cache_dtype}): "
            "its attention reads keys in the model's dtype; drop the flag"
        )
    check_attention_backend(vllm_config.attention_config.backend)
    check_markers(pic, model_config)


# The one KV connector MiniPIC is built for: vLLM's own CPU offloading, one CPU entry per GPU
# block, keyed by that block's hash (tests/gpu/test_offload.py reloads spans at other offsets).
OFFLOADING_CONNECTOR = "OffloadingConnector"


def check_kv_transfer(kv_transfer_config: Any, block_size: int | None) -> None:
    """Only vLLM's native CPU offloading (``--kv-offloading-size``) with one GPU block per CPU
    entry.

    A reloaded block gets its records from its hash (`minipic_server.block_plan`), so any
    store keyed by block hash is exact, as long as an entry never spans two blocks: an entry
    of several blocks is keyed by its last block's hash, and a span's block hash does not
    name the span before it.
    """
    if kv_transfer_config is None:
        return
    if kv_transfer_config.kv_connector != OFFLOADING_CONNECTOR:
        raise MiniPICConfigError(
            f"MiniPIC does not support the KV connector {kv_transfer_config.kv_connector} yet (LMCache, Mooncake, "
            "P/D): MiniPIC is built for vLLM's native CPU offloading (--kv-offloading-size) only; drop the flag"
        )
    extra = kv_transfer_config.kv_connector_extra_config or {}
    blocks_per_entry = extra.get("blocks_per_chunk", 1)
    entry_tokens = extra.get("block_size", block_size)
    if blocks_per_entry != 1 or entry_tokens != block_size:
        raise MiniPICConfigError(
            "MiniPIC needs KV offloading in entries of one block, got "
            + ", ".join(f"{key}={extra[key]}" for key in ("blocks_per_chunk", "block_size") if key in extra)
            + ": an entry of several blocks is keyed by its last block alone; drop the setting"
        )


# vLLM's names for MiniPIC's own backends (CUDA: registered as CUSTOM; CPU: replaces CPU_ATTN).
PIC_BACKEND_NAMES = ("CUSTOM", "CPU_ATTN")


def check_attention_backend(selected: Any) -> None:
    """A user's --attention-backend, if any, must be MiniPIC's own."""
    if selected is not None and selected.name not in PIC_BACKEND_NAMES:
        raise MiniPICConfigError(
            f"--attention-backend {selected.name} cannot be used with MiniPIC: "
            "PIC needs its own attention (reused spans moved into place, span windows); drop the flag"
        )


def check_markers(pic: PicConfig, model_config: Any) -> None:
    """Marker ids must fit the embedding table and follow `minipic_server.markers`' rule."""
    embedding_rows = model_config.get_vocab_size()
    for name, token_id in pic.markers.items():
        if token_id >= embedding_rows:
            raise MiniPICConfigError(
                f"minipic.{name}={token_id} is outside the model's embedding table (size {embedding_rows})"
            )
    if not model_config.skip_tokenizer_init:
        tokenizer = load_tokenizer(
            model_config.tokenizer, model_config.tokenizer_revision, model_config.trust_remote_code
        )
        check_marker_ids(tokenizer, MarkerIds(**pic.markers))


def check_kv_cache_groups(num_groups: int) -> None:
    if num_groups != 1:
        raise MiniPICConfigError(
            f"MiniPIC needs exactly one KV-cache group, this model has {num_groups} "
            "(hybrid attention/SSM models are not supported)"
        )


def check_rope_class(rope: Any, layer_name: str) -> None:
    name = type(rope).__name__
    if name not in SUPPORTED_ROPE_CLASSES:
        raise MiniPICConfigError(
            f"MiniPIC cannot re-apply {name} to keys (layer {layer_name}); "
            f"supported RoPE classes: {sorted(SUPPORTED_ROPE_CLASSES)}"
        )
