"""Triton paged attention over block-relative (or pre-rotated) keys with span windows.

The cache holds each key rotated by its slot in its KV block (`kv_write`); attention adds
the rotation of the block's first position ``b``, from ``cos_sin`` (a pure rotation).

One kernel body, two launch shapes (the `launch` function picks one):

* **decode**: one program per (request, kv head, key split) for requests with at most
  `decode_query_limit` query tokens; the key range is split across programs whose partial
  softmax states `_merge_splits_kernel` combines (flash-decoding). Keys are never rotated
  here: a key tile spans ``NROT`` KV blocks, and each (token, head) gets ``NROT`` query
  rows, row ``r`` rotated back by the start of the tile's ``r``-th block and attending only
  that block's keys, ``R(p_q) q . R(b) k' = R(b)^T R(p_q) q . k'``. ``R(b)^T`` is applied in
  two parts: by the row's offset ``r * KV_BLOCK_SIZE`` once per program
  (`_rotate_back_by_offset`), and by the tile's base: the first tile's from the table, then
  one fixed unit rotation by ``BLOCK_N`` per tile on rows kept in fp32, so the loop loads
  no table rows. The rows of one (token, head) are merged at the end like key splits
  (`_merge_rotations`). K/V go from the cache straight into the dot.
* **tiles**: programs over query tiles of the remaining requests (optionally only those a
  per-request flag selects); the tile -> request map is a binary search over
  ``query_start_loc`` inside the kernel, so the grid is an upper bound from host ints. Keys
  are rotated in registers by their block's start (a query tile is too large to rotate
  per block; prefill normally reads keys rotated once by `rotary_pages` instead).

Query rows are *packed by GQA group* (tokens x heads per tile), so each key/value tile is
loaded once per kv head. The key range of a tile runs from the lowest window start of its
rows to its last query position: tiles wholly outside every row's window are never
visited, which keeps Block-Attention prefill linear in the number of spans.

``ROT_HALF == 0`` means keys are already rotated (scratch pages from `rotary_pages`).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

__all__ = ["AttentionConfig", "TileLaunch", "decode_config", "decode_programs_to_fill", "launch", "prefill_config"]

_LOG2E = 1.4426950408889634
# Initial running max: finite, so fully masked tiles never produce inf - inf = NaN.
_NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def _locate_tile(pid, query_start_loc_ptr, num_reqs, BLOCK_Q: tl.constexpr, DECODE: tl.constexpr):
    """(request, query tile within it) of a program.

    Tile launch: request ``r`` owns programs from ``query_start_loc[r] // BLOCK_Q + r``
    on; that sequence is increasing, so a binary search finds the owner.
    """
    if DECODE:
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
def _load_rows(row_ptr, col_offs, stride_d, row_mask, col_mask):
    """``row_ptr[r] + col_offs[c] * stride_d`` for the rows and columns the masks allow (else 0)."""
    ptrs = row_ptr[:, None] + col_offs[None, :] * stride_d
    return tl.load(ptrs, mask=row_mask[:, None] & col_mask[None, :], other=0.0)


@triton.jit
def _load_pair(row_ptr, stride_d, row_mask, ROWS: tl.constexpr, ROT_HALF: tl.constexpr,
               ROT_HALF_P: tl.constexpr, IS_NEOX: tl.constexpr):
    """The two rotary lane sets of each row, each ``(ROWS, ROT_HALF_P)``:
    neox ``x[:half]``, ``x[half:rot]``; gptj ``x[0:rot:2]``, ``x[1:rot:2]``."""
    if IS_NEOX:
        offs = tl.arange(0, ROT_HALF_P)
        ok = offs < ROT_HALF
        x1 = _load_rows(row_ptr, offs, stride_d, row_mask, ok)
        x2 = _load_rows(row_ptr, ROT_HALF + offs, stride_d, row_mask, ok)
    else:
        offs = tl.arange(0, 2 * ROT_HALF_P)
        x = _load_rows(row_ptr, offs, stride_d, row_mask, offs < 2 * ROT_HALF)
        x1, x2 = tl.split(tl.reshape(x, (ROWS, ROT_HALF_P, 2)))
    return x1, x2


@triton.jit
def _store_pair(row_ptr, x1, x2, stride_d, row_mask, ROT_HALF: tl.constexpr, ROT_HALF_P: tl.constexpr,
                IS_NEOX: tl.constexpr):
    """Store the two rotary lane sets of each row where `_load_pair` reads them (in the row's dtype)."""
    offs = tl.arange(0, ROT_HALF_P)
    if IS_NEOX:
        lanes1 = offs
        lanes2 = ROT_HALF + offs
    else:
        lanes1 = 2 * offs
        lanes2 = 2 * offs + 1
    ok = row_mask[:, None] & (offs < ROT_HALF)[None, :]
    ty = row_ptr.dtype.element_ty
    tl.store(row_ptr[:, None] + lanes1[None, :] * stride_d, x1.to(ty), mask=ok)
    tl.store(row_ptr[:, None] + lanes2[None, :] * stride_d, x2.to(ty), mask=ok)


@triton.jit
def _table_rows(cos_sin_ptr, positions, row_mask, stride_cs, ROT_HALF: tl.constexpr,
                ROT_HALF_P: tl.constexpr):
    """fp32 (cos, sin) rows of the RoPE table at `positions`, each ``(len, ROT_HALF_P)``."""
    offs = tl.arange(0, ROT_HALF_P)
    ok = offs < ROT_HALF
    rows = cos_sin_ptr + positions * stride_cs
    cos = _load_rows(rows, offs, 1, row_mask, ok).to(tl.float32)
    sin = _load_rows(rows, ROT_HALF + offs, 1, row_mask, ok).to(tl.float32)
    return cos, sin


@triton.jit
def _table_row(cos_sin_ptr, position, stride_cs, ROT_HALF: tl.constexpr, ROT_HALF_P: tl.constexpr):
    """fp32 (cos, sin) of one table row, each ``(ROT_HALF_P,)``; padding lanes rotate by 0."""
    offs = tl.arange(0, ROT_HALF_P)
    row = cos_sin_ptr + position * stride_cs + offs
    cos = tl.load(row, mask=offs < ROT_HALF, other=1.0).to(tl.float32)
    sin = tl.load(row + ROT_HALF, mask=offs < ROT_HALF, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _rotate(x1, x2, cos, sin):
    """RoPE of the lane pair by the angle whose cos/sin are given (fp32 math, input dtype out)."""
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    return (a * cos - b * sin).to(x1.dtype), (b * cos + a * sin).to(x1.dtype)


@triton.jit
def _unit(cos, sin):
    """The table's (cos, sin) scaled to a pure rotation (a YaRN-style table carries a magnitude)."""
    inv_norm = tl.math.rsqrt(cos * cos + sin * sin)
    return cos * inv_norm, sin * inv_norm


@triton.jit
def _attend_keys(acc, m_i, l_i, q1, q2, q3, q_pos, win_start, row_rot, key_lo, key_hi, seq_len, qk_scale,
                 bt_row_ptr, stride_btb, k_head_ptr, v_head_ptr, stride_kb, stride_ks, stride_kd,
                 stride_vb, stride_vs, stride_vd, cos_sin_ptr, stride_cs,
                 HEAD: tl.constexpr, HEAD_P: tl.constexpr, ROT_HALF: tl.constexpr,
                 ROT_HALF_P: tl.constexpr, PASS: tl.constexpr, PASS_P: tl.constexpr,
                 IS_NEOX: tl.constexpr, ROTATE_QUERY: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online-softmax attention of the query tile over keys ``[key_lo, key_hi)``.

    ``ROTATE_QUERY``: row ``m`` sees only the keys of the tile's ``row_rot[m]``-th KV block
    (the decode layout of the module docstring; ``BLOCK_N`` is a multiple of ``KV_BLOCK_SIZE``
    and ``key_lo`` of ``BLOCK_N``); otherwise keys are rotated by their block's start.
    """
    offs_j = tl.arange(0, BLOCK_N)
    offs_v = tl.arange(0, HEAD_P)
    if ROTATE_QUERY:
        # R(base)^T of the first tile (its table row as is: a magnitude applies once), then
        # R(BLOCK_N)^T per tile. fp32 rows drift by about 1e-7 per tile, far below bf16's
        # resolution, and the loop waits on no table load (docs/benchmarks.md, section 2).
        cos, sin = _table_row(cos_sin_ptr, key_lo, stride_cs, ROT_HALF, ROT_HALF_P)
        f1, f2 = _rotate(q1.to(tl.float32), q2.to(tl.float32), cos[None, :], -sin[None, :])
        # (Row BLOCK_N exists whenever a second tile does: the table covers every position.)
        step_cos, step_sin = _table_row(cos_sin_ptr, tl.minimum(BLOCK_N, seq_len - 1), stride_cs, ROT_HALF,
                                        ROT_HALF_P)
        step_cos, step_sin = _unit(step_cos, step_sin)
    for n0 in range(key_lo, key_hi, BLOCK_N):
        offs_n = n0 + offs_j
        key_ok = offs_n < seq_len
        phys = tl.load(bt_row_ptr + (offs_n // KV_BLOCK_SIZE) * stride_btb, mask=key_ok, other=0)
        slot = offs_n % KV_BLOCK_SIZE
        k_rows = k_head_ptr + phys.to(tl.int64) * stride_kb + slot * stride_ks
        v_rows = v_head_ptr + phys.to(tl.int64) * stride_vb + slot * stride_vs
        if PASS > 0:
            offs_pass = 2 * ROT_HALF + tl.arange(0, PASS_P)
            k3 = _load_rows(k_rows, offs_pass, stride_kd, key_ok, offs_pass < HEAD)
            qk = tl.dot(q3, tl.trans(k3), input_precision=DOT_PRECISION)
        else:
            qk = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if ROT_HALF > 0:
            k1, k2 = _load_pair(k_rows, stride_kd, key_ok, BLOCK_N, ROT_HALF, ROT_HALF_P, IS_NEOX)
            if ROTATE_QUERY:
                r1 = f1.to(q1.dtype)
                r2 = f2.to(q1.dtype)
                f1, f2 = _rotate(f1, f2, step_cos[None, :], -step_sin[None, :])
            else:
                block_start = (offs_n // KV_BLOCK_SIZE) * KV_BLOCK_SIZE
                cos, sin = _table_rows(cos_sin_ptr, block_start, key_ok, stride_cs, ROT_HALF, ROT_HALF_P)
                k1, k2 = _rotate(k1, k2, cos, sin)
                r1 = q1
                r2 = q2
            qk = tl.dot(r1, tl.trans(k1), qk, input_precision=DOT_PRECISION)
            qk = tl.dot(r2, tl.trans(k2), qk, input_precision=DOT_PRECISION)
        allowed = (offs_n[None, :] <= q_pos[:, None]) & (offs_n[None, :] >= win_start[:, None])
        if ROTATE_QUERY:
            allowed = allowed & ((offs_j // KV_BLOCK_SIZE)[None, :] == row_rot[:, None])
        qk = tl.where(allowed, qk, float("-inf"))
        # Base-2 online softmax; the scale is folded into one multiply per score.
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_rows(v_rows, offs_v, stride_vd, key_ok, offs_v < HEAD)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _rotate_back_by_offset(q1, q2, row_rot, seq_len, cos_sin_ptr, stride_cs, ROT_HALF: tl.constexpr,
                           ROT_HALF_P: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr):
    """``R(row_rot * KV_BLOCK_SIZE)^T`` of each query row, as a pure rotation (unit-length
    table rows): with the tile's table row applied as is, a table carrying a magnitude
    contributes it exactly once, as when keys are rotated. Rows past the sequence see no
    keys and are left as they are."""
    offs_h = tl.arange(0, ROT_HALF_P)
    offset = row_rot * KV_BLOCK_SIZE
    ok = (offset < seq_len)[:, None] & (offs_h < ROT_HALF)[None, :]
    rows = cos_sin_ptr + offset[:, None] * stride_cs + offs_h[None, :]
    cos = tl.load(rows, mask=ok, other=1.0).to(tl.float32)
    sin = tl.load(rows + ROT_HALF, mask=ok, other=0.0).to(tl.float32)
    cos, sin = _unit(cos, sin)
    return _rotate(q1, q2, cos, -sin)


@triton.jit
def _merge_rotations(acc, m_i, l_i, BLOCK_M: tl.constexpr, HEAD_P: tl.constexpr, NROT: tl.constexpr):
    """Combine each (token, head)'s ``NROT`` consecutive rows (disjoint key sets) into one."""
    m3 = tl.reshape(m_i, (BLOCK_M // NROT, NROT))
    m = tl.max(m3, 1)
    w = tl.math.exp2(m3 - m[:, None])
    l3 = tl.reshape(l_i, (BLOCK_M // NROT, NROT))
    acc3 = tl.reshape(acc, (BLOCK_M // NROT, NROT, HEAD_P))
    return tl.sum(acc3 * w[:, :, None], 1), m, tl.sum(l3 * w, 1)


@triton.jit
def _store_rows(out_ptr, acc, l_i, q_begin, q_len, tile, kv_head, stride_ot, stride_oh, stride_od,
                HEAD: tl.constexpr, HEAD_P: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
                BLOCK_Q: tl.constexpr, ROWS: tl.constexpr):
    """Normalise and store ``ROWS`` merged rows (row ``t``: token ``t // GROUP_P``, head ``t % GROUP_P``)."""
    offs_t = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_P)
    row_tok = tile * BLOCK_Q + offs_t // GROUP_P
    row_head = offs_t % GROUP_P
    row_ok = (row_tok < q_len) & (row_head < GROUP)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_rows = out_ptr + (q_begin + row_tok).to(tl.int64) * stride_ot + (kv_head * GROUP + row_head) * stride_oh
    tl.store(o_rows[:, None] + offs_d[None, :] * stride_od, out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d < HEAD)[None, :])


@triton.jit(do_not_specialize=["num_reqs", "num_splits", "stride_btr", "stride_wsr"])
def _attention_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, block_table_ptr, query_start_loc_ptr, seq_lens_ptr,
    window_starts_ptr, req_flags_ptr, cos_sin_ptr, part_acc_ptr, part_ml_ptr,
    qk_scale, num_reqs, num_splits,
    stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
    stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btr, stride_btb, stride_wsr, stride_wsb, stride_cs,
    HEAD: tl.constexpr,  # head size
    HEAD_P: tl.constexpr,  # head size rounded up to a power of two
    ROT_HALF: tl.constexpr,  # rotary_dim // 2; 0 when keys are already rotated
    ROT_HALF_P: tl.constexpr,
    PASS: tl.constexpr,  # lanes outside the rotary part (head - rotary_dim)
    PASS_P: tl.constexpr,  # PASS rounded up to a power of two (>= 16)
    IS_NEOX: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per kv head
    GROUP_P: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows per tile: BLOCK_Q tokens x GROUP_P heads x NROT (+ padding)
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,  # keys per tile
    NROT: tl.constexpr,  # decode: rows per (token, head), one per KV block of a key tile; else 1
    DECODE: tl.constexpr,  # decode launch: program x = request with q_len <= BLOCK_Q
    SKIP_QLEN_LE: tl.constexpr,  # tile launch: requests with q_len <= this belong to decode
    USE_FLAGS: tl.constexpr,  # tile launch: only requests whose flag is set
    USE_SPLITS: tl.constexpr,  # write partial softmax states for _merge_splits_kernel
    DOT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if not DECODE:
        pid = tl.num_programs(0) - 1 - pid  # the longest (last) query tiles first
    req, tile = _locate_tile(pid, query_start_loc_ptr, num_reqs, BLOCK_Q, DECODE)
    q_begin = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_begin
    if DECODE:
        if (q_len > BLOCK_Q) | (q_len == 0):
            return
    else:
        if (q_len <= SKIP_QLEN_LE) | (tile * BLOCK_Q >= q_len):
            return
        if USE_FLAGS:
            if tl.load(req_flags_ptr + req) == 0:
                return
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len

    # Row m: rotation m % NROT of token tile * BLOCK_Q + t // GROUP_P, head t % GROUP_P (t = m // NROT).
    offs_m = tl.arange(0, BLOCK_M)
    row_rot = offs_m % NROT
    row_tok = tile * BLOCK_Q + (offs_m // NROT) // GROUP_P
    row_head = (offs_m // NROT) % GROUP_P
    row_ok = (row_tok < q_len) & (row_head < GROUP)
    q_pos = ctx_len + row_tok
    q_head = kv_head * GROUP + row_head
    win_start = tl.load(window_starts_ptr + req * stride_wsr + (q_pos // KV_BLOCK_SIZE) * stride_wsb,
                        mask=row_ok, other=0)

    # Keys from the lowest window start to the last query position, split if asked.
    key_lo = (tl.min(tl.where(row_ok, win_start, seq_len), 0) // BLOCK_N) * BLOCK_N
    key_hi = tl.minimum(ctx_len + (tile + 1) * BLOCK_Q, seq_len)
    if USE_SPLITS:
        per_split = tl.cdiv(tl.cdiv(key_hi - key_lo, BLOCK_N), num_splits) * BLOCK_N
        split_lo = key_lo + split * per_split
        key_hi = tl.minimum(key_hi, split_lo + per_split)
        key_lo = tl.minimum(split_lo, key_hi)

    q_rows = q_ptr + (q_begin + row_tok).to(tl.int64) * stride_qt + q_head * stride_qh
    if PASS > 0:
        offs_pass = 2 * ROT_HALF + tl.arange(0, PASS_P)
        q3 = _load_rows(q_rows, offs_pass, stride_qd, row_ok, offs_pass < HEAD)
    if ROT_HALF > 0:
        q1, q2 = _load_pair(q_rows, stride_qd, row_ok, BLOCK_M, ROT_HALF, ROT_HALF_P, IS_NEOX)
        if PASS == 0:
            q3 = q1  # unused
        if DECODE:
            q1, q2 = _rotate_back_by_offset(q1, q2, row_rot, seq_len, cos_sin_ptr, stride_cs, ROT_HALF,
                                            ROT_HALF_P, KV_BLOCK_SIZE)  # fmt: skip
    else:
        q1 = q3  # unused
        q2 = q3

    acc = tl.zeros([BLOCK_M, HEAD_P], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], _NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = _attend_keys(
        acc, m_i, l_i, q1, q2, q3, q_pos, win_start, row_rot, key_lo, key_hi, seq_len, qk_scale,
        block_table_ptr + req.to(tl.int64) * stride_btr, stride_btb,
        k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh,
        stride_kb, stride_ks, stride_kd, stride_vb, stride_vs, stride_vd, cos_sin_ptr, stride_cs,
        HEAD, HEAD_P, ROT_HALF, ROT_HALF_P, PASS, PASS_P, IS_NEOX, DECODE & (ROT_HALF > 0), KV_BLOCK_SIZE,
        BLOCK_M, BLOCK_N, DOT_PRECISION,
    )  # fmt: skip

    if USE_SPLITS:
        offs_d = tl.arange(0, HEAD_P)
        slot = ((pid * tl.num_programs(1) + kv_head) * num_splits + split).to(tl.int64)
        tl.store(part_acc_ptr + slot * (BLOCK_M * HEAD_P) + offs_m[:, None] * HEAD_P + offs_d[None, :], acc)
        tl.store(part_ml_ptr + slot * (2 * BLOCK_M) + offs_m, m_i)
        tl.store(part_ml_ptr + slot * (2 * BLOCK_M) + BLOCK_M + offs_m, l_i)
    else:
        if NROT > 1:
            acc, m_i, l_i = _merge_rotations(acc, m_i, l_i, BLOCK_M, HEAD_P, NROT)
        _store_rows(out_ptr, acc, l_i, q_begin, q_len, tile, kv_head, stride_ot, stride_oh, stride_od,
                    HEAD, HEAD_P, GROUP, GROUP_P, BLOCK_Q, BLOCK_M // NROT)  # fmt: skip


@triton.jit(do_not_specialize=["num_reqs", "num_splits"])
def _merge_splits_kernel(
    out_ptr, part_acc_ptr, part_ml_ptr, query_start_loc_ptr, num_reqs, num_splits,
    stride_ot, stride_oh, stride_od,
    HEAD: tl.constexpr, HEAD_P: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, NROT: tl.constexpr,
):
    """Merge the ``num_splits`` partial softmax states of one (request, kv head) of a decode launch."""
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_begin = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_begin
    if (q_len > BLOCK_Q) | (q_len == 0):
        return
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_P)
    acc = tl.zeros([BLOCK_M, HEAD_P], dtype=tl.float32)
    m_run = tl.full([BLOCK_M], _NEG_BIG, dtype=tl.float32)
    l_run = tl.zeros([BLOCK_M], dtype=tl.float32)
    base = (req * tl.num_programs(1) + kv_head) * num_splits
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
    if NROT > 1:
        acc, m_run, l_run = _merge_rotations(acc, m_run, l_run, BLOCK_M, HEAD_P, NROT)
    _store_rows(out_ptr, acc, l_run, q_begin, q_len, 0, kv_head, stride_ot, stride_oh, stride_od,
                HEAD, HEAD_P, GROUP, GROUP_P, BLOCK_Q, BLOCK_M // NROT)  # fmt: skip


# --------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Launch shape of one path. ``block_m`` counts packed query rows of a tile (tile launch;
    the decode launch sizes its rows from the step)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    num_splits: int | None = None  # None: from the grid size (decode only)


# Fixed per head-size family (first = default), measured on an H200 (docs/benchmarks.md).
# No run-time tuning: every configuration a server uses is compiled by `warmup`.
_PREFILL = {
    64: AttentionConfig(128, 64, 8, 3),
    128: AttentionConfig(128, 64, 8, 3),
    256: AttentionConfig(64, 32, 4, 2),
}
_DECODE = {
    64: AttentionConfig(16, 64, 2, 3),
    128: AttentionConfig(16, 64, 2, 3),
    256: AttentionConfig(16, 32, 4, 2),
}


def _family(head_size: int) -> int:
    return 64 if head_size <= 64 else (128 if head_size <= 128 else 256)


def prefill_config(head_size: int) -> AttentionConfig:
    return _PREFILL[_family(head_size)]


def decode_config(head_size: int) -> AttentionConfig:
    return _DECODE[_family(head_size)]


def _pow2(x: int, minimum: int = 1) -> int:
    return max(minimum, triton.next_power_of_2(max(1, x)))


def decode_query_limit(group: int) -> int:
    """Query tokens per request that the decode launch takes (16 packed rows per rotation)."""
    group_p = _pow2(group)
    return max(16, group_p) // group_p


def decode_block_q(group: int, max_decode_query_len: int) -> int:
    """Tokens per decode tile: 1 for a step of single-token decodes (the common case, and
    CUDA-graph decode), else `decode_query_limit`. Two compiled variants, not one per length."""
    return 1 if max_decode_query_len <= 1 else decode_query_limit(group)


_SM_COUNT: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def _programs_to_fill(num_sms: int, num_warps: int) -> int:
    """Decode programs (requests x kv heads) that fill the GPU without key splits: about
    four warps per SM."""
    return 4 * num_sms // num_warps


def decode_programs_to_fill(device: torch.device, head_size: int) -> int:
    """`_programs_to_fill` at the default decode configuration of a head size."""
    return _programs_to_fill(_num_sms(device), decode_config(head_size).num_warps)


def _split_count(programs: int, key_tiles: int, num_sms: int, num_warps: int) -> int:
    """Key splits when a decode launch has too few programs to fill the GPU: enough for
    about eight warps per SM (rounded down: a partial second wave cost more than it saved
    on the H200), each split keeping >= 4 key tiles, at most 16."""
    enough = _programs_to_fill(num_sms, num_warps)
    if programs >= enough:
        return 1
    return int(max(1, min(2 * enough // max(1, programs), key_tiles // 4, 16)))


@dataclasses.dataclass(frozen=True)
class TileLaunch:
    """What a launch attends: the tensors of `minipic_kernels.attention.paged_rope_attention`."""

    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    window_starts: torch.Tensor
    cos_sin: torch.Tensor
    rotary_dim: int  # 0: keys already rotated
    is_neox: bool
    scale: float
    max_seq_len: int  # upper bound on any request's keys


def launch(
    work: TileLaunch,
    out: torch.Tensor,
    cfg: AttentionConfig,
    *,
    decode: bool,
    num_tokens: int,
    max_query_len: int,
    req_flags: torch.Tensor | None = None,
) -> None:
    """One launch: ``decode`` (requests with <= `decode_query_limit` tokens; ``max_query_len``
    is then the longest of those) or tiles (the others, only flagged ones when `req_flags`
    is given). No host sync."""
    query, key_cache = work.query, work.key_cache
    num_reqs = work.seq_lens.shape[0]
    num_q_heads, head_size = query.shape[1], query.shape[2]
    num_kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
    group = num_q_heads // num_kv_heads
    group_p = _pow2(group)
    limit = decode_query_limit(group)
    rot_half = work.rotary_dim // 2
    block_n, nrot = cfg.block_n, 1
    if decode:
        block_q, num_tiles = decode_block_q(group, max_query_len), num_reqs
        if rot_half:  # key tiles of whole KV blocks, one query row per block
            block_n = max(block_n, block_size)
            nrot = block_n // block_size
        block_m = max(16, block_q * group_p * nrot)
    else:
        block_m = max(cfg.block_m, group_p)
        block_q = block_m // group_p
        num_tiles = min(num_tokens // block_q + num_reqs, num_reqs * triton.cdiv(max_query_len, block_q))
    if num_tiles == 0:
        return
    splits = 1
    if decode:
        splits = cfg.num_splits or _split_count(
            num_tiles * num_kv_heads, triton.cdiv(work.max_seq_len, block_n), _num_sms(query.device), cfg.num_warps
        )
    head_p = _pow2(head_size)
    if splits > 1:
        slots = num_tiles * num_kv_heads * splits
        part_acc = torch.empty(slots * block_m * head_p, dtype=torch.float32, device=query.device)
        part_ml = torch.empty(slots * 2 * block_m, dtype=torch.float32, device=query.device)
    else:
        part_acc = part_ml = out  # never touched
    pass_dim = head_size - 2 * rot_half
    flags = req_flags if req_flags is not None else work.seq_lens
    _attention_kernel[(num_tiles, num_kv_heads, splits)](
        out, query, key_cache, work.value_cache, work.block_table, work.query_start_loc, work.seq_lens,
        work.window_starts, flags, work.cos_sin, part_acc, part_ml,
        work.scale * _LOG2E, num_reqs, splits,
        *query.stride(), *out.stride(), *key_cache.stride(), *work.value_cache.stride(),
        *work.block_table.stride(), *work.window_starts.stride(), work.cos_sin.stride(0),
        HEAD=head_size, HEAD_P=head_p, ROT_HALF=rot_half, ROT_HALF_P=_pow2(rot_half, 16),
        PASS=pass_dim, PASS_P=_pow2(pass_dim, 16), IS_NEOX=work.is_neox, GROUP=group, GROUP_P=group_p,
        KV_BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=block_n, NROT=nrot,
        DECODE=decode, SKIP_QLEN_LE=0 if decode else limit, USE_FLAGS=req_flags is not None,
        USE_SPLITS=splits > 1, DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if splits > 1:
        _merge_splits_kernel[(num_tiles, num_kv_heads)](
            out, part_acc, part_ml, work.query_start_loc, num_reqs, splits, *out.stride(),
            HEAD=head_size, HEAD_P=head_p, GROUP=group, GROUP_P=group_p, BLOCK_M=block_m,
            BLOCK_Q=block_q, NROT=nrot, num_warps=4,
        )  # fmt: skip
