"""Compile MiniPIC's attention kernels while the server starts, not while it serves.

vLLM warms its own kernels up in ``Worker.compile_or_warm_up_model`` and then activates
its JIT monitor, which reports any later compilation as a latency spike. MiniPIC runs
`minipic_kernels.warmup.warm_up` first in that method, once per distinct attention layer
shape, so every kernel variant a step can dispatch to is compiled (and cached on disk)
before the server says it is ready.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minipic_server.config import pic_enabled


def wrap_compile_or_warm_up_model(original: Callable[..., Any]) -> Callable[..., Any]:
    """The CUDA worker's warm-up hook (`minipic_server.boundary`; the CPU path has no Triton)."""

    def compile_or_warm_up_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        if pic_enabled(self.vllm_config):
            warm_up_attention(self.vllm_config)
        return original(self, *args, **kwargs)

    return compile_or_warm_up_model


@torch.inference_mode()
def warm_up_attention(vllm_config: Any) -> None:
    """Run the kernel warm-up for every distinct MiniPIC attention layer of the model."""
    from minipic_kernels.warmup import LayerShape, warm_up
    from minipic_server.backends.cuda import PicTritonAttentionImpl

    block_size = vllm_config.cache_config.block_size
    table_width = -(-vllm_config.model_config.max_model_len // block_size)
    done: set[LayerShape] = set()
    for layer in vllm_config.compilation_config.static_forward_context.values():
        impl = getattr(layer, "impl", None)
        if not isinstance(impl, PicTritonAttentionImpl) or impl.pic_rope is None:
            continue
        kv_cache = getattr(layer, "kv_cache", None)
        if isinstance(kv_cache, torch.Tensor) and kv_cache.dim() == 4:
            block_size = kv_cache.shape[2]  # (blocks, kv heads, block size, 2 * head size)
            if impl.pic_records is not None:  # before any CUDA graph is captured over them
                impl.pic_records.ensure(kv_cache.shape[0])
        shape = LayerShape(
            num_q_heads=impl.num_heads,
            num_kv_heads=impl.num_kv_heads,
            head_size=impl.head_size,
            block_size=block_size,
            dtype=vllm_config.model_config.dtype,
            rotary_dim=impl.pic_rope.rotary_dim,
            is_neox=impl.pic_rope.is_neox,
        )
        if shape in done:
            continue
        done.add(shape)
        impl.ensure_paged_attention(shape.dtype)
        impl.pic_rope.unit_cos_sin_in(shape.dtype)  # the table attention reads, made before graph capture
        compact = impl.pic_records is not None and impl.pic_records.compact
        warm_up(shape, impl.pic_rope.unit_cos_sin, impl.scale, impl.paged_attention, table_width=table_width,
                compact=compact)  # fmt: skip
    torch.cuda.synchronize()
