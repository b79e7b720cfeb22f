"""Triton paged attention over unrotated keys with span windows.

Implements exactly the contract of `minipic_kernels.reference.paged_rope_attention_reference`:
keys sit in vLLM's paged KV cache *unrotated*; each key tile is rotated (RoPE) by its
index in the current request while it is in registers, and each query row attends only
to keys in ``[window_start(p), p]``.

Design (one kernel body, two launch shapes):

* Query rows are *packed by GQA group*: a tile of ``BLOCK_M`` rows holds ``BLOCK_Q``
  query tokens times ``GROUP_P`` query heads that share one kv head, so every key/value
  tile is loaded and rotated once per kv head rather than once per query head.
* The rotary part of ``q . k`` is computed as two dots over the halves (neox) or the
  even/odd lanes (gptj): ``q1 . (k1 c - k2 s) + q2 . (k2 c + k1 s)`` (plus one dot over
  the pass-through lanes for a partial ``rotary_dim``), so no lane shuffles are needed.
* The key range of a query tile is ``[min window start, last query position]``: tiles
  wholly below every row's window or above the causal limit are never visited (a prompt
  of independent spans costs time linear in the number of spans). Inside that range the
  tiles that no row masks run a mask-free loop; only the edges apply the mask.
* Prefill launch: grid ``(query tiles, kv heads, key splits)``; the tile -> request
  mapping is a binary search over ``query_start_loc`` inside the kernel, so the grid size
  is an upper bound computed from Python ints (no host sync, CUDA-graph safe).
* Decode launch: one tile per request (requests with at most ``BLOCK_Q`` query tokens),
  the key range split across ``num_splits`` programs whose partial softmax states a
  second small kernel merges (flash-decoding).
* Prefill batches of >= 2048 tokens first rotate the keys of their prefill-path requests
  once into scratch pages (`_prepass_for_prefill`, ~80 us for 32k tokens on an H200) and
  run the same tile kernel with rotation compiled out (``ROT_HALF == 0``): rotating in
  the kernel costs every query tile the rotation of every key tile again. Smaller
  batches, decode rows, and batches whose scratch would exceed the budget rotate in the
  kernel. For 16-bit inputs the kernel reads an fp16 copy of an fp32 cos/sin table
  (`_kernel_cos_sin`).

Configurations come from a small fixed list per path, tuned once per shape class on the
first batch that exercises the path and cached in-process (never while a CUDA graph is
being captured; ``MINIPIC_ATTN_AUTOTUNE=0`` always uses the first, default config).
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl

from minipic_kernels.block_kinds import window_starts_per_block

__all__ = [
    "AttentionConfig",
    "paged_rope_attention",
    "rotate_kv_to_dense_pages",
]

_LOG2E = 1.4426950408889634
# Initial running max: finite, so fully masked tiles never produce inf - inf = NaN.
_NEG_BIG = tl.constexpr(-1.0e30)


# --------------------------------------------------------------------------------------
# Kernel helpers
# --------------------------------------------------------------------------------------


@triton.jit
def _locate_tile(
    pid,
    query_start_loc_ptr,
    num_reqs,
    BLOCK_Q: tl.constexpr,
    ONE_TILE_PER_REQ: tl.constexpr,
):
    """Map a program index to (request, query tile index within the request).

    Without ``ONE_TILE_PER_REQ`` request ``r`` owns programs starting at
    ``query_start_loc[r] // BLOCK_Q + r``; that sequence is increasing, so a binary
    search finds the owner. Programs past a request's last tile exit later.
    """
    if ONE_TILE_PER_REQ:
        req = pid
        tile = pid * 0
    else:
        lo = pid * 0
        hi = num_reqs - 1 + pid * 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
            go_right = first_tile <= pid
            lo = tl.where(go_right, mid, lo)
            hi = tl.where(go_right, hi, mid - 1)
        req = lo
        tile = pid - (tl.load(query_start_loc_ptr + req) // BLOCK_Q + req)
    return req, tile


@triton.jit
def _load_rows(
    row_ptr, col_offs, stride_d, row_mask, col_mask, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr
):
    """Load ``row_ptr[r] + col_offs[c] * stride_d``, applying only the masks asked for.

    (Flags are separate constexprs: boolean operators on constexprs are not folded by
    every Triton version.)
    """
    ptrs = row_ptr[:, None] + col_offs[None, :] * stride_d
    if MASK_ROWS:
        if MASK_COLS:
            x = tl.load(ptrs, mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=row_mask[:, None], other=0.0)
    else:
        if MASK_COLS:
            x = tl.load(ptrs, mask=col_mask[None, :], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _load_rotary_pair(
    row_ptr,  # (ROWS,) pointers to element 0 of each row
    stride_d,
    row_mask,
    ROWS: tl.constexpr,
    ROT_HALF: tl.constexpr,
    ROT_HALF_P: tl.constexpr,
    IS_NEOX: tl.constexpr,
    MASK_ROWS: tl.constexpr,
    ROT_PADDED: tl.constexpr,  # ROT_HALF != ROT_HALF_P: padding lanes need the column mask
):
    """Load the two rotary lane sets of each row: (x1, x2), each (ROWS, ROT_HALF_P).

    neox: x1 = x[:half], x2 = x[half:rot]; gptj: x1 = x[0:rot:2], x2 = x[1:rot:2].
    """
    if IS_NEOX:
        offs = tl.arange(0, ROT_HALF_P)
        col_ok = offs < ROT_HALF
        x1 = _load_rows(row_ptr, offs, stride_d, row_mask, col_ok, MASK_ROWS, ROT_PADDED)
        x2 = _load_rows(row_ptr, ROT_HALF + offs, stride_d, row_mask, col_ok, MASK_ROWS, ROT_PADDED)
    else:
        # One contiguous load of the interleaved lanes, then split even/odd in registers.
        offs = tl.arange(0, 2 * ROT_HALF_P)
        x = _load_rows(row_ptr, offs, stride_d, row_mask, offs < 2 * ROT_HALF, MASK_ROWS, ROT_PADDED)
        x1, x2 = tl.split(tl.reshape(x, (ROWS, ROT_HALF_P, 2)))
    return x1, x2


@triton.jit
def _attend_key_range(
    acc,
    m_i,
    l_i,
    q1,
    q2,
    q3,
    q_pos,
    win_start,
    key_begin,
    key_end,
    seq_len,
    qk_scale,
    bt_row_ptr,
    stride_btb,
    k_head_ptr,
    v_head_ptr,
    stride_kb,
    stride_ks,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vd,
    cos_sin_ptr,
    stride_cs,
    MASKED: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_P: tl.constexpr,
    ROT_HALF: tl.constexpr,
    ROT_HALF_P: tl.constexpr,
    PASS: tl.constexpr,
    PASS_P: tl.constexpr,
    IS_NEOX: tl.constexpr,
    ROT_PADDED: tl.constexpr,
    PASS_PADDED: tl.constexpr,
    HEAD_PADDED: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Online-softmax attention of the query tile over keys [key_begin, key_end).

    ``MASKED=False`` is only used on tiles every row may fully attend to, with every
    key index < seq_len: no masks at all on that path.
    """
    offs_n_base = tl.arange(0, BLOCK_N)
    offs_v = tl.arange(0, HEAD_P)
    offs_pass = 2 * ROT_HALF + tl.arange(0, PASS_P)
    offs_half = tl.arange(0, ROT_HALF_P)
    half_ok = offs_half < ROT_HALF
    for n0 in range(key_begin, key_end, BLOCK_N):
        offs_n = n0 + offs_n_base
        key_ok = offs_n < seq_len
        # Paged gather: physical block of every key row.
        bt_ptrs = bt_row_ptr + (offs_n // KV_BLOCK_SIZE) * stride_btb
        if MASKED:
            phys = tl.load(bt_ptrs, mask=key_ok, other=0)
        else:
            phys = tl.load(bt_ptrs)
        slot = offs_n % KV_BLOCK_SIZE
        k_rows = k_head_ptr + phys.to(tl.int64) * stride_kb + slot * stride_ks
        v_rows = v_head_ptr + phys.to(tl.int64) * stride_vb + slot * stride_vs

        if ROT_HALF > 0:
            # Rotate the key tile by each key's index in the request (fp32 math), then
            # q.k_rot = q1.(k1 c - k2 s) + q2.(k2 c + k1 s): two dots, no lane shuffles.
            k1, k2 = _load_rotary_pair(
                k_rows, stride_kd, key_ok, BLOCK_N, ROT_HALF, ROT_HALF_P, IS_NEOX, MASKED, ROT_PADDED
            )
            cs_rows = cos_sin_ptr + offs_n * stride_cs
            cos = _load_rows(cs_rows, offs_half, 1, key_ok, half_ok, MASKED, ROT_PADDED).to(tl.float32)
            sin = _load_rows(cs_rows, ROT_HALF + offs_half, 1, key_ok, half_ok, MASKED, ROT_PADDED)
            sin = sin.to(tl.float32)
            k1f = k1.to(tl.float32)
            k2f = k2.to(tl.float32)
            k1r = (k1f * cos - k2f * sin).to(k1.dtype)
            k2r = (k2f * cos + k1f * sin).to(k1.dtype)
            qk = tl.dot(q1, tl.trans(k1r), input_precision=DOT_PRECISION)
            qk = tl.dot(q2, tl.trans(k2r), qk, input_precision=DOT_PRECISION)
            if PASS > 0:
                k3 = _load_rows(k_rows, offs_pass, stride_kd, key_ok, offs_pass < HEAD, MASKED, PASS_PADDED)
                qk = tl.dot(q3, tl.trans(k3), qk, input_precision=DOT_PRECISION)
        else:  # keys already rotated (benchmark / pre-pass mode)
            k3 = _load_rows(k_rows, offs_pass, stride_kd, key_ok, offs_pass < HEAD, MASKED, PASS_PADDED)
            qk = tl.dot(q3, tl.trans(k3), input_precision=DOT_PRECISION)

        if MASKED:
            allowed = (
                (offs_n[None, :] <= q_pos[:, None]) & (offs_n[None, :] >= win_start[:, None]) & key_ok[None, :]
            )
            qk = tl.where(allowed, qk, float("-inf"))
        # Base-2 online softmax; the scale is folded into one multiply-add per score.
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_rows(v_rows, offs_v, stride_vd, key_ok, offs_v < HEAD, MASKED, HEAD_PADDED)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


# --------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["num_reqs", "num_splits"])
def _paged_rope_attention_kernel(
    out_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    block_table_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    window_starts_ptr,
    cos_sin_ptr,
    part_acc_ptr,
    part_ml_ptr,
    qk_scale,
    num_reqs,
    num_splits,  # key-range splits per tile (partials merged by _merge_splits_kernel)
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_btr,
    stride_btb,
    stride_wsr,
    stride_wsb,
    stride_cs,
    HEAD: tl.constexpr,  # head_size
    HEAD_P: tl.constexpr,  # head_size rounded up to a power of two
    ROT_HALF: tl.constexpr,  # rotary_dim // 2
    ROT_HALF_P: tl.constexpr,
    PASS: tl.constexpr,  # head_size - rotary_dim (lanes not rotated)
    PASS_P: tl.constexpr,
    IS_NEOX: tl.constexpr,
    ROT_PADDED: tl.constexpr,  # ROT_HALF != ROT_HALF_P (host-computed: see _load_rows)
    PASS_PADDED: tl.constexpr,  # PASS != PASS_P
    HEAD_PADDED: tl.constexpr,  # HEAD != HEAD_P
    GROUP: tl.constexpr,  # query heads per kv head
    GROUP_P: tl.constexpr,  # GROUP rounded up to a power of two
    KV_BLOCK_SIZE: tl.constexpr,  # tokens per paged KV block
    BLOCK_M: tl.constexpr,  # query rows per tile = BLOCK_Q tokens x GROUP_P heads
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,  # keys per tile
    USE_SPLITS: tl.constexpr,  # num_splits > 1: write partial softmax states, not output
    ONE_TILE_PER_REQ: tl.constexpr,  # decode launch: program x = request
    SKIP_QLEN_LE: tl.constexpr,  # tile launch: leave requests with q_len <= this to decode
    REVERSE_TILES: tl.constexpr,  # launch the (longest) last query tiles first
    DOT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if REVERSE_TILES:
        pid = tl.num_programs(0) - 1 - pid
    req, tile = _locate_tile(pid, query_start_loc_ptr, num_reqs, BLOCK_Q, ONE_TILE_PER_REQ)

    q_begin = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_begin
    if ONE_TILE_PER_REQ:
        if (q_len > BLOCK_Q) | (q_len == 0):
            return
    else:
        if (q_len <= SKIP_QLEN_LE) | (tile * BLOCK_Q >= q_len):
            return
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len

    # Rows: token (tile * BLOCK_Q + m // GROUP_P) of the request, head m % GROUP_P of the group.
    offs_m = tl.arange(0, BLOCK_M)
    row_tok = tile * BLOCK_Q + offs_m // GROUP_P
    row_head = offs_m % GROUP_P
    row_valid = (row_tok < q_len) & (row_head < GROUP)
    q_pos = ctx_len + row_tok
    q_head = kv_head * GROUP + row_head
    win_start = tl.load(
        window_starts_ptr + req * stride_wsr + (q_pos // KV_BLOCK_SIZE) * stride_wsb, mask=row_valid, other=0
    )

    # Key range of the tile: from the lowest window start to the last query position.
    first_pos = ctx_len + tile * BLOCK_Q
    last_pos = tl.minimum(ctx_len + (tile + 1) * BLOCK_Q, seq_len) - 1
    min_ws = tl.min(tl.where(row_valid, win_start, seq_len), 0)
    max_ws = tl.max(tl.where(row_valid, win_start, 0), 0)
    key_lo = (min_ws // BLOCK_N) * BLOCK_N
    key_hi = last_pos + 1
    if USE_SPLITS:
        tiles_per_split = tl.cdiv(tl.cdiv(key_hi - key_lo, BLOCK_N), num_splits)
        split_lo = key_lo + split * tiles_per_split * BLOCK_N
        key_hi = tl.minimum(key_hi, split_lo + tiles_per_split * BLOCK_N)
        key_lo = tl.minimum(split_lo, key_hi)
    # Tiles in [full_lo, full_hi) are allowed for every row: no mask there.
    full_lo = tl.cdiv(max_ws, BLOCK_N) * BLOCK_N
    full_hi = ((first_pos + 1) // BLOCK_N) * BLOCK_N
    unmasked_lo = tl.minimum(tl.maximum(full_lo, key_lo), key_hi)
    unmasked_hi = tl.minimum(tl.maximum(full_hi, unmasked_lo), key_hi)

    # Query tile, split into the two rotary lane sets and the pass-through lanes.
    q_rows = q_ptr + (q_begin + row_tok).to(tl.int64) * stride_qt + q_head * stride_qh
    offs_pass = 2 * ROT_HALF + tl.arange(0, PASS_P)
    if PASS > 0:
        q3 = _load_rows(q_rows, offs_pass, stride_qd, row_valid, offs_pass < HEAD, True, True)
    if ROT_HALF > 0:
        q1, q2 = _load_rotary_pair(
            q_rows, stride_qd, row_valid, BLOCK_M, ROT_HALF, ROT_HALF_P, IS_NEOX, True, True
        )
    else:
        q1 = q3  # unused
        q2 = q3
    if PASS == 0:
        q3 = q1  # unused

    acc = tl.zeros([BLOCK_M, HEAD_P], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], _NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    bt_row_ptr = block_table_ptr + req.to(tl.int64) * stride_btr
    k_head_ptr = k_ptr + kv_head * stride_kh
    v_head_ptr = v_ptr + kv_head * stride_vh
    # Masked edge below (window starts), mask-free middle, masked edge above (causal).
    acc, m_i, l_i = _attend_key_range(
        acc, m_i, l_i, q1, q2, q3, q_pos, win_start, key_lo, unmasked_lo, seq_len, qk_scale,
        bt_row_ptr, stride_btb, k_head_ptr, v_head_ptr, stride_kb, stride_ks, stride_kd,
        stride_vb, stride_vs, stride_vd, cos_sin_ptr, stride_cs,
        True, HEAD, HEAD_P, ROT_HALF, ROT_HALF_P, PASS, PASS_P, IS_NEOX,
        ROT_PADDED, PASS_PADDED, HEAD_PADDED, KV_BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
    )  # fmt: skip
    acc, m_i, l_i = _attend_key_range(
        acc, m_i, l_i, q1, q2, q3, q_pos, win_start, unmasked_lo, unmasked_hi, seq_len, qk_scale,
        bt_row_ptr, stride_btb, k_head_ptr, v_head_ptr, stride_kb, stride_ks, stride_kd,
        stride_vb, stride_vs, stride_vd, cos_sin_ptr, stride_cs,
        False, HEAD, HEAD_P, ROT_HALF, ROT_HALF_P, PASS, PASS_P, IS_NEOX,
        ROT_PADDED, PASS_PADDED, HEAD_PADDED, KV_BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
    )  # fmt: skip
    acc, m_i, l_i = _attend_key_range(
        acc, m_i, l_i, q1, q2, q3, q_pos, win_start, unmasked_hi, key_hi, seq_len, qk_scale,
        bt_row_ptr, stride_btb, k_head_ptr, v_head_ptr, stride_kb, stride_ks, stride_kd,
        stride_vb, stride_vs, stride_vd, cos_sin_ptr, stride_cs,
        True, HEAD, HEAD_P, ROT_HALF, ROT_HALF_P, PASS, PASS_P, IS_NEOX,
        ROT_PADDED, PASS_PADDED, HEAD_PADDED, KV_BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
    )  # fmt: skip

    offs_d = tl.arange(0, HEAD_P)
    if USE_SPLITS:
        slot = (pid * tl.num_programs(1) + kv_head) * num_splits + split
        acc_ptrs = part_acc_ptr + slot.to(tl.int64) * (BLOCK_M * HEAD_P) + offs_m[:, None] * HEAD_P + offs_d[None, :]
        tl.store(acc_ptrs, acc)
        ml_ptrs = part_ml_ptr + slot.to(tl.int64) * (2 * BLOCK_M) + offs_m
        tl.store(ml_ptrs, m_i)
        tl.store(ml_ptrs + BLOCK_M, l_i)
    else:
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]
        o_rows = out_ptr + (q_begin + row_tok).to(tl.int64) * stride_ot + q_head * stride_oh
        tl.store(
            o_rows[:, None] + offs_d[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None] & (offs_d < HEAD)[None, :],
        )


@triton.jit(do_not_specialize=["num_reqs", "num_splits"])
def _merge_splits_kernel(
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    query_start_loc_ptr,
    num_reqs,
    num_splits,
    stride_ot,
    stride_oh,
    stride_od,
    HEAD: tl.constexpr,
    HEAD_P: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    ONE_TILE_PER_REQ: tl.constexpr,
    SKIP_QLEN_LE: tl.constexpr,
):
    """Merge the num_splits partial softmax states of one (query tile, kv head)."""
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    req, tile = _locate_tile(pid, query_start_loc_ptr, num_reqs, BLOCK_Q, ONE_TILE_PER_REQ)
    q_begin = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_begin
    if ONE_TILE_PER_REQ:
        if (q_len > BLOCK_Q) | (q_len == 0):
            return
    else:
        if (q_len <= SKIP_QLEN_LE) | (tile * BLOCK_Q >= q_len):
            return
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_P)
    row_tok = tile * BLOCK_Q + offs_m // GROUP_P
    row_head = offs_m % GROUP_P
    row_valid = (row_tok < q_len) & (row_head < GROUP)

    acc = tl.zeros([BLOCK_M, HEAD_P], dtype=tl.float32)
    m_run = tl.full([BLOCK_M], _NEG_BIG, dtype=tl.float32)
    l_run = tl.zeros([BLOCK_M], dtype=tl.float32)
    base = (pid * tl.num_programs(1) + kv_head) * num_splits
    for s in range(num_splits):
        slot = (base + s).to(tl.int64)
        m_s = tl.load(part_ml_ptr + slot * (2 * BLOCK_M) + offs_m)
        l_s = tl.load(part_ml_ptr + slot * (2 * BLOCK_M) + BLOCK_M + offs_m)
        acc_s = tl.load(part_acc_ptr + slot * (BLOCK_M * HEAD_P) + offs_m[:, None] * HEAD_P + offs_d[None, :])
        m_new = tl.maximum(m_run, m_s)
        a = tl.math.exp2(m_run - m_new)
        b = tl.math.exp2(m_s - m_new)
        acc = acc * a[:, None] + acc_s * b[:, None]
        l_run = l_run * a + l_s * b
        m_run = m_new
    l_safe = tl.where(l_run == 0.0, 1.0, l_run)
    out = acc / l_safe[:, None]
    q_head = kv_head * GROUP + row_head
    o_rows = out_ptr + (q_begin + row_tok).to(tl.int64) * stride_ot + q_head * stride_oh
    tl.store(
        o_rows[:, None] + offs_d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=row_valid[:, None] & (offs_d < HEAD)[None, :],
    )


@triton.jit(do_not_specialize=["num_kv_heads", "max_blocks"])
def _rotate_kv_pages_kernel(
    k_out_ptr,
    v_out_ptr,
    k_ptr,
    v_ptr,
    block_table_ptr,
    seq_lens_ptr,
    cos_sin_ptr,
    query_start_loc_ptr,  # only read with SKIP_QLEN_LE > 0
    slot_ptr,  # (num_reqs,) output page row of each request; only read with USE_SLOTS
    num_kv_heads,
    max_blocks,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_btr,
    stride_btb,
    stride_cs,
    HEAD: tl.constexpr,
    HEAD_P: tl.constexpr,
    ROT_HALF: tl.constexpr,
    ROT_HALF_P: tl.constexpr,
    IS_NEOX: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    SKIP_QLEN_LE: tl.constexpr,  # > 0: leave requests with q_len <= this (decode path) alone
    USE_SLOTS: tl.constexpr,
):
    """Copy logical block (req, b) into dense pages, keys rotated by their index."""
    req = tl.program_id(0)
    blk = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + req)
    if blk * KV_BLOCK_SIZE >= seq_len:
        return
    if SKIP_QLEN_LE > 0:
        q_len = tl.load(query_start_loc_ptr + req + 1) - tl.load(query_start_loc_ptr + req)
        if q_len <= SKIP_QLEN_LE:
            return
    if USE_SLOTS:
        row = tl.load(slot_ptr + req)
    else:
        row = req
    phys = tl.load(block_table_ptr + req * stride_btr + blk * stride_btb).to(tl.int64)
    out_blk = (row * max_blocks + blk).to(tl.int64)
    offs_s = tl.arange(0, KV_BLOCK_SIZE)
    pos = blk * KV_BLOCK_SIZE + offs_s
    pos_ok = pos < seq_len
    offs_d = tl.arange(0, HEAD_P)
    d_ok = offs_d < HEAD
    offs_half = tl.arange(0, ROT_HALF_P)
    half_ok = offs_half < ROT_HALF
    cs_rows = cos_sin_ptr + pos * stride_cs
    cos = _load_rows(cs_rows, offs_half, 1, pos_ok, half_ok, True, True).to(tl.float32)
    sin = _load_rows(cs_rows, ROT_HALF + offs_half, 1, pos_ok, half_ok, True, True).to(tl.float32)
    for h in range(num_kv_heads):
        k_rows = k_ptr + phys * stride_kb + offs_s * stride_ks + h * stride_kh
        v_rows = v_ptr + phys * stride_vb + offs_s * stride_vs + h * stride_vh
        # Output pages are contiguous (blocks, block_size, heads, head_size).
        o_rows = (out_blk * KV_BLOCK_SIZE + offs_s) * (num_kv_heads * HEAD) + h * HEAD
        x = _load_rows(k_rows, offs_d, stride_kd, pos_ok, d_ok, True, True)
        x1, x2 = _load_rotary_pair(
            k_rows, stride_kd, pos_ok, KV_BLOCK_SIZE, ROT_HALF, ROT_HALF_P, IS_NEOX, True, True
        )
        r1 = (x1.to(tl.float32) * cos - x2.to(tl.float32) * sin).to(x.dtype)
        r2 = (x2.to(tl.float32) * cos + x1.to(tl.float32) * sin).to(x.dtype)
        st_mask = pos_ok[:, None] & half_ok[None, :]
        if IS_NEOX:
            tl.store(k_out_ptr + o_rows[:, None] + offs_half[None, :], r1, mask=st_mask)
            tl.store(k_out_ptr + o_rows[:, None] + (ROT_HALF + offs_half)[None, :], r2, mask=st_mask)
        else:
            even = 2 * offs_half
            tl.store(k_out_ptr + o_rows[:, None] + even[None, :], r1, mask=st_mask)
            tl.store(k_out_ptr + o_rows[:, None] + (even + 1)[None, :], r2, mask=st_mask)
        pass_ok = pos_ok[:, None] & (d_ok & (offs_d >= 2 * ROT_HALF))[None, :]
        tl.store(k_out_ptr + o_rows[:, None] + offs_d[None, :], x, mask=pass_ok)
        v = _load_rows(v_rows, offs_d, stride_vd, pos_ok, d_ok, True, True)
        tl.store(v_out_ptr + o_rows[:, None] + offs_d[None, :], v, mask=pos_ok[:, None] & d_ok[None, :])


def rotate_kv_to_dense_pages(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cos_sin: torch.Tensor,
    rotary_dim: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pre-pass for a stock (rotating-nothing) attention kernel such as FlashAttention.

    Copies every request's keys, rotated by their index in the request, and values into
    fresh contiguous pages ``(num_reqs * max_blocks, block_size, num_kv_heads,
    head_size)``; returns ``(keys, values, dense_block_table)``. A block shared by two
    requests (or present twice in one) gets one rotated copy per use. Positions past a
    request's length are left unwritten. No host sync.
    """
    num_reqs, max_blocks = block_table.shape
    _, block_size, num_kv_heads, head_size = key_cache.shape
    shape = (num_reqs * max_blocks, block_size, num_kv_heads, head_size)
    k_out = torch.empty(shape, dtype=key_cache.dtype, device=key_cache.device)
    v_out = torch.empty(shape, dtype=value_cache.dtype, device=value_cache.device)
    table = torch.arange(num_reqs * max_blocks, dtype=torch.int32, device=block_table.device)
    table = table.view(num_reqs, max_blocks)
    if num_reqs == 0 or max_blocks == 0:
        return k_out, v_out, table
    rot_half = rotary_dim // 2
    _rotate_kv_pages_kernel[(num_reqs, max_blocks)](
        k_out, v_out, key_cache, value_cache, block_table, seq_lens, cos_sin, seq_lens, seq_lens,
        num_kv_heads, max_blocks, *key_cache.stride(), *value_cache.stride(), *block_table.stride(),
        cos_sin.stride(0),
        HEAD=head_size, HEAD_P=_pow2(head_size), ROT_HALF=rot_half, ROT_HALF_P=_pow2(rot_half, 16),
        IS_NEOX=bool(is_neox), KV_BLOCK_SIZE=block_size, SKIP_QLEN_LE=0, USE_SLOTS=False, num_warps=4,
    )  # fmt: skip
    return k_out, v_out, table


def _prepass_for_prefill(args: dict, prob: _Problem, decode_block_q: int, max_bytes: int):
    """Rotate the keys of the prefill-path requests into scratch pages, or None.

    Requests with more than ``decode_block_q`` query tokens get a row of dense pages
    (their rank among such requests); the row count is bounded from Python ints (each
    such request holds > decode_block_q of the batch's tokens), so no host sync. Returns
    None when that bound times the block-table width would exceed ``max_bytes``.
    """
    key_cache = args["key_cache"]
    _, block_size, num_kv_heads, head_size = key_cache.shape
    block_table = args["block_table"]
    max_blocks = block_table.shape[1]
    rows = min(prob.num_reqs, prob.num_tokens // (decode_block_q + 1))
    block_bytes = block_size * num_kv_heads * head_size * key_cache.element_size()
    if rows == 0 or 2 * rows * max_blocks * block_bytes > max_bytes:
        return None
    qsl = args["query_start_loc"]
    is_prefill = (qsl[1:] - qsl[:-1]) > decode_block_q
    slots = (torch.cumsum(is_prefill.to(torch.int32), 0, dtype=torch.int32) - 1).clamp_(min=0)
    shape = (rows * max_blocks, block_size, num_kv_heads, head_size)
    k_out = torch.empty(shape, dtype=key_cache.dtype, device=key_cache.device)
    v_out = torch.empty(shape, dtype=key_cache.dtype, device=key_cache.device)
    cols = torch.arange(max_blocks, dtype=torch.int32, device=block_table.device)
    table = slots[:, None] * max_blocks + cols[None, :]
    rot_half = args["rotary_dim"] // 2
    value_cache, cos_sin = args["value_cache"], args["cos_sin"]
    _rotate_kv_pages_kernel[(prob.num_reqs, max_blocks)](
        k_out, v_out, key_cache, value_cache, block_table, args["seq_lens"], cos_sin, qsl, slots,
        num_kv_heads, max_blocks, *key_cache.stride(), *value_cache.stride(), *block_table.stride(),
        cos_sin.stride(0),
        HEAD=head_size, HEAD_P=_pow2(head_size), ROT_HALF=rot_half, ROT_HALF_P=_pow2(rot_half, 16),
        IS_NEOX=args["is_neox"], KV_BLOCK_SIZE=block_size, SKIP_QLEN_LE=decode_block_q,
        USE_SLOTS=True, num_warps=4,
    )  # fmt: skip
    return dict(args, key_cache=k_out, value_cache=v_out, block_table=table, rotary_dim=0)


# --------------------------------------------------------------------------------------
# Configurations
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Launch shape of one path. ``block_m`` counts packed rows (tokens x group heads)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    num_splits: int | None = None  # None: chosen from the grid size


# Small fixed lists; the first entry is the default (used untuned). Measured on an H200
# (docs/benchmarks.md): for head 128, (128, 64, 8 warps, 3 stages) won at 8k-32k tokens.
_PREFILL_CONFIGS = {
    "head64": (
        AttentionConfig(128, 128, 8, 3),
        AttentionConfig(128, 32, 8, 3),
        AttentionConfig(128, 64, 8, 3),
    ),
    "head128": (
        AttentionConfig(128, 64, 8, 3),
        AttentionConfig(128, 128, 8, 2),
        AttentionConfig(128, 64, 8, 2),
    ),
    "head256": (
        AttentionConfig(128, 32, 8, 2),
        AttentionConfig(64, 16, 4, 3),
    ),
}
_DECODE_CONFIGS = {
    "head64": (
        AttentionConfig(16, 64, 4, 3),
        AttentionConfig(16, 128, 4, 3),
    ),
    "head128": (
        AttentionConfig(16, 64, 4, 3),
        AttentionConfig(16, 64, 8, 3),
    ),
    "head256": (
        AttentionConfig(16, 32, 4, 3),
        AttentionConfig(16, 64, 8, 2),
    ),
}


def _head_family(head_size: int) -> str:
    return "head64" if head_size <= 64 else ("head128" if head_size <= 128 else "head256")


_TUNED: dict[tuple, AttentionConfig] = {}
_SM_COUNT: dict[int, int] = {}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def _pow2(x: int, minimum: int = 1) -> int:
    return max(minimum, triton.next_power_of_2(max(1, x)))


@dataclasses.dataclass(frozen=True)
class _Problem:
    num_tokens: int
    num_reqs: int
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    group: int
    group_p: int
    kv_block_size: int
    max_kv_len: int  # upper bound from the block table width
    max_query_len: int | None


def _split_count(programs: int, key_tiles: int, num_sms: int, requested: int | None) -> int:
    """Key splits when a launch has fewer programs than SMs: as many as keep the launch
    within ~2 programs per SM (rounded down: a partial second wave cost more than it
    saved on the H200), each split keeping >= 4 key tiles."""
    if requested is not None:
        return max(1, requested)
    if programs >= num_sms:
        return 1
    want = (2 * num_sms) // max(1, programs)
    most = max(1, key_tiles // 4)
    return int(max(1, min(want, most, 16)))


def _launch(
    path: str,
    cfg: AttentionConfig,
    prob: _Problem,
    args: dict,
    out: torch.Tensor,
    decode_block_q: int,
):
    """Launch one path (``"decode"`` or ``"prefill"``) with one configuration."""
    query, key_cache, value_cache = args["query"], args["key_cache"], args["value_cache"]
    block_table, window_starts, cos_sin = args["block_table"], args["window_starts"], args["cos_sin"]
    group_p = prob.group_p
    block_m = max(cfg.block_m, group_p)
    if path == "decode":
        block_m = max(16, group_p)
        block_q = decode_block_q
        num_tiles = prob.num_reqs
        one_tile, skip_le, reverse = True, 0, False
    else:
        block_q = block_m // group_p
        num_tiles = prob.num_tokens // block_q + prob.num_reqs
        if prob.max_query_len is not None:
            num_tiles = min(num_tiles, prob.num_reqs * triton.cdiv(prob.max_query_len, block_q))
        one_tile, skip_le, reverse = False, decode_block_q, True
    if num_tiles == 0:
        return
    key_tiles = triton.cdiv(prob.max_kv_len, cfg.block_n)
    splits = _split_count(num_tiles * prob.num_kv_heads, key_tiles, _num_sms(query.device), cfg.num_splits)
    head_p = _pow2(prob.head_size)
    if splits > 1:
        slots = num_tiles * prob.num_kv_heads * splits
        part_acc = torch.empty(slots * block_m * head_p, dtype=torch.float32, device=query.device)
        part_ml = torch.empty(slots * 2 * block_m, dtype=torch.float32, device=query.device)
    else:
        part_acc = part_ml = out  # never touched
    rot_half = args["rotary_dim"] // 2
    pass_dim = prob.head_size - 2 * rot_half
    dot_precision = "ieee" if query.dtype == torch.float32 else "tf32"
    grid = (num_tiles, prob.num_kv_heads, splits)
    _paged_rope_attention_kernel[grid](
        out, query, key_cache, value_cache, block_table, args["query_start_loc"], args["seq_lens"],
        window_starts, cos_sin, part_acc, part_ml,
        args["scale"] * _LOG2E, prob.num_reqs, splits,
        *query.stride(), *out.stride(), *key_cache.stride(), *value_cache.stride(),
        *block_table.stride(), *window_starts.stride(), cos_sin.stride(0),
        HEAD=prob.head_size, HEAD_P=head_p,
        ROT_HALF=rot_half, ROT_HALF_P=_pow2(rot_half, 16),
        PASS=pass_dim, PASS_P=_pow2(pass_dim, 16),
        IS_NEOX=args["is_neox"], GROUP=prob.group, GROUP_P=group_p,
        ROT_PADDED=rot_half != _pow2(rot_half, 16), PASS_PADDED=pass_dim != _pow2(pass_dim, 16),
        HEAD_PADDED=prob.head_size != head_p,
        KV_BLOCK_SIZE=prob.kv_block_size,
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=cfg.block_n,
        USE_SPLITS=splits > 1, ONE_TILE_PER_REQ=one_tile, SKIP_QLEN_LE=skip_le, REVERSE_TILES=reverse,
        DOT_PRECISION=dot_precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if splits > 1:
        _merge_splits_kernel[(num_tiles, prob.num_kv_heads)](
            out, part_acc, part_ml, args["query_start_loc"], prob.num_reqs, splits, *out.stride(),
            HEAD=prob.head_size, HEAD_P=head_p, GROUP=prob.group, GROUP_P=group_p,
            BLOCK_M=block_m, BLOCK_Q=block_q, ONE_TILE_PER_REQ=one_tile,
            SKIP_QLEN_LE=skip_le, num_warps=4,
        )  # fmt: skip


def _tuning_key(path: str, prob: _Problem, args: dict) -> tuple:
    q = args["query"]
    bucket = 0
    if path == "prefill":
        bucket = 0 if prob.num_tokens < 2048 else 1
    else:
        bucket = 0 if prob.num_reqs * prob.num_kv_heads < _num_sms(q.device) else 1
    return (
        path,
        q.device.index,
        q.dtype,
        prob.head_size,
        args["rotary_dim"],
        args["is_neox"],
        prob.group,
        prob.kv_block_size,
        bucket,
    )


def _pick_config(path: str, prob: _Problem, args: dict, out: torch.Tensor, decode_block_q: int):
    family = _head_family(prob.head_size)
    candidates = (_DECODE_CONFIGS if path == "decode" else _PREFILL_CONFIGS)[family]
    key = _tuning_key(path, prob, args)
    if key in _TUNED:
        return _TUNED[key]
    # Tune a path only on a batch known to exercise it: a pure decode batch for the
    # decode launch, a batch with prefill rows for the tile launch.
    if path == "decode":
        representative = prob.max_query_len is not None and prob.max_query_len <= decode_block_q
    else:
        representative = prob.max_query_len is not None and prob.max_query_len > decode_block_q
    tune = (
        representative
        and os.environ.get("MINIPIC_ATTN_AUTOTUNE", "1") != "0"
        and not _interpreting()
        and args["query"].is_cuda
        and not torch.cuda.is_current_stream_capturing()
        and len(candidates) > 1
    )
    if not tune:
        return candidates[0]
    scratch = torch.empty_like(out)
    best, best_ms = candidates[0], float("inf")
    for cfg in candidates:
        try:
            ms = triton.testing.do_bench(
                lambda cfg=cfg: _launch(path, cfg, prob, args, scratch, decode_block_q),
                warmup=5,
                rep=20,
                return_mode="median",
            )
        except Exception:  # e.g. a config that needs more shared memory than the GPU has
            continue
        if ms < best_ms:
            best, best_ms = cfg, ms
    _TUNED[key] = best
    return best


_HALF_TABLES: dict[tuple, torch.Tensor] = {}


def _kernel_cos_sin(cos_sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The cos/sin table the kernel reads: for 16-bit inputs an fp16 copy of an fp32 table.

    The kernel rounds rotated keys to the input dtype (bf16/fp16) before the dot anyway;
    fp16 cos/sin (|x| <= 1, 11-bit mantissa) adds 4-16x less error than that rounding and
    halves the table traffic, which dominated the rotation cost on the H200. The copy is
    cached per table version (made eagerly, before any CUDA-graph capture reuses it).
    """
    if dtype == torch.float32 or cos_sin.dtype != torch.float32:
        return cos_sin
    if os.environ.get("MINIPIC_ATTN_FP32_COS_SIN", "0") == "1":
        return cos_sin
    try:
        version = cos_sin._version
    except RuntimeError:  # inference tensors keep no version counter (tables are constant)
        version = -1
    key = (cos_sin.data_ptr(), cos_sin.shape, cos_sin.stride(), cos_sin.device, version)
    half = _HALF_TABLES.get(key)
    if half is None:
        half = cos_sin.to(torch.float16)
        if not (cos_sin.is_cuda and torch.cuda.is_current_stream_capturing()):
            if len(_HALF_TABLES) > 16:
                _HALF_TABLES.clear()
            _HALF_TABLES[key] = half
    return half


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def paged_rope_attention(
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
    max_query_len: int | None = None,
    window_starts: torch.Tensor | None = None,
    prefill_config: AttentionConfig | None = None,
    decode_config: AttentionConfig | None = None,
    prepass_max_bytes: int | None = None,
) -> torch.Tensor:
    """Attention of each request's query rows over its paged, unrotated keys.

    Same semantics as `paged_rope_attention_reference` (see its module docstring):
    ``query`` ``(num_tokens, num_q_heads, head_size)`` already rotated; ``key_cache`` /
    ``value_cache`` ``(num_blocks, block_size, num_kv_heads, head_size)`` with any
    strides; ``block_table`` ``(num_reqs, max_blocks)``; ``query_start_loc``
    ``(num_reqs + 1,)``; ``seq_lens`` ``(num_reqs,)``; ``block_kind`` per physical
    block; ``cos_sin`` ``(max_positions, rotary_dim)`` = ``cat(cos, sin)`` (float32,
    or the model dtype; math is fp32 either way).

    Never syncs with the host: grid sizes come from tensor shapes and ``max_query_len``
    (an upper bound on query tokens per request, optional: it only lets a decode-only
    batch skip the prefill launch). ``window_starts`` may be passed precomputed
    (``window_starts_per_block(block_table, block_kind, block_size)``), e.g. once per
    step for all layers. ``output`` must not alias the inputs.

    Tuning knobs, for tests and benchmarks: ``prefill_config`` / ``decode_config`` pin the
    launch configurations (None: tuned once per shape class, or the default). ``rotary_dim=0``
    treats the cached keys as already rotated. ``prepass_max_bytes`` is the scratch budget of
    the prefill pre-pass (0 disables it: keys are then rotated inside the tile kernel too);
    None: the pre-pass runs for batches of at least ``MINIPIC_ATTN_PREPASS_MIN_TOKENS`` (2048)
    tokens within ``MINIPIC_ATTN_PREPASS_MAX_BYTES`` (1 GiB) of scratch.
    """
    num_tokens, num_q_heads, head_size = query.shape
    _, kv_block_size, num_kv_heads, kv_head_size = key_cache.shape
    if kv_head_size != head_size or value_cache.shape != key_cache.shape:
        raise ValueError("key_cache/value_cache must be (num_blocks, block_size, num_kv_heads, head_size)")
    if num_q_heads % num_kv_heads:
        raise ValueError("num_q_heads must be a multiple of num_kv_heads")
    if rotary_dim % 2 or not 0 <= rotary_dim <= head_size or (rotary_dim and cos_sin.shape[-1] != rotary_dim):
        raise ValueError("rotary_dim must be even, <= head_size, and match cos_sin's last dim")
    if key_cache.dtype != query.dtype or value_cache.dtype != query.dtype:
        raise ValueError("query, key_cache and value_cache must share a dtype")
    if output is None:
        output = torch.empty_like(query)
    if num_tokens == 0:
        return output
    if window_starts is None:
        window_starts = window_starts_per_block(block_table, block_kind, kv_block_size)
    group = num_q_heads // num_kv_heads
    prob = _Problem(
        num_tokens=num_tokens,
        num_reqs=seq_lens.shape[0],
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        group=group,
        group_p=_pow2(group),
        kv_block_size=kv_block_size,
        max_kv_len=block_table.shape[1] * kv_block_size,
        max_query_len=max_query_len,
    )
    args = dict(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_table=block_table,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        window_starts=window_starts,
        cos_sin=cos_sin,
        rotary_dim=rotary_dim,
        is_neox=bool(is_neox),
        scale=float(scale),
    )
    if rotary_dim:
        args["cos_sin"] = _kernel_cos_sin(cos_sin, query.dtype)
    # Requests with at most `decode_block_q` query tokens take the decode launch (keys
    # rotated in the kernel); the others the tile launch, over keys rotated once into
    # scratch pages by a pre-pass when the scratch fits `prepass_max_bytes`.
    decode_block_q = max(16, prob.group_p) // prob.group_p
    cfg = decode_config or _pick_config("decode", prob, args, output, decode_block_q)
    _launch("decode", cfg, prob, args, output, decode_block_q)
    if max_query_len is None or max_query_len > decode_block_q:
        prefill_args = args
        if rotary_dim and prepass_max_bytes is None:
            # Below ~2k tokens the pre-pass's fixed cost ate its gain on the H200.
            min_tokens = int(os.environ.get("MINIPIC_ATTN_PREPASS_MIN_TOKENS", "2048"))
            prepass_max_bytes = int(os.environ.get("MINIPIC_ATTN_PREPASS_MAX_BYTES", str(1 << 30)))
            if num_tokens < min_tokens:
                prepass_max_bytes = 0
        if rotary_dim and prepass_max_bytes > 0:
            prefill_args = _prepass_for_prefill(args, prob, decode_block_q, prepass_max_bytes) or args
        cfg = prefill_config or _pick_config("prefill", prob, prefill_args, output, decode_block_q)
        _launch("prefill", cfg, prob, prefill_args, output, decode_block_q)
    return output
