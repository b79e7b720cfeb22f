"""Start-up checks of what MiniPIC's kernels assume about vLLM's data, beyond names and signatures.

A vLLM release can keep every name and signature the table declares and still change
what flows through them: the KV-cache tensor's shape, or the positional arguments of
the FlashAttention-3 op MiniPIC calls directly. Either would give wrong answers, not
errors, so the backend checks both once when it initialises and refuses in one line.
"""

from __future__ import annotations

import re

from minipic_server.config import MiniPICConfigError


def assumed_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
    """The per-layer cache shape MiniPIC's backends take apart (`backends.common.split_kv_cache`):
    K and V side by side in the last dimension, giving key and value views of
    ``(num_blocks, block_size, num_kv_heads, head_size)``, the order the kernels index."""
    return (num_blocks, num_kv_heads, block_size, 2 * head_size)


def check_kv_cache_shape(shape: tuple[int, ...], block_size: int, num_kv_heads: int, head_size: int) -> None:
    """Refuse a KV-cache layout other than `assumed_kv_cache_shape`; ``shape`` is vLLM's, for
    any number of blocks."""
    expected = assumed_kv_cache_shape(shape[0] if shape else 0, block_size, num_kv_heads, head_size)
    if tuple(shape) != expected:
        raise MiniPICConfigError(
            f"this vLLM lays out the KV cache as {tuple(shape)}, MiniPIC's kernels index "
            f"(num_blocks, num_kv_heads, block_size, 2*head_size) = {expected}: update minipic_server.boundary "
            "for this vLLM release"
        )


def schema_argument_names(schema: str) -> tuple[str, ...]:
    """The argument names of a torch operator schema, in order
    (``ns::op(Tensor q, Tensor? k=None, *, int n=0) -> Tensor[]`` gives ``q, k, n``)."""
    arguments = schema[schema.index("(") + 1 : schema.rindex(") ->")]
    names = []
    for argument in re.split(r",\s*(?![^()\[\]]*[)\]])", arguments):
        declaration = argument.split("=", 1)[0].strip()
        if declaration and declaration != "*":
            names.append(declaration.split()[-1])
    return tuple(names)


def check_op_arguments(schema: str, passed: tuple[str, ...]) -> None:
    """Refuse an operator whose positional arguments are not, by name and order, the ones MiniPIC passes."""
    names = schema_argument_names(schema)
    if names != passed:
        differ = next((i for i, pair in enumerate(zip(names, passed)) if pair[0] != pair[1]), min(len(names),
                                                                                                  len(passed)))
        raise MiniPICConfigError(
            f"the operator {schema.split('(', 1)[0]} takes {len(names)} arguments, MiniPIC passes {len(passed)}; "
            f"first difference at position {differ}: the operator's "
            f"{names[differ] if differ < len(names) else 'nothing'}, MiniPIC's "
            f"{passed[differ] if differ < len(passed) else 'nothing'}: update minipic_server.boundary for this "
            "vLLM release"
        )
