"""Every place MiniPIC hooks into vLLM, declared as data.

vLLM has no extension point for what PIC changes (block hashing, per-block records
of where keys were computed, the attention backend choice), so the plugin wraps a few
private vLLM attributes, patches a few objects at run time, subclasses vLLM's
attention backends and reads some private APIs. Each `Intervention` names the vLLM
attribute, what MiniPIC does with it and why. This module holds the ones every
supported release shares; ``v0_26`` and ``v0_32`` hold each release's own (`TABLE` is
all of them). `install` puts the class-level hooks in place (from
`minipic_server.plugin.register`); `patch_instance` applies the run-time ones;
``tests/test_vllm_contract.py`` checks every entry, attribute and signature,
against the source of each supported release. Porting to a new vLLM means
running those tests against it and adding a module for it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from minipic_server.boundary import v0_26, v0_32
from minipic_server.boundary.interventions import (
    ATTN,
    FORWARD,
    KV_UTILS,
    ONLINE,
    ROPE,
    SALT_POLICY,
    SALT_WHY,
    How,
    Intervention,
    attach,
    override,
    patch,
    use,
    wrap,
)
from minipic_server.boundary.versions import UnsupportedVLLMError
from minipic_server.patching import wrap_attribute

# Patched at run time (`patch_instance` takes these).
REQUEST_BLOCK_HASHER = patch(
    "vllm.v1.engine.core:EngineCore.request_block_hasher",
    "replaced by the marker-aware hasher before each request is built (the constructor sets vLLM's own "
    "after the KV caches exist)")
BAD_WORDS = patch(
    "vllm.sampling_params:SamplingParams._bad_words_token_ids",
    "marker ids appended: markers are prompt-only, a generated one would re-window later tokens")
# Block records (`block_plan`, `block_records`): decided by the scheduler, shipped with each step.
SCHEDULE = patch(
    "vllm.v1.core.sched.scheduler:Scheduler.schedule",
    "wrapped per engine: the output carries the records of every block that entered a block table "
    "this step; arguments (which differ between releases) are passed through")
STEP_RECORDS = attach("vllm.v1.core.sched.output:SchedulerOutput._minipic_records",
                      "the step's block records (`block_plan.StepRecords`), read by the worker before the forward")
REQUEST_RECORDS = attach("vllm.v1.request:Request._minipic_records", "a request's records by logical block")
ENGINE_PLANNER = attach("vllm.v1.engine.core:EngineCore._minipic_planner", "the engine's BlockPlanner, once installed")
# MiniPIC's own state on vLLM objects (names vLLM must not use; classes must not be slotted).
ENGINE_PIC = attach("vllm.v1.engine.core:EngineCore._minipic", "the engine's PicConfig, or None when PIC is off")
ENGINE_HASHER = attach("vllm.v1.engine.core:EngineCore._minipic_hasher", "the marker-aware hasher built at start-up")
CHAIN_STATE = attach("vllm.v1.request:Request._minipic_chain_state", "per-request hashing state between hasher calls")
# Gapped hits (`gapped_hits`): the scheduler's one per-request chunk-end hook and the slot allocation.
_SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
_KV_MANAGER = "vllm.v1.core.kv_cache_manager:KVCacheManager"
SCHEDULER_SPLITS_CHUNKS = patch(
    f"{_SCHED}.need_mamba_block_aligned_split",
    "set: vLLM then asks `_mamba_block_aligned_split` where each prefill chunk ends (both the running and "
    "the waiting path); the guards refuse Mamba models, so MiniPIC's answer is the only one")
SCHEDULER_CHUNK_END = patch(
    f"{_SCHED}._mamba_block_aligned_split",
    "replaced per scheduler: a prefill chunk ends where the next cached run starts (gapped hits)",
    ("self", "request", "num_new_tokens", "num_new_local_computed_tokens", "num_external_computed_tokens"))
SCHEDULER_ALLOCATE_SLOTS = patch(
    f"{_KV_MANAGER}.allocate_slots",
    "wrapped per engine: a cached run at a running request's chunk start is adopted in front of the new "
    "slots (vLLM's own adoption only takes new requests' prefix hits); the rest of the arguments, which "
    "differ between releases, are passed through", keywords=("request", "num_new_tokens"))
ENGINE_GAPS = attach("vllm.v1.engine.core:EngineCore._minipic_gaps", "the engine's GapScheduling, once installed")


COMMON: tuple[Intervention, ...] = (
    # Hooks installed at start-up.
    wrap("vllm.engine.arg_utils:EngineArgs.create_engine_config", "minipic_server.startup:wrap_create_engine_config",
         "refuse configurations PIC cannot serve before the engine starts; log the start-up block; "
         "give the API server the metrics settings", ("self", "usage_context", "headless")),
    wrap("vllm.renderers.registry:RendererRegistry.load_renderer", "minipic_server.marker_text:wrap_load_renderer",
         "renderers get a tokenizer that turns marker strings in text into ordinary text: markers count only "
         "in token-id prompts", ("self", "renderer_mode", "config", "tokenizer")),
    *(wrap(f"{ONLINE}:OnlineRenderer.{name}", SALT_POLICY, SALT_WHY, ("self", "request", "skip_mm_cache"))
      for name in ("render_completion", "render_chat")),
    use(f"{ONLINE}:OnlineRenderer.renderer", "require_cache_salt: the engine's renderer"),
    use(f"{ONLINE}:OnlineRenderer.create_error_response",
        "require_cache_salt: vLLM's own 400 answer", keywords=("param",)),
    use("vllm.renderers.base:BaseRenderer.config", "require_cache_salt: the engine's configuration"),
    use("vllm.entrypoints.openai.completion.api_router:create_completion",
        "the completions route: vLLM's own handler, given the request its route would have parsed",
        ("request", "raw_request")),
    use("vllm.entrypoints.openai.completion.protocol:CompletionRequest.prompt",
        "the completions route checks a token-id prompt itself and validates the other fields with the model"),
    *(use(f"vllm.entrypoints.openai.{kind}.protocol:{name}.cache_salt", "require_cache_salt: the request's salt")
      for kind, name in (("completion", "CompletionRequest"), ("chat_completion", "ChatCompletionRequest"),
                         ("responses", "ResponsesRequest"))),
    wrap("vllm.v1.engine.core:EngineCore._initialize_kv_caches",
         "minipic_server.engine_hooks:wrap_initialize_kv_caches",
         "build the marker-aware block hasher once the KV-cache layout is final", ("self", "vllm_config")),
    wrap("vllm.v1.engine.core:EngineCore.preprocess_add_request",
         "minipic_server.engine_hooks:wrap_preprocess_add_request",
         "hash every request with markers and ban markers from sampling", ("self", "request")),
    wrap("vllm.model_executor.model_loader.base_loader:BaseModelLoader.load_model",
         "minipic_server.position_free:wrap_load_model",
         "make the loaded model position-free", ("self", "vllm_config", "model_config", "prefix")),
    use("vllm.v1.attention.backends.registry:AttentionBackendEnum.CUSTOM", "the name the CUDA backend registers"),
    use("vllm.model_executor.layers.vocab_parallel_embedding:VocabParallelEmbedding.forward",
        "--embed-markers-as: a forward pre-hook maps marker ids before the lookup; output heads read the "
        "weights without calling it", ("self", "input_")),
    wrap("vllm.v1.engine.output_processor:OutputProcessor._update_stats_from_finished",
         "minipic_server.metrics:wrap_update_stats_from_finished",
         "count span reuse per finished request for /metrics (the API server has prompt ids and cache hits here)",
         ("self", "req_state", "finish_reason", "iteration_stats")),
    wrap("vllm.v1.engine.detokenizer:FastIncrementalDetokenizer.__init__",
         "minipic_server.detokenizer_priming:wrap_fast_detokenizer_init",
         "prime the decode stream with the prompt's tail: vLLM's priming decodes the whole prompt at the "
         "first token, the largest per-token cost of a request over cached documents",
         ("self", "tokenizer", "request")),
    *(use(f"vllm.v1.engine.detokenizer:FastIncrementalDetokenizer.{name}", "tail priming: the stream it replaces")
      for name in ("stream", "tokenizer", "skip_special_tokens")),
    use("vllm.v1.engine:EngineCoreRequest.prompt_token_ids", "tail priming: the prompt"),
    use("vllm.v1.engine.output_processor:RequestState.prompt_token_ids", "metrics: where the markers are"),
    use("vllm.v1.engine.output_processor:RequestState.num_cached_tokens", "metrics: the prefix-cache hit"),
    # Configuration the start-up guards read.
    *(use(f"vllm.config.model:ModelConfig.{name}", "start-up guards")
      for name in ("use_mla", "uses_mrope", "is_multimodal_model", "get_sliding_window", "get_vocab_size",
                   "skip_tokenizer_init", "tokenizer", "tokenizer_revision", "trust_remote_code")),
    use("vllm.config.cache:CacheConfig.enable_prefix_caching", "start-up guards: PIC is built on it"),
    use("vllm.config.cache:CacheConfig.cache_dtype", "start-up guards: no quantized KV cache"),
    use("vllm.config.attention:AttentionConfig.backend", "start-up guards: no foreign --attention-backend"),
    use("vllm.config.cache:CacheConfig.prefix_caching_hash_algo", "the block hasher uses vLLM's hash function"),
    use("vllm.config.parallel:ParallelConfig.pipeline_parallel_size", "start-up guards"),
    use("vllm.config.parallel:ParallelConfig.tensor_parallel_size", "start-up guards"),
    use("vllm.config.parallel:ParallelConfig.enable_dbo", "start-up guards: records are per step"),
    use("vllm.config.model:ModelConfig.enable_prompt_embeds", "start-up guards: records come from token ids"),
    use("vllm.config.cache:CacheConfig.block_size", "start-up guards: KV offloading in entries of one block"),
    *(use(f"vllm.config.kv_transfer:KVTransferConfig.{name}", "start-up guards: only native CPU offloading")
      for name in ("kv_connector", "kv_connector_extra_config")),
    *(use(f"vllm.config.vllm:VllmConfig.{name}", "start-up guards; activation")
      for name in ("lora_config", "speculative_config", "additional_config", "attention_config",
                   "kv_transfer_config")),
    # Patched at run time.
    REQUEST_BLOCK_HASHER,
    BAD_WORDS,
    SCHEDULE,
    STEP_RECORDS,
    REQUEST_RECORDS,
    ENGINE_PLANNER,
    ENGINE_PIC,
    ENGINE_HASHER,
    CHAIN_STATE,
    SCHEDULER_SPLITS_CHUNKS,
    SCHEDULER_CHUNK_END,
    SCHEDULER_ALLOCATE_SLOTS,
    ENGINE_GAPS,
    # Gapped hits read the scheduler's KV-cache bookkeeping and request state.
    use("vllm.v1.engine.core:EngineCore.scheduler", "gapped hits: the engine's scheduler"),
    *(use(f"{_SCHED}.{name}", "gapped hits") for name in ("kv_cache_manager", "block_size")),
    *(use(f"{_KV_MANAGER}.{name}", "gapped hits: the block table and the cache lookup")
      for name in ("coordinator", "enable_caching", "create_kv_cache_blocks")),
    use("vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator.single_type_managers", "gapped hits"),
    *(use(f"vllm.v1.core.single_type_kv_cache_manager:SingleTypeKVCacheManager.{name}",
          "gapped hits: a request's blocks and how many of them are cached")
      for name in ("block_pool", "req_to_blocks", "num_cached_block")),
    use("vllm.v1.core.block_pool:BlockPool.get_cached_block", "gapped hits: is a block cached",
        ("self", "block_hash", "kv_cache_group_ids")),
    use("vllm.v1.core.block_pool:BlockPool.touch", "gapped hits: take a reference to adopted blocks",
        ("self", "blocks")),
    use("vllm.v1.core.block_pool:BlockPool.free_blocks", "gapped hits: give them back when allocation fails",
        ("self", "ordered_blocks")),
    *(use(f"vllm.v1.request:Request.{name}", "gapped hits")
      for name in ("request_id", "status", "num_computed_tokens", "skip_reading_prefix_cache", "prefill_stats",
                   "num_preemptions")),
    use("vllm.v1.request:RequestStatus.RUNNING", "gapped hits adopt runs for running requests only"),
    *(use(f"vllm.v1.metrics.stats:PrefillStats.{name}", "gapped hits: adopted tokens are reported as cached")
      for name in ("num_cached_tokens", "num_local_cached_tokens", "num_computed_tokens")),
    # Block hashing (engine core) reads vLLM's hash chain and request state.
    use(f"{KV_UTILS}:hash_block_tokens", "hash a block on a parent MiniPIC chooses",
        ("hash_function", "parent_block_hash", "curr_block_token_ids", "extra_keys")),
    use(f"{KV_UTILS}:generate_block_hash_extra_keys", "keep vLLM's extra keys (LoRA, salt, embeddings)",
        ("request", "start_token_idx", "end_token_idx", "start_mm_idx")),
    use(f"{KV_UTILS}:NONE_HASH", "the parent of an SSep block, salted like vLLM's first block"),
    use(f"{KV_UTILS}:resolve_kv_cache_block_sizes", "the hash block size", ("kv_cache_config", "vllm_config")),
    use("vllm.utils.hashing:get_hash_fn_by_name", "vLLM's configured block hash function", ("hash_fn_name",)),
    *(use(f"vllm.v1.request:Request.{name}", "read by the block hasher")
      for name in ("block_hashes", "all_token_ids", "num_prompt_tokens", "num_tokens", "cache_salt", "mm_features")),
    use("vllm.v1.engine:EngineCoreRequest.sampling_params", "where markers are banned"),
    # Position-free model: the rotation attention re-applies to moved keys, and the per-step records.
    *(use(f"{ROPE}:RotaryEmbedding.{name}", "the rotation attention re-applies to keys of reused spans")
      for name in ("cos_sin_cache", "rotary_dim", "is_neox_style")),
    # Block records: the scheduler's new blocks per step, applied by the worker before the forward.
    use(f"{_SCHED}.requests", "block records: the scheduled requests' tokens"),
    use(f"{_KV_MANAGER}.block_pool", "block records: the cache size"),
    use("vllm.v1.core.block_pool:BlockPool.num_gpu_blocks", "block records: the cache size"),
    use("vllm.v1.core.kv_cache_utils:KVCacheBlock.block_id", "block records are kept by physical block"),
    *(use(f"vllm.v1.core.sched.output:SchedulerOutput.{name}", "block records: the step's new block ids")
      for name in ("scheduled_new_reqs", "scheduled_cached_reqs")),
    use("vllm.v1.core.sched.output:SchedulerOutput.total_num_scheduled_tokens", "block records: an empty step"),
    *(use(f"vllm.v1.core.sched.output:NewRequestData.{name}", "block records")
      for name in ("req_id", "block_ids", "num_computed_tokens")),
    *(use(f"vllm.v1.core.sched.output:CachedRequestData.{name}", "block records")
      for name in ("req_ids", "new_block_ids", "num_computed_tokens")),
    wrap("vllm.v1.worker.gpu_worker:Worker.execute_model", "minipic_server.block_records:wrap_execute_model",
         "set the step's block records on the device before the forward", ("self", "scheduler_output")),
    use("vllm.v1.worker.gpu_worker:Worker.vllm_config", "block records and warm-up: is PIC active"),
    use("vllm.config.compilation:CompilationConfig.static_forward_context",
        "block records and warm-up: the attention layers"),
    # Attention backends: MiniPIC subclasses vLLM's; vLLM must keep calling these names so.
    override(f"{ATTN}:AttentionImpl.forward", "attention that moves reused spans' keys to their place", FORWARD),
    override(f"{ATTN}:AttentionMetadataBuilder.__init__", "PicMetadataBuilder",
             ("self", "kv_cache_spec", "layer_names", "vllm_config", "device")),
    override(f"{ATTN}:AttentionMetadataBuilder.build", "PicMetadataBuilder",
             ("self", "common_prefix_len", "common_attn_metadata", "fast_build")),
    override(f"{ATTN}:AttentionMetadataBuilder._cudagraph_support", "full CUDA graphs for decode"),
    *(use(f"{ATTN}:CommonAttentionMetadata.{name}", "copied into PicAttentionMetadata")
      for name in ("num_actual_tokens", "max_query_len", "max_seq_len", "query_start_loc", "seq_lens",
                   "block_table_tensor", "slot_mapping")),
    override(f"{ATTN}:AttentionBackend.supports_sliding_window", "PositionFreeBackend", ("cls",)),
    override(f"{ATTN}:AttentionBackend.supports_sink", "PositionFreeBackend", ("cls",)),
    override(f"{ATTN}:AttentionBackend.supports_attn_type", "PositionFreeBackend", ("cls", "attn_type")),
    override(f"{ATTN}:AttentionBackend.supported_kv_cache_dtypes", "PositionFreeBackend: no quantized KV"),
)

# Every entry, each release's own ones marked with their release.
TABLE: tuple[Intervention, ...] = (*COMMON, *v0_26.only_here(), *v0_32.only_here())


def entries_for(version: str) -> tuple[Intervention, ...]:
    return tuple(entry for entry in TABLE if version in entry.versions)


def install(version: str) -> None:
    """Put every start-up hook of `version` in place; repeat calls change nothing."""
    for entry in entries_for(version):
        if entry.how is How.WRAP:
            wrap_attribute(_owner(entry), entry.attribute, _load(entry.hook))
        elif entry.how is How.REGISTER:
            _load(entry.hook)()


_RUN_TIME = frozenset(id(entry) for entry in TABLE if entry.how in (How.PATCH, How.ATTACH))


def patch_instance(entry: Intervention, obj: object, value: Any) -> None:
    """Set a vLLM object's attribute that the table declares as patched or attached at run time."""
    if id(entry) not in _RUN_TIME:  # per request: identity, not a scan of the table
        raise ValueError(f"{entry.target} is not declared as a run-time patch in minipic_server.boundary.table")
    setattr(obj, entry.attribute, value)


def _owner(entry: Intervention) -> Any:
    """The class holding the target, or its module for a module-level name."""
    declared = _resolve(entry.module, entry.qualname.rpartition(".")[0])
    if not entry.on_current_platform:
        return declared
    from vllm.platforms import current_platform

    owner = type(current_platform)
    if not issubclass(owner, declared):
        raise UnsupportedVLLMError(f"vLLM's platform {owner.__name__} is not a {declared.__name__}: {entry.why}")
    return owner


def _load(reference: str | None) -> Callable[..., Any]:
    assert reference is not None
    module, _, name = reference.partition(":")
    return _resolve(module, name)


def _resolve(module: str, qualname: str) -> Any:
    value: Any = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        value = getattr(value, part)
    return value
