"""Name the arguments vLLM passes to an attention impl, and refuse any MiniPIC cannot honour.

vLLM's attention layer calls ``impl_cls(num_heads, head_size, ..., **extra)``
positionally, and releases add arguments (0.26: ``use_alibi_sqrt``,
``chunk_lookback``). Binding them by the stock impl's own signature names each
one correctly in every release; an argument MiniPIC has never heard of is refused
instead of silently ignored, and the contract tests require every supported
release's signature to be covered here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from minipic_server.backends.common import refuse_unsupported_features
from minipic_server.config import MiniPICConfigError

# The layer's shape: taken as given.
SHAPE_ARGS = frozenset({"num_heads", "head_size", "scale", "num_kv_heads"})
# Features the position-free kernels lack; `refuse_unsupported_features` accepts only their neutral values.
FEATURE_ARGS = frozenset(
    {"alibi_slopes", "sliding_window", "logits_soft_cap", "attn_type", "kv_sharing_target_layer_name", "sinks",
     "kv_cache_dtype"}
)
# Refinements of the features above: only their neutral value is accepted.
NEUTRAL_ARGS: Mapping[str, Any] = {"use_alibi_sqrt": False, "chunk_lookback": -1}
KNOWN_ARGS = SHAPE_ARGS | FEATURE_ARGS | NEUTRAL_ARGS.keys()


def bind_impl_args(stock_init: Callable[..., None], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor arguments by name, as `stock_init` (the vLLM impl's ``__init__``) binds them.

    Raises `MiniPICConfigError` for arguments the signature does not take, arguments
    MiniPIC does not know, and features it cannot honour.
    """
    owner = stock_init.__qualname__
    try:
        bound = inspect.signature(stock_init).bind(None, *args, **kwargs)
    except TypeError as exc:
        raise MiniPICConfigError(f"vLLM passed {owner} arguments it does not take: {exc}") from None
    named = dict(bound.arguments)
    named.pop(next(iter(inspect.signature(stock_init).parameters)))  # self
    unknown = sorted(set(named) - KNOWN_ARGS)
    if unknown:
        raise MiniPICConfigError(
            f"vLLM passes {unknown} to {owner}, which MiniPIC does not know: this vLLM release is not "
            "supported (see minipic_server.boundary)"
        )
    changed = sorted(name for name, neutral in NEUTRAL_ARGS.items() if name in named and named[name] != neutral)
    if changed:
        raise MiniPICConfigError(
            "MiniPIC attention does not support " + ", ".join(f"{name}={named[name]!r}" for name in changed)
        )
    refuse_unsupported_features(**{name: named[name] for name in FEATURE_ARGS & named.keys()})
    return named
