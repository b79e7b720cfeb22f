"""Triton paged attention over position-stamped keys with span windows.

The cache holds keys as the model rotated them where they were computed; each physical
block records that place (`block_origins`). A request whose blocks all sit at their origin
streams K/V as they are (one dot over the whole head, as a stock kernel); a request
reading a cached span elsewhere is taken by a second compiled variant (``MOVE``) whose loop
rotates each key tile in registers by its blocks' shifts (`StepTensors.key_shift`, derived
once per step: the distance from the origin, less the compact shift in the compact reading),
from ``cos_sin`` (a pure rotation, one table row per block). `launch` launches both
variants, each skipping the other's requests: compiled into one kernel, the moved loop
slowed the plain one by 25-30% (docs/benchmarks.md, section 2). Where the whole head
rotates (Llama, Qwen: fixed per model, ``PAIR_HALVES``) the moved loop loads each key tile
as its two rotary-pair halves and scores them half by half, so each key lane is read once;
with partial rotary it gathers each lane's rotary partner a second time.

Two entry points share one body (`_attend_rows`, around one inner loop, `_attend_keys`);
`launch` picks one:

* `_decode_kernel`: one program per (request, kv head, key split) for requests with at most
  `decode_query_limit` query tokens; the key range is split across programs whose partial
  softmax states `_merge_splits_kernel` combines (flash-decoding). K/V go from the cache
  straight into the dot.
* `_prefill_kernel` (the tile launch): programs over query tiles of the requests a
  per-request flag selects; the tile -> request map is a binary search over
  ``query_start_loc`` inside the kernel, so the grid is an upper bound from host ints.

Query rows are *packed by GQA group* (tokens x heads per tile), so each key/value tile is
loaded once per kv head. The key range of a tile runs from the lowest window start of its
rows to its last query position: tiles wholly outside every row's window are never
visited, which keeps Block-Attention prefill linear in the number of spans. Keys of hidden
(HSep) blocks are masked like keys outside the window, in the same inner loop, from the
kind record of each KV block of the tile (`block_kinds.visible`), so hiding adds no
compiled variant: decode and tiles honour it alike. Only requests flagged as having a
hidden block among their keys (`block_kinds.requests_with_hidden`, made once per step)
load those records, behind a branch uniform over the program: paid by every request, that
dependent load slowed decode by 8-13% of FA3's time (docs/benchmarks.md, "Latest"). In the
compact reading (``COMPACT``, a compiled variant per server) the same branch, taken by the
requests with unread keys too (`StepTensors.hidden`), loads each block's unread head and
tail and masks those keys from every read row (an unread row reads causally); and each program rotates its query
tile back by its rows' compact shifts once, in registers (`_rotated_query`), where a torch
rotation before attention cost about ten fp32 copies of the step's queries per layer.

Under a server's span bias (``span_bias``, a runtime argument: no compiled variant) rows outside
every span add it to the scores of keys inside a span, from the window start of each key's
block (`block_kinds.weighed_by_span_bias`); at 0 the branch is skipped, uniform over the launch.

``ROT_HALF == 0`` (``rotary_dim`` 0) compiles rotation out: keys are taken as already in
place, which only the benchmarks' no-rotation baseline and its interpreter test use.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from minipic_kernels.block_kinds import BlockKind
from minipic_protocol.blocks import OUTSIDE_SPANS

__all__ = ["AttentionConfig", "TileLaunch", "decode_config", "decode_programs_to_fill", "launch", "prefill_config"]

_LOG2E = 1.4426950408889634
# Initial running max: finite, so fully masked tiles never produce inf - inf = NaN.
_NEG_BIG = tl.constexpr(-1.0e30)
# The record value of hidden blocks (`block_kinds.hidden_per_block`).
_HIDDEN_KIND = tl.constexpr(int(BlockKind.HSEP))
# The window start of rows and blocks outside every span (`block_kinds.window_starts_per_block`).
_OUTSIDE_SPANS = tl.constexpr(OUTSIDE_SPANS)


@triton.jit
def _locate_tile(pid, query_start_loc_ptr, num_reqs, BLOCK_Q: tl.constexpr):
    """(request, query tile within it) of a tile-launch program: request ``r`` owns programs
    from ``query_start_loc[r] // BLOCK_Q + r`` on; that sequence is increasing, so a binary
    search finds the owner."""
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
def _rotary_lanes(HEAD_P: tl.constexpr, ROT_HALF: tl.constexpr, IS_NEOX: tl.constexpr):
    """Per head lane: its column in the RoPE table, the other lane of its rotary pair, the
    sign that lane enters with, and whether the lane rotates at all
    (neox pairs ``(i, i + half)``, gptj ``(2i, 2i + 1)``)."""
    d = tl.arange(0, HEAD_P)
    if IS_NEOX:
        low = d < ROT_HALF
        column = tl.where(low, d, d - ROT_HALF)
        partner = tl.where(low, d + ROT_HALF, d - ROT_HALF)
        sign = tl.where(low, -1.0, 1.0)
    else:
        column = d // 2
        partner = d ^ 1
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
    rotates = d < 2 * ROT_HALF
    return tl.where(rotates, column, 0), tl.where(rotates, partner, d), tl.where(rotates, sign, 0.0), rotates


@triton.jit
def _pair_lanes(ROT_HALF: tl.constexpr, IS_NEOX: tl.constexpr):
    """The two lanes of each of the ``ROT_HALF`` rotary pairs: neox ``(i, i + half)``, gptj ``(2i, 2i + 1)``."""
    i = tl.arange(0, ROT_HALF)
    if IS_NEOX:
        first, second = i, i + ROT_HALF
    else:
        first, second = 2 * i, 2 * i + 1
    return first, second


@triton.jit
def _tile_blocks(n0, seq_len, bt_row_ptr, stride_btb, KV_BLOCK_SIZE: tl.constexpr, TILE_BLOCKS: tl.constexpr,
                 TILE_ROWS: tl.constexpr):
    """The KV blocks of the key tile from ``n0`` (``TILE_BLOCKS`` x ``TILE_ROWS`` keys): logical
    index, physical id and whether the block holds keys of the request."""
    first = n0 + tl.arange(0, TILE_BLOCKS) * TILE_ROWS
    ok = first < seq_len
    logical = first // KV_BLOCK_SIZE
    return logical, tl.load(bt_row_ptr + logical * stride_btb, mask=ok, other=0), ok


@triton.jit
def _per_key(x, TILE_BLOCKS: tl.constexpr, TILE_ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """A per-block ``[TILE_BLOCKS, WIDTH]`` tensor repeated for each key of its block: ``[BLOCK_N, WIDTH]``."""
    return tl.reshape(tl.broadcast_to(x[:, None, :], [TILE_BLOCKS, TILE_ROWS, WIDTH]), [TILE_BLOCKS * TILE_ROWS, WIDTH])


@triton.jit
def _tile_shifts(n0, seq_len, shift_row_ptr, stride_ksb, KV_BLOCK_SIZE: tl.constexpr, TILE_BLOCKS: tl.constexpr,
                 TILE_ROWS: tl.constexpr):
    """The shift of each KV block of the key tile from ``n0`` (its entry in the request's row of
    `StepTensors.key_shift`; 0 past the request's keys): one load, no block-table load before it."""
    first = n0 + tl.arange(0, TILE_BLOCKS) * TILE_ROWS
    return tl.load(shift_row_ptr + (first // KV_BLOCK_SIZE) * stride_ksb, mask=first < seq_len, other=0)


@triton.jit
def _angles(shift, cos_sin_ptr, stride_cs, column, col_ok, ROT_HALF: tl.constexpr):
    """cos and sin of each ``shift`` (``[N]``) at the table columns ``column`` (masked columns:
    cos 1, sin 0), ``[N, len(column)]`` in the table's dtype. The table holds positive shifts;
    a negative one negates the sine."""
    table = cos_sin_ptr + tl.abs(shift)[:, None] * stride_cs + column[None, :]
    cos = tl.load(table, mask=col_ok[None, :], other=1.0)
    sin = tl.load(table + ROT_HALF, mask=col_ok[None, :], other=0.0)
    return cos, tl.where((shift < 0)[:, None], -sin, sin)


@triton.jit
def _key_angles(shift, cos_sin_ptr, stride_cs, column, col_ok, ROT_HALF: tl.constexpr, TILE_BLOCKS: tl.constexpr,
                TILE_ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """`_angles` of each key's shift (``shift``: one per block of the tile) at the ``WIDTH``
    columns ``column``, ``[BLOCK_N, WIDTH]``: one table row per block of the tile, broadcast to
    its keys."""
    cos, sin = _angles(shift, cos_sin_ptr, stride_cs, column, col_ok, ROT_HALF)
    return _per_key(cos, TILE_BLOCKS, TILE_ROWS, WIDTH), _per_key(sin, TILE_BLOCKS, TILE_ROWS, WIDTH)


@triton.jit
def _rotated_query(q, q_first, q_second, q_rows, stride_qd, row_ok, shift, cos_sin_ptr, stride_cs,
                   HEAD_P: tl.constexpr, ROT_HALF: tl.constexpr, IS_NEOX: tl.constexpr, PAIR_HALVES: tl.constexpr):
    """The query tile rotated by ``shift`` per row (`reference.rotate`): ``q`` (loaded from
    ``q_rows``; each lane's rotary partner gathered a second time) or, with ``PAIR_HALVES``,
    its pair halves ``q_first``/``q_second`` (all `_tile_scores` reads then), rotated pair by
    pair. fp32 math, the query's dtype out; once per program, so a whole tile of rows costs
    one table row each."""
    if PAIR_HALVES:
        column = tl.arange(0, ROT_HALF)
        cos, sin = _angles(shift, cos_sin_ptr, stride_cs, column, column < ROT_HALF, ROT_HALF)
        a, b = q_first.to(tl.float32), q_second.to(tl.float32)
        q_first = (a * cos - b * sin).to(q.dtype)
        q_second = (b * cos + a * sin).to(q.dtype)
    else:
        column, partner, sign, rotates = _rotary_lanes(HEAD_P, ROT_HALF, IS_NEOX)
        cos, sin = _angles(shift, cos_sin_ptr, stride_cs, column, rotates, ROT_HALF)
        other = _load_rows(q_rows, partner, stride_qd, row_ok, rotates)
        q = (q.to(tl.float32) * cos + other.to(tl.float32) * (sin * sign[None, :])).to(q.dtype)
    return q, q_first, q_second


@triton.jit
def _rotated_keys(k, k_rows, stride_kd, key_ok, shift, cos_sin_ptr, stride_cs, column, partner, sign, rotates,
                  HEAD_P: tl.constexpr, ROT_HALF: tl.constexpr, TILE_BLOCKS: tl.constexpr, TILE_ROWS: tl.constexpr):
    """A key tile's rows (``k``, loaded from ``k_rows``) rotated by their block's shift, any
    rotary layout (`_rotary_lanes`): each lane's partner is gathered a second time. fp32
    math, ``k``'s dtype out."""
    cos, sin = _key_angles(shift, cos_sin_ptr, stride_cs, column, rotates, ROT_HALF, TILE_BLOCKS, TILE_ROWS, HEAD_P)
    other = tl.load(k_rows[:, None] + partner[None, :] * stride_kd, mask=key_ok[:, None] & rotates[None, :], other=0.0)
    return (k.to(tl.float32) * cos + other.to(tl.float32) * (sin * sign[None, :])).to(k.dtype)


@triton.jit
def _tile_scores(q, q_first, q_second, k_rows, stride_kd, key_ok, n0, seq_len, shift_row_ptr, stride_ksb,
                 cos_sin_ptr, stride_cs, HEAD: tl.constexpr, HEAD_P: tl.constexpr, ROT_HALF: tl.constexpr,
                 IS_NEOX: tl.constexpr, MOVE: tl.constexpr, PAIR_HALVES: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
                 TILE_BLOCKS: tl.constexpr, TILE_ROWS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Scores ``q . k`` of one key tile (fp32), with ``MOVE`` each key rotated by its block's
    shift first (`_tile_shifts`; the cache's dtype into the dot).

    ``PAIR_HALVES`` (``MOVE`` where the whole head rotates: Llama, Qwen): the tile is loaded
    as its two pair halves (`_pair_lanes`), each lane once, rotated pair by pair in the table's
    dtype (the cache's, as `paged_rope_attention` passes it: bf16 math and table rows read
    from shared memory at half the fp32 width took decode over moved blocks from 1.13x to
    1.03x FA3's time on the H200, benchmarks/results/attention-h200-decode-rotation-dtype.json),
    and scored half by half against the query's halves
    ``q_first``/``q_second`` (the sum of the two dots is the dot over the head). Otherwise
    (partial rotary) a moved tile gathers each lane's partner a second time, in fp32: lanes
    past ``rotary_dim`` do not rotate, so the head has no two halves.
    """
    if PAIR_HALVES:
        first, second = _pair_lanes(ROT_HALF, IS_NEOX)
        every = first < HEAD_P
        shift = _tile_shifts(n0, seq_len, shift_row_ptr, stride_ksb, KV_BLOCK_SIZE, TILE_BLOCKS, TILE_ROWS)
        cos, sin = _key_angles(shift, cos_sin_ptr, stride_cs, tl.arange(0, ROT_HALF), every, ROT_HALF, TILE_BLOCKS,
                               TILE_ROWS, ROT_HALF)  # fmt: skip
        a = _load_rows(k_rows, first, stride_kd, key_ok, every)
        b = _load_rows(k_rows, second, stride_kd, key_ok, every)
        k_first = (a * cos - b * sin).to(a.dtype)
        k_second = (b * cos + a * sin).to(a.dtype)
        qk = tl.dot(q_first, tl.trans(k_first), input_precision=DOT_PRECISION)
        qk = tl.dot(q_second, tl.trans(k_second), qk, input_precision=DOT_PRECISION)
    else:
        offs_d = tl.arange(0, HEAD_P)
        k = _load_rows(k_rows, offs_d, stride_kd, key_ok, offs_d < HEAD)
        if MOVE:
            column, partner, sign, rotates = _rotary_lanes(HEAD_P, ROT_HALF, IS_NEOX)
            shift = _tile_shifts(n0, seq_len, shift_row_ptr, stride_ksb, KV_BLOCK_SIZE, TILE_BLOCKS, TILE_ROWS)
            k = _rotated_keys(k, k_rows, stride_kd, key_ok, shift, cos_sin_ptr, stride_cs, column, partner, sign,
                              rotates, HEAD_P, ROT_HALF, TILE_BLOCKS, TILE_ROWS)  # fmt: skip
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    return qk


@triton.jit
def _per_key_record(record_ptr, phys, ok, TILE_BLOCKS: tl.constexpr, TILE_ROWS: tl.constexpr):
    """A per-block record (``record_ptr[phys]``, 0 where not ``ok``) for each key of the tile: ``[BLOCK_N]``."""
    values = tl.load(record_ptr + phys, mask=ok, other=0)
    return tl.reshape(_per_key(values[:, None], TILE_BLOCKS, TILE_ROWS, 1), [TILE_BLOCKS * TILE_ROWS])


@triton.jit
def _unread_rows(q_pos, seq_len, bt_row_ptr, stride_btb, unread_head_ptr, unread_tail_ptr,
                 KV_BLOCK_SIZE: tl.constexpr):
    """``[rows]``: whether each row's token is unread (`compact_shifts.read_keys`), so reads causally."""
    ok = q_pos < seq_len
    phys = tl.load(bt_row_ptr + (q_pos // KV_BLOCK_SIZE) * stride_btb, mask=ok, other=0).to(tl.int64)
    head = tl.load(unread_head_ptr + phys, mask=ok, other=0)
    tail = tl.load(unread_tail_ptr + phys, mask=ok, other=0)
    slot = q_pos % KV_BLOCK_SIZE
    return ok & ((slot < head) | (slot >= KV_BLOCK_SIZE - tail))


@triton.jit
def _shown_keys(n0, offs_n, seq_len, unread_rows, win_start, bt_row_ptr, stride_btb, block_kind_ptr, unread_head_ptr,
                unread_tail_ptr, KV_BLOCK_SIZE: tl.constexpr, TILE_BLOCKS: tl.constexpr, TILE_ROWS: tl.constexpr,
                UNREAD: tl.constexpr):
    """``[rows, BLOCK_N]``: whether the block records let each row see each key of the tile
    (`block_kinds.visible`): a hidden block's keys only by the rows of the span it opens; with
    ``UNREAD`` (the compact reading) an unread key (`compact_shifts.read_keys`) only by unread
    rows. One load per record and KV block of the tile, broadcast to its keys."""
    _, phys, ok = _tile_blocks(n0, seq_len, bt_row_ptr, stride_btb, KV_BLOCK_SIZE, TILE_BLOCKS, TILE_ROWS)
    kinds = _per_key_record(block_kind_ptr, phys, ok, TILE_BLOCKS, TILE_ROWS)
    own_head = (offs_n - offs_n % KV_BLOCK_SIZE)[None, :] == win_start[:, None]
    shown = (kinds != _HIDDEN_KIND)[None, :] | own_head
    if UNREAD:
        slot = offs_n % KV_BLOCK_SIZE
        head = _per_key_record(unread_head_ptr, phys, ok, TILE_BLOCKS, TILE_ROWS)
        tail = _per_key_record(unread_tail_ptr, phys, ok, TILE_BLOCKS, TILE_ROWS)
        read = (slot >= head) & (slot < KV_BLOCK_SIZE - tail)
        shown = shown & (read[None, :] | unread_rows[:, None])
    return shown


@triton.jit
def _attend_keys(acc, m_i, l_i, q, q_first, q_second, q_pos, unread_rows, win_start, key_lo, key_hi, seq_len, qk_scale,
                 span_bias, has_hidden, ws_row_ptr, stride_wsb, bt_row_ptr, stride_btb, block_kind_ptr, unread_head_ptr,
                 unread_tail_ptr, shift_row_ptr, stride_ksb, k_head_ptr, v_head_ptr, stride_kb, stride_ks, stride_kd,
                 stride_vb, stride_vs, stride_vd, cos_sin_ptr, stride_cs, HEAD: tl.constexpr, HEAD_P: tl.constexpr,
                 ROT_HALF: tl.constexpr, IS_NEOX: tl.constexpr, MOVE: tl.constexpr, PAIR_HALVES: tl.constexpr,
                 KV_BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, TILE_BLOCKS: tl.constexpr, UNREAD: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """Online-softmax attention of the query tile over keys ``[key_lo, key_hi)``, each row
    masked by `block_kinds.visible` (causal, its window, hidden blocks other than its own
    span's head) and, with ``UNREAD``, unread keys from read rows; with ``MOVE`` (a request
    reading some block shifted) each key tile is first rotated by its blocks' shifts (`_tile_scores`).
    ``span_bias`` (the server's span bias over the softmax scale: a score offset) is added to the
    scores of span keys read by rows outside every span (`block_kinds.weighed_by_span_bias`), from
    the window start of each key's block (``ws_row_ptr``); 0 skips it, a branch uniform over the launch.

    The record mask costs a record load per KV block of each tile, after the block-table
    load it depends on; ``has_hidden`` (the request's flag, `StepTensors.hidden`) skips it, a
    branch uniform over the program, for the requests (nearly all) without a hidden block or
    unread key among their keys.
    """
    offs_j = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_P)
    d_ok = offs_d < HEAD
    for n0 in range(key_lo, key_hi, BLOCK_N):
        offs_n = n0 + offs_j
        key_ok = offs_n < seq_len
        phys = tl.load(bt_row_ptr + (offs_n // KV_BLOCK_SIZE) * stride_btb, mask=key_ok, other=0)
        k_rows = k_head_ptr + phys.to(tl.int64) * stride_kb + (offs_n % KV_BLOCK_SIZE) * stride_ks
        v_rows = v_head_ptr + phys.to(tl.int64) * stride_vb + (offs_n % KV_BLOCK_SIZE) * stride_vs
        qk = _tile_scores(q, q_first, q_second, k_rows, stride_kd, key_ok, n0, seq_len, shift_row_ptr, stride_ksb,
                          cos_sin_ptr, stride_cs, HEAD, HEAD_P, ROT_HALF, IS_NEOX, MOVE, PAIR_HALVES, KV_BLOCK_SIZE,
                          TILE_BLOCKS, BLOCK_N // TILE_BLOCKS, DOT_PRECISION)  # fmt: skip
        allowed = (offs_n[None, :] <= q_pos[:, None]) & (offs_n[None, :] >= win_start[:, None])
        if has_hidden:
            allowed = allowed & _shown_keys(n0, offs_n, seq_len, unread_rows, win_start, bt_row_ptr, stride_btb,
                                            block_kind_ptr, unread_head_ptr, unread_tail_ptr, KV_BLOCK_SIZE,
                                            TILE_BLOCKS, BLOCK_N // TILE_BLOCKS, UNREAD)  # fmt: skip
        if span_bias != 0.0:
            key_win = tl.load(ws_row_ptr + (offs_n // KV_BLOCK_SIZE) * stride_wsb, mask=key_ok, other=_OUTSIDE_SPANS)
            weighed = (win_start == _OUTSIDE_SPANS)[:, None] & (key_win != _OUTSIDE_SPANS)[None, :]
            qk = tl.where(weighed, qk + span_bias, qk)
        qk = tl.where(allowed, qk, float("-inf"))
        # Base-2 online softmax; the scale is folded into one multiply per score.
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_rows(v_rows, offs_d, stride_vd, key_ok, d_ok)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _store_rows(out_ptr, acc, l_i, q_begin, q_len, tile, kv_head, stride_ot, stride_oh, stride_od,
                HEAD: tl.constexpr, HEAD_P: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
                BLOCK_Q: tl.constexpr, ROWS: tl.constexpr):
    """Normalise and store ``ROWS`` rows (row ``t``: token ``t // GROUP_P``, head ``t % GROUP_P``)."""
    offs_t = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_P)
    row_tok = tile * BLOCK_Q + offs_t // GROUP_P
    row_head = offs_t % GROUP_P
    row_ok = (row_tok < q_len) & (row_head < GROUP)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_rows = out_ptr + (q_begin + row_tok).to(tl.int64) * stride_ot + (kv_head * GROUP + row_head) * stride_oh
    tl.store(o_rows[:, None] + offs_d[None, :] * stride_od, out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d < HEAD)[None, :])


@triton.jit
def _attend_rows(
    out_ptr, q_ptr, k_ptr, v_ptr, block_table_ptr, block_kind_ptr, unread_head_ptr, unread_tail_ptr, key_shift_ptr,
    query_shift_ptr, req_hidden_ptr, seq_lens_ptr, window_starts_ptr, cos_sin_ptr, part_acc_ptr, part_ml_ptr, req, tile,
    q_begin, q_len, kv_head, split, qk_scale, span_bias, num_splits,
    stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
    stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btr, stride_btb, stride_wsr, stride_wsb, stride_ksr, stride_ksb, stride_cs,
    HEAD: tl.constexpr, HEAD_P: tl.constexpr, ROT_HALF: tl.constexpr, IS_NEOX: tl.constexpr, GROUP: tl.constexpr,
    GROUP_P: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr, TILE_BLOCKS: tl.constexpr, MOVE: tl.constexpr, PAIR_HALVES: tl.constexpr,
    COMPACT: tl.constexpr, USE_SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """The body both entry points share: query tile ``tile`` of request ``req`` against one
    kv head's keys (split ``split`` of ``num_splits``; with ``USE_SPLITS``, decode only, a
    partial softmax state for `_merge_splits_kernel`), each row within its window; with
    ``COMPACT`` each row rotated back by its query shift first."""
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len

    # Row m: token tile * BLOCK_Q + m // GROUP_P, head m % GROUP_P.
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_P)
    row_tok = tile * BLOCK_Q + offs_m // GROUP_P
    row_head = offs_m % GROUP_P
    row_ok = (row_tok < q_len) & (row_head < GROUP)
    q_pos = ctx_len + row_tok
    win_start = tl.load(window_starts_ptr + req * stride_wsr + (q_pos // KV_BLOCK_SIZE) * stride_wsb,
                        mask=row_ok, other=0)

    # Keys from the lowest window start (OUTSIDE_SPANS: 0) to the last query position, split if asked.
    key_lo = (tl.min(tl.where(row_ok, tl.maximum(win_start, 0), seq_len), 0) // BLOCK_N) * BLOCK_N
    key_hi = tl.minimum(ctx_len + (tile + 1) * BLOCK_Q, seq_len)
    if USE_SPLITS:
        per_split = tl.cdiv(tl.cdiv(key_hi - key_lo, BLOCK_N), num_splits) * BLOCK_N
        split_lo = key_lo + split * per_split
        key_hi = tl.minimum(key_hi, split_lo + per_split)
        key_lo = tl.minimum(split_lo, key_hi)

    q_rows = q_ptr + (q_begin + row_tok).to(tl.int64) * stride_qt + (kv_head * GROUP + row_head) * stride_qh
    q = _load_rows(q_rows, offs_d, stride_qd, row_ok, offs_d < HEAD)
    if PAIR_HALVES:  # the query's pair halves, as `_tile_scores` scores moved keys
        first, second = _pair_lanes(ROT_HALF, IS_NEOX)
        q_first = _load_rows(q_rows, first, stride_qd, row_ok, first < HEAD_P)
        q_second = _load_rows(q_rows, second, stride_qd, row_ok, second < HEAD_P)
    else:
        q_first, q_second = q, q  # unused
    if COMPACT:  # rows at compact positions: rotate back by their shift (`StepTensors.query_shift`)
        shift = tl.load(query_shift_ptr + q_begin + row_tok, mask=row_ok, other=0)
        q, q_first, q_second = _rotated_query(q, q_first, q_second, q_rows, stride_qd, row_ok, -shift, cos_sin_ptr,
                                              stride_cs, HEAD_P, ROT_HALF, IS_NEOX, PAIR_HALVES)  # fmt: skip
    has_hidden = tl.load(req_hidden_ptr + req) != 0  # once per program: see `_attend_keys`
    bt_row_ptr = block_table_ptr + req.to(tl.int64) * stride_btr
    unread_rows = q_pos < 0  # none outside the compact reading; in it, loaded once per program, not per key tile
    if COMPACT:
        unread_rows = _unread_rows(q_pos, seq_len, bt_row_ptr, stride_btb, unread_head_ptr, unread_tail_ptr,
                                   KV_BLOCK_SIZE)  # fmt: skip
    acc = tl.zeros([BLOCK_M, HEAD_P], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], _NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = _attend_keys(
        acc, m_i, l_i, q, q_first, q_second, q_pos, unread_rows, win_start, key_lo, key_hi, seq_len, qk_scale,
        span_bias, has_hidden, window_starts_ptr + req * stride_wsr, stride_wsb, bt_row_ptr, stride_btb, block_kind_ptr,
        unread_head_ptr, unread_tail_ptr, key_shift_ptr + req.to(tl.int64) * stride_ksr, stride_ksb,
        k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh, stride_kb, stride_ks, stride_kd, stride_vb,
        stride_vs, stride_vd, cos_sin_ptr, stride_cs, HEAD, HEAD_P, ROT_HALF, IS_NEOX, MOVE, PAIR_HALVES,
        KV_BLOCK_SIZE, BLOCK_N, TILE_BLOCKS, COMPACT, DOT_PRECISION,
    )  # fmt: skip

    if USE_SPLITS:
        slot = ((req * tl.num_programs(1) + kv_head) * num_splits + split).to(tl.int64)
        tl.store(part_acc_ptr + slot * (BLOCK_M * HEAD_P) + offs_m[:, None] * HEAD_P + offs_d[None, :], acc)
        tl.store(part_ml_ptr + slot * (2 * BLOCK_M) + offs_m, m_i)
        tl.store(part_ml_ptr + slot * (2 * BLOCK_M) + BLOCK_M + offs_m, l_i)
    else:
        _store_rows(out_ptr, acc, l_i, q_begin, q_len, tile, kv_head, stride_ot, stride_oh, stride_od,
                    HEAD, HEAD_P, GROUP, GROUP_P, BLOCK_Q, BLOCK_M)  # fmt: skip


@triton.jit
def _other_variant(req_moved_ptr, req, ROT_HALF: tl.constexpr, MOVE: tl.constexpr):
    """Whether ``req`` belongs to the other compiled variant of its launch: the moved loop
    (``MOVE``) takes the requests reading a block away from its origin, the plain one the rest."""
    if ROT_HALF > 0:
        return (tl.load(req_moved_ptr + req) != 0) != MOVE
    return False


@triton.jit(do_not_specialize=["num_reqs", "num_splits", "stride_btr", "stride_wsr", "stride_ksr"])
def _decode_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, block_table_ptr, block_kind_ptr, unread_head_ptr, unread_tail_ptr, key_shift_ptr,
    query_shift_ptr, req_moved_ptr, req_hidden_ptr, query_start_loc_ptr, seq_lens_ptr, window_starts_ptr, cos_sin_ptr,
    part_acc_ptr, part_ml_ptr, qk_scale, span_bias, num_reqs, num_splits,
    stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
    stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btr, stride_btb, stride_wsr, stride_wsb, stride_ksr, stride_ksb, stride_cs,
    HEAD: tl.constexpr,  # head size
    HEAD_P: tl.constexpr,  # head size rounded up to a power of two
    ROT_HALF: tl.constexpr,  # rotary_dim // 2; 0 when keys are already where they are read
    IS_NEOX: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per kv head
    GROUP_P: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows per tile: BLOCK_Q tokens x GROUP_P heads (+ padding)
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,  # keys per tile
    TILE_BLOCKS: tl.constexpr,  # KV blocks per key tile (1 when a tile is part of one block)
    MOVE: tl.constexpr,  # this launch takes the requests reading some block shifted (`StepTensors.moved`)
    PAIR_HALVES: tl.constexpr,  # MOVE with the whole head rotating: keys by pair halves (`_tile_scores`)
    # the compact reading: flagged requests mask unread keys too (`_shown_keys`), every row rotates back by its
    # query shift (`_rotated_query`)
    COMPACT: tl.constexpr,
    USE_SPLITS: tl.constexpr,  # write partial softmax states for _merge_splits_kernel
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Decode: program (request, kv head, key split) for the requests with at most
    ``BLOCK_Q`` query tokens, all of them in one tile."""
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_begin = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_begin
    if (q_len > BLOCK_Q) | (q_len == 0):
        return
    if _other_variant(req_moved_ptr, req, ROT_HALF, MOVE):
        return
    _attend_rows(
        out_ptr, q_ptr, k_ptr, v_ptr, block_table_ptr, block_kind_ptr, unread_head_ptr, unread_tail_ptr, key_shift_ptr,
        query_shift_ptr, req_hidden_ptr, seq_lens_ptr, window_starts_ptr, cos_sin_ptr, part_acc_ptr, part_ml_ptr, req,
        0, q_begin, q_len, kv_head, split, qk_scale, span_bias, num_splits,
        stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
        stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
        stride_btr, stride_btb, stride_wsr, stride_wsb, stride_ksr, stride_ksb, stride_cs,
        HEAD, HEAD_P, ROT_HALF, IS_NEOX, GROUP, GROUP_P, KV_BLOCK_SIZE, BLOCK_M, BLOCK_Q, BLOCK_N, TILE_BLOCKS, MOVE,
        PAIR_HALVES, COMPACT, USE_SPLITS, DOT_PRECISION,
    )  # fmt: skip


@triton.jit(do_not_specialize=["num_reqs", "stride_btr", "stride_wsr", "stride_ksr"])
def _prefill_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, block_table_ptr, block_kind_ptr, unread_head_ptr, unread_tail_ptr, key_shift_ptr,
    query_shift_ptr, req_moved_ptr, req_hidden_ptr, query_start_loc_ptr, seq_lens_ptr, window_starts_ptr, cos_sin_ptr,
    req_flags_ptr, qk_scale, span_bias, num_reqs,
    stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
    stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btr, stride_btb, stride_wsr, stride_wsb, stride_ksr, stride_ksb, stride_cs,
    HEAD: tl.constexpr, HEAD_P: tl.constexpr, ROT_HALF: tl.constexpr, IS_NEOX: tl.constexpr, GROUP: tl.constexpr,
    GROUP_P: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr, TILE_BLOCKS: tl.constexpr, MOVE: tl.constexpr, PAIR_HALVES: tl.constexpr,
    COMPACT: tl.constexpr,  # the compact reading (`_decode_kernel`)
    SKIP_QLEN_LE: tl.constexpr,  # requests with q_len <= this belong to the decode launch
    USE_FLAGS: tl.constexpr,  # only requests whose flag is set
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Prefill (the tile launch): program (query tile, kv head) over the requests with more
    query tokens than decode takes, the longest (last) tiles first; the parameters are
    `_decode_kernel`'s."""
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    req, tile = _locate_tile(pid, query_start_loc_ptr, num_reqs, BLOCK_Q)
    q_begin = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_begin
    if (q_len <= SKIP_QLEN_LE) | (tile * BLOCK_Q >= q_len):
        return
    if USE_FLAGS:
        if tl.load(req_flags_ptr + req) == 0:
            return
    if _other_variant(req_moved_ptr, req, ROT_HALF, MOVE):
        return
    _attend_rows(
        out_ptr, q_ptr, k_ptr, v_ptr, block_table_ptr, block_kind_ptr, unread_head_ptr, unread_tail_ptr, key_shift_ptr,
        query_shift_ptr, req_hidden_ptr, seq_lens_ptr, window_starts_ptr, cos_sin_ptr, out_ptr, out_ptr, req, tile,
        q_begin, q_len, kv_head, 0, qk_scale, span_bias, 1,
        stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
        stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
        stride_btr, stride_btb, stride_wsr, stride_wsb, stride_ksr, stride_ksb, stride_cs,
        HEAD, HEAD_P, ROT_HALF, IS_NEOX, GROUP, GROUP_P, KV_BLOCK_SIZE, BLOCK_M, BLOCK_Q, BLOCK_N, TILE_BLOCKS, MOVE,
        PAIR_HALVES, COMPACT, False, DOT_PRECISION,
    )  # fmt: skip


@triton.jit(do_not_specialize=["num_reqs", "num_splits"])
def _merge_splits_kernel(
    out_ptr, part_acc_ptr, part_ml_ptr, query_start_loc_ptr, num_reqs, num_splits,
    stride_ot, stride_oh, stride_od,
    HEAD: tl.constexpr, HEAD_P: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
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
    _store_rows(out_ptr, acc, l_run, q_begin, q_len, 0, kv_head, stride_ot, stride_oh, stride_od,
                HEAD, HEAD_P, GROUP, GROUP_P, BLOCK_Q, BLOCK_M)  # fmt: skip


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
    # 3 stages: at the served shapes (146 requests over 1,000-1,500 moved keys) 1.15x FA3's time against 1.21x with
    # 4, every other case within 0.02 (benchmarks/results/attention-h200-7e20d4e-served-decode.json); 5 or 6 slow
    # decode at origin by up to 34% (attention-h200-f1c082d-decode-configs.json).
    128: AttentionConfig(16, 64, 2, 3),
    256: AttentionConfig(16, 32, 4, 2),
}


def _family(head_size: int) -> int:
    return 64 if head_size <= 64 else (128 if head_size <= 128 else 256)


def prefill_config(head_size: int) -> AttentionConfig:
    return _PREFILL[_family(head_size)]


def decode_config(head_size: int) -> AttentionConfig:
    return _DECODE[_family(head_size)]


@functools.cache
def _pow2(x: int, minimum: int = 1) -> int:
    """The launch's padded sizes (memoised: every layer of every step asks again)."""
    return max(minimum, triton.next_power_of_2(max(1, x)))


def decode_query_limit(group: int) -> int:
    """Query tokens per request that the decode launch takes (16 packed query rows)."""
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
    block_kind: torch.Tensor  # per physical block: `BlockKind` (hidden blocks are masked)
    block_origin: torch.Tensor  # per physical block (the scratch-page pre-pass moves keys by it)
    key_shift: torch.Tensor  # per request and logical block: how far its keys move (`StepTensors.key_shift`)
    moved: torch.Tensor  # per request: some block's keys move (`StepTensors.moved`)
    hidden: torch.Tensor  # per request: keys its rows may skip by their records (`StepTensors.hidden`)
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    window_starts: torch.Tensor
    cos_sin: torch.Tensor  # the unit rotation table, in the key cache's dtype (`paged_rope_attention`)
    rotary_dim: int  # 0: keys already where this launch reads them
    is_neox: bool
    scale: float
    max_seq_len: int  # upper bound on any request's keys
    # the compact reading's (unread_head, unread_tail) per physical block (`compact_shifts`): None outside it
    unread: tuple[torch.Tensor, torch.Tensor] | None = None
    # the compact reading's (num_tokens,) int32 shift per query row, each row rotated back by it in the kernels
    # (`StepTensors.query_shift`): given with ``unread``, None outside the reading
    query_shift: torch.Tensor | None = None
    span_bias: float = 0.0  # the server's span bias (`reference.paged_rope_attention_reference`)

    def __post_init__(self) -> None:
        if (self.unread is None) != (self.query_shift is None):
            raise ValueError("the compact reading takes both the unread records and the query shifts")


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
    is then the longest of those) or tiles (the others, only flagged ones when `req_flags` is
    given). No host sync."""
    query, key_cache = work.query, work.key_cache
    num_reqs = work.seq_lens.shape[0]
    num_q_heads, head_size = query.shape[1], query.shape[2]
    num_kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
    group = num_q_heads // num_kv_heads
    group_p = _pow2(group)
    if decode:
        block_q = decode_block_q(group, max_query_len)
        block_m, num_tiles = max(16, block_q * group_p), num_reqs
    else:
        block_m = max(cfg.block_m, group_p)
        block_q = block_m // group_p
        # Request r's tiles start at program query_start_loc[r] // block_q + r (`_locate_tile`), so
        # its last one is below num_tokens // block_q + num_reqs; counting tiles per request instead
        # (num_reqs * cdiv(max_query_len, block_q)) left the last requests of many short ones out.
        num_tiles = num_tokens // block_q + num_reqs
    if num_tiles == 0:
        return
    splits = 1
    if decode:
        splits = cfg.num_splits or _split_count(
            num_tiles * num_kv_heads, triton.cdiv(work.max_seq_len, cfg.block_n), _num_sms(query.device),
            cfg.num_warps,
        )  # fmt: skip
    head_p = _pow2(head_size)
    if splits > 1:
        slots = num_tiles * num_kv_heads * splits
        part_acc = torch.empty(slots * block_m * head_p, dtype=torch.float32, device=query.device)
        part_ml = torch.empty(slots * 2 * block_m, dtype=torch.float32, device=query.device)
    else:
        part_acc = part_ml = out  # never touched
    compact = work.unread is not None
    # Loaded only with COMPACT; otherwise any tensor of the step stands in.
    unread_head, unread_tail = work.unread or (work.block_kind, work.block_kind)
    query_shift = work.query_shift if work.query_shift is not None else work.key_shift
    head_args = (out, query, key_cache, work.value_cache, work.block_table, work.block_kind, unread_head, unread_tail,
                 work.key_shift, query_shift, work.moved, work.hidden, work.query_start_loc, work.seq_lens,
                 work.window_starts, work.cos_sin)
    strides = (*query.stride(), *out.stride(), *key_cache.stride(), *work.value_cache.stride(),
               *work.block_table.stride(), *work.window_starts.stride(), *work.key_shift.stride(),
               work.cos_sin.stride(0))
    shape = dict(HEAD=head_size, HEAD_P=head_p, ROT_HALF=work.rotary_dim // 2, IS_NEOX=work.is_neox, GROUP=group,
                 GROUP_P=group_p, KV_BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=cfg.block_n,
                 TILE_BLOCKS=max(1, cfg.block_n // block_size), COMPACT=compact,
                 DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
                 num_warps=cfg.num_warps, num_stages=cfg.num_stages)  # fmt: skip
    score_bias = work.span_bias / work.scale  # added to q . k, which the kernels scale by `work.scale`
    for move in (False, True) if work.rotary_dim else (False,):
        # PAIR_HALVES: tl.dot takes halves of at least 16 lanes.
        variant = dict(MOVE=move, PAIR_HALVES=move and work.rotary_dim == head_p and work.rotary_dim >= 32)
        if decode:
            _decode_kernel[(num_tiles, num_kv_heads, splits)](
                *head_args, part_acc, part_ml, work.scale * _LOG2E, score_bias, num_reqs, splits, *strides, **shape,
                **variant, USE_SPLITS=splits > 1,
            )  # fmt: skip
        else:
            _prefill_kernel[(num_tiles, num_kv_heads)](
                *head_args, req_flags if req_flags is not None else work.seq_lens, work.scale * _LOG2E, score_bias,
                num_reqs, *strides, **shape, **variant, SKIP_QLEN_LE=decode_query_limit(group),
                USE_FLAGS=req_flags is not None,
            )  # fmt: skip
    if splits > 1:
        _merge_splits_kernel[(num_tiles, num_kv_heads)](
            out, part_acc, part_ml, work.query_start_loc, num_reqs, splits, *out.stride(),
            HEAD=head_size, HEAD_P=head_p, GROUP=group, GROUP_P=group_p, BLOCK_M=block_m,
            BLOCK_Q=block_q, num_warps=4 if block_m <= 16 else 8,
        )  # fmt: skip
