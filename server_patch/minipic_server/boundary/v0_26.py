"""What differs in vLLM 0.26 (CUDA): its own hooks and private APIs (`ENTRIES`), the KV-cache
shape API, and FlashAttention-3 called directly.

Imports are inside the functions: the contract tests read this module on any release.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from minipic_server.boundary.interventions import (
    ATTN,
    IMPL_ARGS,
    PICK_BACKEND,
    PICK_BACKEND_PARAMS,
    TRITON_ATTN,
    Intervention,
    override,
    register_with,
    use,
    wrap,
)

PLATFORM = "cuda"

# `_vllm_fa3_C::fwd`'s arguments as `backends.cuda._fa3_paged_attention` passes them, in order
# (as vLLM 0.26's `flash_attn_varlen_func` does, plus ``seqused_q``). Checked against the
# op's schema at start-up (`fa3_forward`).
FA3_FWD_ARGUMENTS = (
    "q", "k", "v", "k_new", "v_new", "q_v", "out", "cu_seqlens_q", "cu_seqlens_k", "cu_seqlens_k_new",
    "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k", "page_table", "kv_batch_idx", "leftpad_k",
    "rotary_cos", "rotary_sin", "seqlens_rotary", "q_descale", "k_descale", "v_descale", "softmax_scale",
    "is_causal", "window_size_left", "window_size_right", "softcap", "is_rotary_interleaved",
    "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin", "s_aux", "cp_world_size", "cp_rank",
    "cp_tot_seqused_k",
)  # fmt: skip


def kv_cache_shape(spec: Any, num_blocks: int) -> tuple[int, ...]:
    """The per-layer KV-cache shape vLLM allocates for MiniPIC's CUDA backend (a TRITON_ATTN subclass)."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    return tuple(
        TritonAttentionBackend.get_kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
    )


def fa3_forward(head_size: int) -> Callable[..., Any] | None:
    """vLLM's FlashAttention-3 forward op, its schema checked, or None where FA3 cannot run this head size."""
    import torch
    from vllm.v1.attention.backends.fa_utils import get_flash_attn_version, is_flash_attn_varlen_func_available

    from minipic_server.boundary.checks import check_op_arguments

    if not is_flash_attn_varlen_func_available() or get_flash_attn_version(head_size=head_size) != 3:
        return None
    from vllm.vllm_flash_attn import flash_attn_interface  # noqa: F401 - loads FA3's op library

    try:
        op = torch.ops._vllm_fa3_C.fwd
    except (AttributeError, RuntimeError):  # built without FA3
        return None
    check_op_arguments(str(op.default._schema), FA3_FWD_ARGUMENTS)
    return op


def stock_cache_write() -> Callable[..., Any]:
    """vLLM's CUDA cache write (``reshape_and_cache_flash``): it fills MiniPIC's strided K/V views
    exactly as `minipic_kernels.kv_write.write_kv` does for blocks written at their origin
    (`benchmarks/attention_kernel.py --sections dispatch`), at a quarter of its host time."""
    from vllm import _custom_ops

    return _custom_ops.reshape_and_cache_flash


def only_here() -> tuple[Intervention, ...]:
    """This release's own entries of the boundary table, marked with the release."""
    return tuple(replace(entry, versions=(VERSION,)) for entry in ENTRIES)


