"""Route attention to MiniPIC's backends while PIC is active, and refuse any other choice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minipic_server.boundary import current_platform, get_current_vllm_config
from minipic_server.config import MiniPICConfigError, pic_enabled
from minipic_server.guards import check_attention_backend

CPU_BACKEND = "minipic_server.backends.cpu.PicCpuAttentionBackend"
CUDA_BACKEND = "minipic_server.backends.cuda.PicTritonAttentionBackend"


def backend_for_platform() -> str:
    if current_platform.is_cpu():
        return CPU_BACKEND
    if current_platform.is_cuda():
        return CUDA_BACKEND
    raise MiniPICConfigError(f"MiniPIC has no attention backend for {current_platform.device_name}")


def register_cuda_backend() -> None:
    from minipic_server.boundary import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, CUDA_BACKEND)


def wrap_get_attn_backend_cls(original: Callable[..., str]) -> Callable[..., str]:
    def get_attn_backend_cls(selected_backend: Any, *args: Any, **kwargs: Any) -> str:
        if not pic_enabled(get_current_vllm_config()):
            return original(selected_backend, *args, **kwargs)
        check_attention_backend(selected_backend)
        return backend_for_platform()

    return get_attn_backend_cls
