"""Engine-core side of the plugin: marker-aware block hashing and banning markers from sampling.

vLLM loads general plugins *inside* ``EngineCore.__init__``, so that first
constructor call cannot be wrapped. The hooks (installed by `minipic_server.boundary`)
sit on methods it calls later:
``_initialize_kv_caches`` (start-up, with the final KV-cache layout) and
``preprocess_add_request`` (every request, before its block hashes exist; the first one
also installs gapped hits and the block planner on the engine's scheduler).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minipic_server.block_plan import install_block_planner
from minipic_server.boundary import (
    BAD_WORDS,
    ENGINE_HASHER,
    ENGINE_PIC,
    REQUEST_BLOCK_HASHER,
    EngineCore,
    get_hash_fn_by_name,
    patch_instance,
    resolve_kv_cache_block_sizes,
)
from minipic_server.config import PicConfig, pic_config_of
from minipic_server.gapped_hits import install_gap_scheduling
from minipic_server.guards import check_kv_cache_groups
from minipic_server.hashing import make_pic_block_hasher


def wrap_initialize_kv_caches(original: Callable[..., Any]) -> Callable[..., Any]:
    def _initialize_kv_caches(self: EngineCore, vllm_config: Any) -> Any:
        kv_cache_config = original(self, vllm_config)
        pic = pic_config_of(vllm_config)
        hasher = None
        if pic is not None:
            check_kv_cache_groups(len(kv_cache_config.kv_cache_groups))
            _, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
            hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
            hasher = make_pic_block_hasher(hash_block_size, hash_fn, pic)
        patch_instance(ENGINE_PIC, self, pic)
        patch_instance(ENGINE_HASHER, self, hasher)
        return kv_cache_config

    return _initialize_kv_caches


def wrap_preprocess_add_request(original: Callable[..., Any]) -> Callable[..., Any]:
    def preprocess_add_request(self: EngineCore, request: Any) -> Any:
        pic: PicConfig | None = getattr(self, "_minipic", None)
        if pic is not None:
            # The constructor assigns vLLM's own hasher after the KV caches exist.
            patch_instance(REQUEST_BLOCK_HASHER, self, self._minipic_hasher)
            install_gap_scheduling(self)
            install_block_planner(self, pic)
            if request.sampling_params is not None:
                ban_markers(request.sampling_params, pic)
        return original(self, request)

    return preprocess_add_request


def ban_markers(sampling_params: Any, pic: PicConfig) -> None:
    """Markers are prompt-only: a generated marker would silently re-window later tokens."""
    banned = list(sampling_params._bad_words_token_ids or [])
    banned.extend([token_id] for token_id in pic.marker_ids if [token_id] not in banned)
    patch_instance(BAD_WORDS, sampling_params, banned)