VERSION = "0.26"
# Hooks, overrides and private APIs only this release has (the shared ones: `boundary.table`).
ENTRIES: tuple[Intervention, ...] = (
    wrap("vllm.platforms.cuda:CudaPlatformBase.get_attn_backend_cls", PICK_BACKEND,
         "route attention to MiniPIC's CUDA backend while PIC is active, refuse other choices",
         PICK_BACKEND_PARAMS, on_current_platform=True),
    wrap("vllm.v1.worker.gpu_worker:Worker.compile_or_warm_up_model",
         "minipic_server.warmup_hook:wrap_compile_or_warm_up_model",
         "compile MiniPIC's attention kernels at start-up, before vLLM's JIT monitor starts", ("self",)),
    use("vllm.model_executor.layers.attention.attention:Attention.kv_cache", "warm-up: the layer's block size"),
    register_with("vllm.v1.attention.backends.registry:register_backend",
                  "minipic_server.backend_selection:register_cuda_backend",
                  "the CUDA backend reports itself as CUSTOM; vLLM maps that name back through the registry",
                  ("backend", "class_path", "is_mamba")),
    wrap("vllm.v1.worker.gpu.model_runner:GPUModelRunner.update_requests",
         "minipic_server.gapped_hits:wrap_update_requests",
         "copy a prefilling request's computed count to the device, where the V2 runner otherwise only adds "
         "each step's tokens (gapped hits move it past adopted runs)", ("self", "scheduler_output")),
    *(use(f"vllm.v1.worker.gpu.states:RequestState.{name}", "gapped hits: the device-side computed count")
      for name in ("req_id_to_index", "prefill_len", "num_computed_tokens")),
    *(use(f"vllm.v1.worker.gpu.model_runner:GPUModelRunner.{name}", "gapped hits")
      for name in ("vllm_config", "req_states")),
    wrap("vllm.v1.worker.gpu.buffer_utils:async_tensor_h2d", "minipic_server.token_staging:wrap_async_tensor_h2d",
         "the V2 runner stages a new request's token ids through numpy (torch.tensor took 100 ns a token)",
         ("data", "device", "dtype")),
    wrap("vllm.v1.worker.gpu.model_runner:GPUModelRunner.add_requests",
         "minipic_server.token_staging:wrap_add_requests",
         "a new request's cached prompt tokens are not staged for the device where nothing there reads them; "
         "relies on RequestState.add_request staging NewRequestData.prefill_token_ids itself, from 0",
         ("self", "scheduler_output")),
    use("vllm.v1.worker.gpu.sample.penalties:use_penalty", "penalties read the whole prompt on the device",
        ("sampling_params",)),
    use("vllm.v1.worker.gpu.buffer_utils:StagedWriteTensor.stage_write", "token ids staged past the cached head",
        ("self", "index", "start", "x")),
    use("vllm.v1.worker.gpu.states:RequestState.all_token_ids", "the device's token table"),
    *(use(f"vllm.v1.core.sched.output:NewRequestData.{name}", "whether anything reads a new request's cached tokens")
      for name in ("prefill_token_ids", "prompt_token_ids", "sampling_params", "mm_features")),
    use("vllm.v1.core.sched.output:CachedRequestData.num_computed_tokens",
        "gapped hits (the step's cached requests and their ids: shared entries, `table`)"),
    *(override(f"{TRITON_ATTN}:TritonAttentionBackend.{name}", "PicTritonAttentionBackend", ())
      for name in ("get_name", "get_impl_cls", "get_builder_cls")),
    override(f"{TRITON_ATTN}:TritonAttentionBackend.get_kv_cache_stride_order",
             "PicTritonAttentionBackend keeps NHD pages when CPU offloading asks for HND",
             ("include_num_layers_dimension",)),
    override(f"{TRITON_ATTN}:TritonAttentionImpl.__init__",
             "PicTritonAttentionImpl binds these by name (`impl_args`) and refuses what it cannot honour",
             (*IMPL_ARGS, "use_alibi_sqrt", "chunk_lookback")),
    *(use(f"{ATTN}:CommonAttentionMetadata.{name}", "the CUDA builder's step plan")
      for name in ("query_start_loc_cpu", "seq_lens_cpu_upper_bound", "num_reqs")),
    *(use(f"vllm.v1.kv_cache_interface:AttentionSpec.{name}", "the CUDA builder's step plan")
      for name in ("page_size_bytes", "num_kv_heads", "head_size")),
    use("vllm.config.model:ModelConfig.get_num_attention_heads", "the CUDA builder's step plan",
        keywords=("parallel_config",)),
    use("vllm.v1.attention.backends.fa_utils:is_flash_attn_varlen_func_available",
        "window-free prefill runs on vLLM's FlashAttention when it is there", ()),
    use("vllm.v1.attention.backends.fa_utils:get_flash_attn_version", "which FlashAttention",
        keywords=("head_size",)),
    use("vllm.vllm_flash_attn.flash_attn_interface:flash_attn_varlen_func",
        "window-free prefill calls the FA3 op this function calls (`torch.ops._vllm_fa3_C.fwd`), in its "
        "argument order, adding seqused_q (`backends.cuda._fa3_paged_attention`): re-check that order here",
        ("q", "k", "v", "max_seqlen_q", "cu_seqlens_q", "max_seqlen_k", "cu_seqlens_k", "seqused_k", "q_v",
         "dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes", "deterministic",
         "return_attn_probs", "block_table", "return_softmax_lse", "out", "scheduler_metadata", "q_descale",
         "k_descale", "v_descale", "num_splits", "output_scale", "fa_version", "s_aux", "cp_world_size", "cp_rank",
         "cp_tot_seqused_k", "mask_mod", "aux_tensors", "dynamic_causal")),
    override(f"{TRITON_ATTN}:TritonAttentionImpl.do_kv_cache_update",
             "PicTritonAttentionImpl writes the cache with its own warmed-up kernel",
             ("self", "layer", "key", "value", "kv_cache", "slot_mapping")),
    use("vllm._custom_ops:reshape_and_cache_flash",
        "an eager step with no block stored away from where it is computed writes the cache with vLLM's CUDA "
        "write (`stock_cache_write`)",
        ("key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype", "k_scale", "v_scale")),
    override(f"{TRITON_ATTN}:TritonAttentionImpl.fused_rope_kvcache_supported",
             "PicTritonAttentionImpl says no: it writes the cache itself", ("self",)),
)  # fmt: skip
