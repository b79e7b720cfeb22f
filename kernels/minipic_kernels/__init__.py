"""Attention kernels for position-independent caching.

Keys live in the paged KV cache *unrotated*; attention rotates each key by its
index in the current request and restricts each query row to its span window.
`reference` is the readable torch definition of that contract (and the CPU
path); `triton_attention` is the GPU implementation of the same contract.
"""

from minipic_kernels.block_kinds import BlockKind, window_starts_per_block
from minipic_kernels.reference import paged_rope_attention_reference, rotate

__all__ = [
    "BlockKind",
    "paged_rope_attention_reference",
    "rotate",
    "window_starts_per_block",
]
