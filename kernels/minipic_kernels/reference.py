"""Torch reference for paged attention over block-relative keys with span windows.

This is the contract every MiniPIC attention kernel implements, written for
clarity rather than speed. vLLM's CPU path uses it directly; the Triton kernels
are tested against it.

Conventions (shared with the Triton kernels):
- ``query``: ``(num_tokens, num_q_heads, head_size)``, already rotated by the model
  at its position (the position of query token ``i`` of request ``r`` is
  ``seq_lens[r] - query_len[r] + i``).
- ``key_cache`` / ``value_cache``: ``(num_blocks, block_size, num_kv_heads,
  head_size)``, any strides (vLLM hands out strided views of one packed tensor).
  Keys are *block-relative*: `write_kv_reference` stores each key rotated by its slot
  in its block (``position % block_size``), by the model's own table. A block's keys
  thus depend on its tokens only, never on where the block sits in a prompt, and
  blocks always start at multiples of ``block_size``.
- ``cos_sin``: ``(max_positions, rotary_dim)`` float32, ``cat(cos, sin)`` halves,
  the same layout as vLLM's ``cos_sin_cache``. The attention side applies it as a pure
  rotation (`unit_rotation_table`), the write side as the model does (scaled tables too):
  ``R(b) . R_model(j - b) == R_model(j)``.
- Key ``j`` of a request is rotated by its block's first position ``j - j % block_size``;
  a query at position ``p`` in logical block ``p // block_size`` attends keys
  ``window_start .. p``.
"""

from __future__ import annotations

import torch

from minipic_kernels.block_kinds import window_starts_per_block


def rotate(
    x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, rotary_dim: int, is_neox: bool
) -> torch.Tensor:
    """Apply RoPE to ``x`` ``(tokens, heads, head_size)`` at ``positions``; returns float32."""
    cos, sin = cos_sin.index_select(0, positions.long()).float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    x = x.float()
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if is_neox:
        x1, x2 = rot.chunk(2, dim=-1)
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((rotated, rest), dim=-1)


def unit_rotation_table(cos_sin: torch.Tensor) -> torch.Tensor:
    """The table with each (cos, sin) pair scaled to length 1: the rotation alone, without
    the magnitude some rotary variants (YaRN) fold into their tables."""
    cos, sin = cos_sin.float().chunk(2, dim=-1)
    norm = torch.sqrt(cos * cos + sin * sin)
    return torch.cat((cos / norm, sin / norm), dim=-1).contiguous()


def write_kv_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    cos_sin: torch.Tensor,
    rotary_dim: int,
    is_neox: bool,
) -> None:
    """Store a step's keys (rotated by their slot in the block) and values; slot -1 is padding.

    ``key``/``value``: ``(num_tokens, num_kv_heads, head_size)``, unrotated keys; rows past
    ``slot_mapping``'s length are ignored.
    """
    num_tokens = min(slot_mapping.shape[0], key.shape[0])
    slots = slot_mapping[:num_tokens]
    valid = slots >= 0
    slots = slots[valid].long()
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    keys = rotate(key[:num_tokens][valid], offsets, cos_sin, rotary_dim, is_neox)
    key_cache[blocks, offsets] = keys.to(key_cache.dtype)
    value_cache[blocks, offsets] = value[:num_tokens][valid].to(value_cache.dtype)


def paged_rope_attention_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_kind: torch.Tensor,
    cos_sin: torch.Tensor,
    rotary_dim: int,
    is_neox: bool,
    scale: float,
    output: torch.Tensor | None = None,
    *,
    window_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of each request's query rows over its paged, block-relative keys.

    ``window_starts`` (from `window_starts_per_block`) may be passed when the
    caller already derived them for this step. Returns ``output`` (allocated like
    ``query`` when not given) holding ``(num_tokens, num_q_heads, head_size)``
    results in ``query.dtype``.
    """
    if output is None:
        output = torch.empty_like(query)
    block_size = key_cache.shape[1]
    num_q_heads, num_kv_heads = query.shape[1], key_cache.shape[2]
    group = num_q_heads // num_kv_heads
    windows = (
        window_starts
        if window_starts is not None
        else window_starts_per_block(block_table, block_kind, block_size)
    )
    starts = query_start_loc.tolist()
    for r, seq_len in enumerate(seq_lens.tolist()):
        q_begin, q_end = starts[r], starts[r + 1]
        if q_end == q_begin:
            continue
        num_blocks = -(-seq_len // block_size)
        blocks = block_table[r, :num_blocks].long()
        keys = key_cache[blocks].reshape(-1, num_kv_heads, key_cache.shape[-1])[:seq_len]
        values = value_cache[blocks].reshape(-1, num_kv_heads, value_cache.shape[-1])[:seq_len]
        key_positions = torch.arange(seq_len, device=query.device)
        keys = rotate(keys, key_positions - key_positions % block_size, cos_sin, rotary_dim, is_neox)
        q_positions = torch.arange(seq_len - (q_end - q_begin), seq_len, device=query.device)
        window = windows[r, q_positions // block_size]
        allowed = (key_positions[None, :] <= q_positions[:, None]) & (
            key_positions[None, :] >= window[:, None]
        )
        q = query[q_begin:q_end].float().transpose(0, 1)  # (Hq, Lq, D)
        k = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # (Hq, Lk, D)
        v = values.float().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = torch.matmul(q, k.transpose(1, 2)) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        output[q_begin:q_end] = torch.matmul(probs, v).transpose(0, 1).to(output.dtype)
    return output


def paged_causal_attention_reference(
    query: torch.Tensor,
    key_pages: torch.Tensor,
    value_pages: torch.Tensor,
    page_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_used: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    out: torch.Tensor,
) -> None:
    """What a stock paged causal kernel computes over *rotated* keys (FlashAttention's
    paged varlen call): `minipic_kernels.attention.PagedAttention`, for tests.

    Requests with ``seq_used == 0`` are written with zeros, as FlashAttention does.
    """
    block_size, num_kv_heads = key_pages.shape[1], key_pages.shape[2]
    group = query.shape[1] // num_kv_heads
    starts = query_start_loc.tolist()
    for r, seq_len in enumerate(seq_used.tolist()):
        q_begin, q_end = starts[r], starts[r + 1]
        if q_end == q_begin:
            continue
        if seq_len == 0:
            out[q_begin:q_end] = 0
            continue
        pages = page_table[r, : -(-seq_len // block_size)].long()
        keys = key_pages[pages].reshape(-1, num_kv_heads, key_pages.shape[-1])[:seq_len].float()
        values = value_pages[pages].reshape(-1, num_kv_heads, value_pages.shape[-1])[:seq_len].float()
        q_positions = torch.arange(seq_len - (q_end - q_begin), seq_len, device=query.device)
        allowed = torch.arange(seq_len, device=query.device)[None, :] <= q_positions[:, None]
        q = query[q_begin:q_end].float().transpose(0, 1)
        k = keys.repeat_interleave(group, dim=1).transpose(0, 1)
        v = values.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = (torch.matmul(q, k.transpose(1, 2)) * scale).masked_fill(~allowed, float("-inf"))
        out[q_begin:q_end] = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(0, 1).to(out.dtype)
