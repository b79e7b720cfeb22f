"""What a touch of vLLM is (`Intervention`), the constructors the tables use, and the vLLM names
more than one table refers to.

`minipic_server.boundary.table` holds the entries every supported release shares;
``v0_26`` and ``v0_32`` hold each release's own.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from minipic_server.boundary.versions import SUPPORTED_VLLM

ALL = tuple(SUPPORTED_VLLM)


class How(enum.Enum):
    WRAP = "wrapped"  # at start-up, ``Owner.attribute = hook(original)`` (`patching.wrap_attribute`)
    REGISTER = "registered"  # at start-up, ``hook()`` adds MiniPIC to this vLLM registry
    PATCH = "patched"  # at run time, set on vLLM objects through `patch_instance`
    ATTACH = "attached"  # at run time, MiniPIC's own state kept on vLLM objects under a new name
    OVERRIDE = "overridden"  # a MiniPIC subclass overrides it; vLLM must keep calling it so
    USE = "used"  # a private vLLM API MiniPIC calls or reads


@dataclass(frozen=True)
class Intervention:
    """One touch of vLLM: ``target`` is ``module:Class.attribute`` or ``module:name``.

    ``params`` are the target's parameter names (self/cls included); the contract
    tests require them exactly; ``keywords`` are the ones MiniPIC passes by name to a
    function with a long signature (each must still exist). ``hook`` is ``module:function`` for WRAP and
    REGISTER. ``on_current_platform``: wrap the attribute on the class of vLLM's
    ``current_platform`` (a subclass of the target's class), where vLLM looks it up.
    """

    how: How
    target: str
    why: str
    params: tuple[str, ...] | None = None
    hook: str | None = None
    keywords: tuple[str, ...] = ()
    versions: tuple[str, ...] = ALL
    on_current_platform: bool = False

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.target.partition(":")[2]

    @property
    def attribute(self) -> str:
        return self.qualname.rpartition(".")[2]


def wrap(target: str, hook: str, why: str, params: tuple[str, ...], **kw: Any) -> Intervention:
    return Intervention(How.WRAP, target, why, params, hook, **kw)


def register_with(target: str, hook: str, why: str, params: tuple[str, ...], **kw: Any) -> Intervention:
    return Intervention(How.REGISTER, target, why, params, hook, **kw)


def patch(target: str, why: str, params: tuple[str, ...] | None = None, **kw: Any) -> Intervention:
    return Intervention(How.PATCH, target, why, params, **kw)


def attach(target: str, why: str, **kw: Any) -> Intervention:
    return Intervention(How.ATTACH, target, why, **kw)


def override(target: str, why: str, params: tuple[str, ...] | None = None, **kw: Any) -> Intervention:
    return Intervention(How.OVERRIDE, target, why, params, **kw)


def use(target: str, why: str, params: tuple[str, ...] | None = None, **kw: Any) -> Intervention:
    return Intervention(How.USE, target, why, params, **kw)


# vLLM modules, signatures and MiniPIC hooks more than one table names.
PICK_BACKEND = "minipic_server.backend_selection:wrap_get_attn_backend_cls"
PICK_BACKEND_PARAMS = ("cls", "selected_backend", "attn_selector_config", "num_heads")
ONLINE = "vllm.renderers.online_renderer"
SALT_POLICY = "minipic_server.salt_policy:wrap_render"
SALT_WHY = "minipic.require_cache_salt: a request without a cache salt gets a 400 before it is rendered"
ATTN = "vllm.v1.attention.backend"
CPU_ATTN = "vllm.v1.attention.backends.cpu_attn"
TRITON_ATTN = "vllm.v1.attention.backends.triton_attn"
KV_UTILS = "vllm.v1.core.kv_cache_utils"
ROPE = "vllm.model_executor.layers.rotary_embedding.base"
FORWARD = ("self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output", "output_scale",
           "output_block_scale")
IMPL_ARGS = ("self", "num_heads", "head_size", "scale", "num_kv_heads", "alibi_slopes", "sliding_window",
             "kv_cache_dtype", "logits_soft_cap", "attn_type", "kv_sharing_target_layer_name", "sinks")

