"""Torch reference for paged attention over position-stamped keys with span windows.

This is the contract every MiniPIC attention kernel implements, written for
clarity rather than speed. vLLM's CPU path uses it directly; the Triton kernels
are tested against it.

Conventions (shared with the Triton kernels):
- ``query``: ``(num_tokens, num_q_heads, head_size)``, already rotated by the model
  at its position (the position of query token ``i`` of request ``r`` is
  ``seq_lens[r] - query_len[r] + i``).
- ``key_cache`` / ``value_cache``: ``(num_blocks, block_size, num_kv_heads,
  head_size)``, any strides (vLLM hands out strided views of one packed tensor).
  Keys are stored as the model rotated them at their block's *origin*: where they were
  computed, exactly as stock vLLM stores them, except a block computed ``write_shift``
  blocks past its origin, whose keys `write_kv_reference` rotates back by that much.
- ``block_origin``: ``(num_physical_blocks,)`` int32, the logical block index at which
  each physical block's keys are stored (`minipic_kernels.block_origins`). A block
  read at its origin (a plain prompt, a prefix hit, a request's own earlier chunks) is
  attended as it is; a block placed elsewhere (a cached span reused after another
  prefix) has its keys rotated by ``(b - block_origin[block]) * block_size``.
- ``cos_sin``: ``(max_positions, rotary_dim)`` float32, ``cat(cos, sin)`` halves,
  the same layout as vLLM's ``cos_sin_cache``, applied as a pure rotation
  (`unit_rotation_table`): ``R(d) . R_model(o) == R_model(o + d)``.
- A query at position ``p`` in logical block ``p // block_size`` attends keys
  ``window_start .. p`` (``window_start`` is `block_kinds.OUTSIDE_SPANS` outside every
  span), except the keys of hidden (HSep) blocks other than its own span's head
  (`block_kinds.visible`).
- ``span_bias`` (a server's ``--span-bias``, natural-log units) is added to the logit of every
  key inside a span read by a row outside every span (`block_kinds.weighed_by_span_bias`):
  the span's softmax weight times ``e^span_bias``.
"""

from __future__ import annotations

import torch

from minipic_kernels.block_kinds import hidden_per_block, visible, weighed_by_span_bias, window_starts_per_block
from minipic_kernels.block_origins import key_shifts
from minipic_kernels.compact_shifts import read_keys


def rotate(
    x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, rotary_dim: int, is_neox: bool
) -> torch.Tensor:
    """Apply RoPE to ``x`` ``(tokens, heads, head_size)`` at ``positions`` (negative ones
    rotate backwards); returns float32."""
    positions = positions.long()
    cos, sin = cos_sin.index_select(0, positions.abs()).float().chunk(2, dim=-1)
    sin = torch.where(positions[:, None] < 0, -sin, sin)
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
    write_shift: torch.Tensor,
    cos_sin: torch.Tensor,
    rotary_dim: int,
    is_neox: bool,
) -> None:
    """Store a step's keys and values; slot -1 is padding. A key whose block has a write
    shift ``s`` (``write_shift``: int32 per physical block, in blocks) is rotated by
    ``-s * block_size`` positions first, so the block holds its keys at its origin.

    ``key``/``value``: ``(num_tokens, num_kv_heads, head_size)``; rows past
    ``slot_mapping``'s length are ignored.
    """
    num_tokens = min(slot_mapping.shape[0], key.shape[0])
    slots = slot_mapping[:num_tokens]
    valid = slots >= 0
    slots = slots[valid].long()
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    keys = key[:num_tokens][valid]
    shifts = write_shift[blocks].long() * block_size
    moved = shifts != 0
    if bool(moved.any()):
        keys = keys.clone()
        keys[moved] = rotate(keys[moved], -shifts[moved], cos_sin, rotary_dim, is_neox).to(keys.dtype)
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
    block_origin: torch.Tensor,
    cos_sin: torch.Tensor,
    rotary_dim: int,
    is_neox: bool,
    scale: float,
    output: torch.Tensor | None = None,
    *,
    window_starts: torch.Tensor | None = None,
    key_shift: torch.Tensor | None = None,
    unread: tuple[torch.Tensor, torch.Tensor] | None = None,
    query_shift: torch.Tensor | None = None,
    span_bias: float = 0.0,
) -> torch.Tensor:
    """Attention of each request's query rows over its paged keys, each block moved from
    its origin to where this request places it.

    ``window_starts`` (from `window_starts_per_block`) and ``key_shift`` (per request and
    logical block, `StepTensors.key_shift`) may be passed when the caller already derived
    them for this step. In the compact reading (`compact_shifts`) ``key_shift`` and
    ``query_shift`` (`StepTensors`) are required: each query row is rotated back by its
    block's shift (in ``query.dtype``, as the Triton kernels round it) and ``unread`` (the
    ``(unread_head, unread_tail)`` records) hides unread keys from every read row. An unread
    row's result is unspecified but finite (no read row sees it: `compact_shifts.read_keys`);
    here it reads causally, one valid choice, so kernels are compared with this on read rows only.
    Returns ``output`` (allocated like ``query`` when not given) holding
    ``(num_tokens, num_q_heads, head_size)`` results in ``query.dtype``.
    """
    if (unread is None) != (query_shift is None):
        raise ValueError("the compact reading takes both the unread records and the query shifts")
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
    shifts = key_shift if key_shift is not None else key_shifts(block_table, block_origin, block_size)
    hidden = hidden_per_block(block_table, block_kind)
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
        keys = rotate(keys, shifts[r, key_positions // block_size], cos_sin, rotary_dim, is_neox)
        q_positions = torch.arange(seq_len - (q_end - q_begin), seq_len, device=query.device)
        window = windows[r, q_positions // block_size]
        key_hidden = hidden[r, key_positions // block_size]
        allowed = visible(
            q_positions[:, None], window[:, None], key_positions[None, :], key_hidden[None, :], block_size
        )
        if unread is not None:
            key_blocks = blocks[key_positions // block_size]
            read = read_keys(key_positions % block_size, unread[0][key_blocks], unread[1][key_blocks], block_size)
            allowed &= read[None, :] | ~read[q_positions][:, None]
        q = query[q_begin:q_end]
        if query_shift is not None:
            q = rotate(q, -query_shift[q_begin:q_end], cos_sin, rotary_dim, is_neox).to(query.dtype)
        q = q.float().transpose(0, 1)  # (Hq, Lq, D)
        k = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # (Hq, Lk, D)
        v = values.float().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = torch.matmul(q, k.transpose(1, 2)) * scale
        if span_bias:
            weighed = weighed_by_span_bias(window[:, None], windows[r, key_positions // block_size][None, :])
            scores = scores + span_bias * weighed
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
    query_used: torch.Tensor,
    seq_used: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    out: torch.Tensor,
) -> None:
    """What a stock paged causal kernel computes over keys at their positions
    (FlashAttention-3's paged varlen call with ``seqused_q``): `attention.PagedAttention`,
    for tests. Rows of requests with ``query_used == 0`` are left untouched; a row placed before
    every key (``query_used > seq_used``) sees none and gets 0, as FlashAttention gives it.
    """
    block_size, num_kv_heads = key_pages.shape[1], key_pages.shape[2]
    group = query.shape[1] // num_kv_heads
    starts = query_start_loc.tolist()
    for r, (used, seq_len) in enumerate(zip(query_used.tolist(), seq_used.tolist())):
        q_begin, q_end = starts[r], starts[r] + used
        if q_end == q_begin:
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
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row without keys: 0
        out[q_begin:q_end] = torch.matmul(probs, v).transpose(0, 1).to(out.dtype)
