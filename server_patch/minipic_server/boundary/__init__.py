"""The one place MiniPIC touches vLLM: every vLLM name the plugin uses comes from here.

- `table`: every hook, patch, override and private API MiniPIC relies on, declared as data
  and checked against each supported release by ``tests/test_vllm_contract.py``;
- `versions`: which releases are supported (one line for any other);
- ``v0_26`` (CUDA) and ``v0_32`` (CPU): what differs between them; the one for the
  installed vLLM is `release`, chosen when this package is imported;
- `checks`: start-up checks of the data MiniPIC's kernels assume (KV-cache shape, the
  FlashAttention-3 op's arguments), refused in one line.

vLLM names are resolved on first use (`__getattr__`), as the ``from vllm... import`` they
replace did, so importing this package loads no more of vLLM than the importing module
needed. ``tests/test_boundary.py`` fails if any other module imports vLLM.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import vllm

from minipic_server.boundary.checks import check_kv_cache_shape
from minipic_server.boundary.table import (
    BAD_WORDS,
    CHAIN_STATE,
    ENGINE_GAPS,
    ENGINE_HASHER,
    ENGINE_PIC,
    ENGINE_PLANNER,
    REQUEST_BLOCK_HASHER,
    REQUEST_RECORDS,
    SCHEDULE,
    SCHEDULER_ALLOCATE_SLOTS,
    SCHEDULER_CHUNK_END,
    SCHEDULER_SPLITS_CHUNKS,
    STEP_RECORDS,
    TABLE,
    How,
    Intervention,
    entries_for,
    install,
    patch,
    patch_instance,
)
from minipic_server.boundary.versions import (
    ALLOW_UNSUPPORTED_ENV,
    SUPPORTED_VLLM,
    UnsupportedVLLMError,
    table_version,
)

# Name -> (module, attribute; None for the module itself). Both supported releases define them all.
VLLM_NAMES: dict[str, tuple[str, str | None]] = {
    **{name: ("vllm.v1.attention.backend", name) for name in (
        "AttentionCGSupport", "AttentionImpl", "AttentionMetadataBuilder", "AttentionType",
        "CommonAttentionMetadata", "MultipleOf")},
    "CPUAttentionBackend": ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackend"),
    "TritonAttentionBackend": ("vllm.v1.attention.backends.triton_attn", "TritonAttentionBackend"),
    "TritonAttentionImpl": ("vllm.v1.attention.backends.triton_attn", "TritonAttentionImpl"),
    "AttentionBackendEnum": ("vllm.v1.attention.backends.registry", "AttentionBackendEnum"),
    "register_backend": ("vllm.v1.attention.backends.registry", "register_backend"),
    "Attention": ("vllm.model_executor.layers.attention.attention", "Attention"),
    "BaseModelLoader": ("vllm.model_executor.model_loader.base_loader", "BaseModelLoader"),
    **{name: ("vllm.model_executor.layers.vocab_parallel_embedding", name) for name in (
        "ParallelLMHead", "VocabParallelEmbedding")},
    "EngineCore": ("vllm.v1.engine.core", "EngineCore"),
    "Request": ("vllm.v1.request", "Request"),
    "RequestStatus": ("vllm.v1.request", "RequestStatus"),
    "kv_cache_utils": ("vllm.v1.core.kv_cache_utils", None),  # NONE_HASH is set at start-up: read it there
    **{name: ("vllm.v1.core.kv_cache_utils", name) for name in (
        "BlockHash", "generate_block_hash_extra_keys", "hash_block_tokens", "resolve_kv_cache_block_sizes")},
    "get_hash_fn_by_name": ("vllm.utils.hashing", "get_hash_fn_by_name"),
    "get_current_vllm_config": ("vllm.config", "get_current_vllm_config"),
    "current_platform": ("vllm.platforms", "current_platform"),
    "ServeSubcommand": ("vllm.entrypoints.cli.serve", "ServeSubcommand"),
    "FlexibleArgumentParser": ("vllm.utils.argparse_utils", "FlexibleArgumentParser"),
    "cli_env_setup": ("vllm.entrypoints.serve.utils.api_utils", "cli_env_setup"),
    "create_completion": ("vllm.entrypoints.openai.completion.api_router", "create_completion"),
    "CompletionRequest": ("vllm.entrypoints.openai.completion.protocol", "CompletionRequest"),
    "use_penalty": ("vllm.v1.worker.gpu.sample.penalties", "use_penalty"),  # the V2 runner's (GPU) rule
}


def __getattr__(name: str) -> Any:
    if name not in VLLM_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = VLLM_NAMES[name]
    value = importlib.import_module(module)
    value = value if attribute is None else getattr(value, attribute)
    globals()[name] = value
    return value


def vllm_version() -> str:
    return vllm.__version__


def device_type() -> str:
    from vllm.platforms import current_platform

    return current_platform.device_type


def supported_release() -> str:
    """The supported release this vLLM is hooked as; one line (`UnsupportedVLLMError`) when none."""
    return table_version(vllm_version(), device_type())


release: ModuleType = importlib.import_module(f"{__name__}.v{supported_release().replace('.', '_')}")


def check_kv_cache_layout(kv_cache_spec: Any) -> None:
    """Refuse (one line) a KV-cache layout MiniPIC's kernels would misread, from the layer
    group's attention spec (the backend's metadata builder calls this as it initialises)."""
    shape = release.kv_cache_shape(kv_cache_spec, 3)
    check_kv_cache_shape(shape, kv_cache_spec.block_size, kv_cache_spec.num_kv_heads, kv_cache_spec.head_size)


__all__ = [
    "ALLOW_UNSUPPORTED_ENV", "BAD_WORDS", "CHAIN_STATE", "ENGINE_GAPS", "ENGINE_HASHER", "ENGINE_PIC",
    "ENGINE_PLANNER", "REQUEST_BLOCK_HASHER", "REQUEST_RECORDS", "SCHEDULE", "SCHEDULER_ALLOCATE_SLOTS",
    "SCHEDULER_CHUNK_END", "SCHEDULER_SPLITS_CHUNKS", "STEP_RECORDS", "SUPPORTED_VLLM", "TABLE", "VLLM_NAMES",
    "How", "Intervention", "UnsupportedVLLMError", "check_kv_cache_layout", "device_type", "entries_for", "install",
    "patch", "patch_instance", "release", "supported_release", "table_version", "vllm_version",
]  # fmt: skip
