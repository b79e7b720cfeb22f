"""Attention kernels for position-independent caching.

Keys live in the paged KV cache as the model rotated them where they were computed, and
each block records that place (its origin); attention moves the keys of a block read
elsewhere (a reused span) by the distance between the two places and restricts each
query row to its span window.
`reference` is the readable torch definition of that contract (and the CPU
path); `triton_attention` is the GPU implementation of the same contract.
"""

from minipic_kernels.block_kinds import BlockKind, window_starts_per_block
from minipic_kernels.reference import (
    paged_rope_attention_reference,
    rotate,
    unit_rotation_table,
    write_kv_reference,
)

__all__ = [
    "BlockKind",
    "paged_rope_attention_reference",
    "rotate",
    "unit_rotation_table",
    "window_starts_per_block",
    "write_kv_reference",
]
