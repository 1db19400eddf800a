"""Batch-invariant attention with exported LSE: varlen training forward / backward and paged decode.

Layout: packed tokens. q [N, Hq, D], k / v [N, Hkv, D], cu_seqlens int32 [S + 1]; out [N, Hq, D] in
the inputs' dtype; lse float32 [Hq, N], natural log: lse[h, t] = log sum_j exp(scale * q_t . k_j).

Arithmetic (docs/attention.md, rlk_triton/ops/reduction.py "Attention"):
  * one program per (sequence, query block of BLOCK_M rows, q head); blocks are measured from the
    sequence's start, so packing never changes which rows share a tile or which keys a tile sees;
  * KV blocks of BLOCK_N keys are folded in ascending order by attn_block_update (the one per-block
    online-softmax update, shared by the training forward and the decode kernel), in log2 units:
    s2 = (q @ k^T) * (scale * log2 e), p = exp2(s2 - m_new); the blocks every row of a tile sees
    whole are folded without the mask in a first loop, the rest masked in a second (same order, same
    bits: the scores' product is rounded on its own, see _scores);
  * out = acc / l in fp32, rounded once to the inputs' dtype at the store; lse = (m + log2 l) * ln 2.
Backward: delta = rowsum(dO * O) - dLSE (fp32), then one program per (sequence, KV block, kv head)
for dk / dv (q heads of the group, then query blocks, in ascending order; configs scores_t computes
each block's scores transposed, the same sums in the same order) and one per (sequence, query block,
q head) for dq (KV blocks ascending). No atomics: every gradient element is written by
exactly one program, so the backward is deterministic and batch-invariant.

Decode: one program per (query row block, sequence, kv head) by default: its rows are the (new token,
q head) pairs of the kv head's GQA group, so K / V are read once for all of the group's q heads. KV
blocks of BLOCK_N keys (locked equal to the forward's) are read through the block table by LOGICAL
block from position 0; page_size must be a multiple of BLOCK_N so that a KV block never straddles two
pages (prefill chunks read the next block's page id one block ahead: configs page_ahead). Each row
folds the same KV blocks with the same masked scores as in the training forward; the
blocks past its own position (another row of the tile reaches further) leave its state unchanged. Which
rows share a tile, block_m and num_warps are free only as far as the GPU gate proves: the configs of
the decode kernel form a bit class with the forward's (configs.BIT_CLASSES, tests/test_config_classes.py).

Memory safety (validate=False): every offset, length and page id read from memory is clamped to the
tensor it indexes (_span, the decode kernel's kv_len and page), and programs stride over query / KV
blocks by the grid, so a max_seqlen shorter than a sequence only costs time. Valid input is unchanged
by both; invalid offsets give undefined values (tokens outside every clamped sequence are not
written), never a read or write outside a tensor. The forward's K / V reads through TMA descriptors
(configs tma_loads) cover the whole tensor: rows past it read zeros (the hardware's bounds); the next
sequence's V rows are zeroed in the masked blocks (its K only reaches masked scores).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import configs
from .._runtime import arch_of, interpreter_active
from .matmul import INTERPRETED_DOT, mma, mma_new, operand_flags
from .dispatch import autograd_op, direct
from .launch import SLOT, Template, cached, cdiv, planned

LOG2E = 1.4426950408889634
INT32_MAX = 2**31 - 1


# ---- the shared per-row arithmetic: used by the training forward and the decode kernel ----

@triton.jit
def _qk(q, k, IEEE: tl.constexpr):
    """q [BM, D] @ k^T -> [BM, BN] fp32 (IEEE fp32 products for fp32 inputs, never TF32)."""
    return mma_new(q, tl.trans(k), IEEE)


@triton.jit
def _lowp(x, DT: tl.constexpr, UPCAST: tl.constexpr):
    """Round an fp32 tile to the operands' dtype DT for a tensor-core dot (fp32: unchanged). Under the
    interpreter bf16 dots are wrong, so the rounded value is widened back (exact)."""
    y = x.to(DT)
    if UPCAST:
        y = y.to(tl.float32)
    return y


@triton.jit
def _scores(q, k, qk_scale, IEEE: tl.constexpr):
    """(q @ k^T) * qk_scale, fp32, the product rounded on its own: PTX mul.rn is never contracted into
    the exp2's subtraction (an FMA would round once), so a block's scores are the same bits whether
    attn_block_update masks them or not."""
    qk = _qk(q, k, IEEE)
    if INTERPRETED_DOT:  # NumPy: no contraction
        return qk * qk_scale
    return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [qk, qk_scale], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def attn_block_update(q, k, v, m, l, acc, qk_scale, valid, DT: tl.constexpr, UPCAST: tl.constexpr,
                      IEEE: tl.constexpr, MASKED: tl.constexpr):
    """Fold one KV block into the per-row state (m, l, acc). m is in log2 units (scores times
    scale * log2 e). With MASKED, `valid` [BM, BN] masks keys a row must not see (causal, beyond the
    sequence); without it every key of the block is visible to every row (`valid` unused), which is
    the same arithmetic on the same bits minus the select. A block with no valid key for a row leaves
    that row's (m, l, acc) bitwise unchanged: the max is unchanged, alpha = exp2(0) = 1,
    p = exp2(-inf) = 0 (and +0.0 products leave acc as is)."""
    s = _scores(q, k, qk_scale, IEEE)
    if MASKED:
        s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    # While a row has seen no valid key, shift by 0 instead of -inf: no -inf - -inf = NaN.
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - shift[:, None])
    alpha = tl.exp2(m - shift)
    l = l * alpha + tl.sum(p, 1)
    acc = mma(_lowp(p, DT, UPCAST), v, acc * alpha[:, None], IEEE)
    return m_new, l, acc


@triton.jit
def attn_finalize(m, l, acc):
    """(out fp32, lse natural log) of a state; a row without any valid key gives out 0, lse -inf."""
    empty = l == 0.0
    l_safe = tl.where(empty, 1.0, l)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m + tl.log2(l_safe)) * 0.6931471805599453)
    return out, lse


@triton.jit
def _load_rows(ptr, rows, ok, stride_t, rd, UPCAST: tl.constexpr):
    """Rows [len(rows), D] of one head (ptr already offset to the head); masked rows read 0."""
    x = tl.load(ptr + rows.to(tl.int64)[:, None] * stride_t + rd[None, :], mask=ok[:, None], other=0.0)
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _span(cu_ptr, i, n):
    """(start, length) of sequence i from offsets cu, clamped into [0, n): valid offsets are unchanged;
    with validate=False, offsets past the tensor or decreasing give a shorter (or empty) sequence,
    never an index outside it. cu_ptr None: the offsets 0, 1, 2, ... (one token per sequence, a decode
    step) without a tensor to read."""
    if cu_ptr is None:
        start = tl.minimum(i, n)
        end = tl.minimum(i + 1, n)
    else:
        start = tl.minimum(tl.maximum(tl.load(cu_ptr + i), 0), n)
        end = tl.minimum(tl.maximum(tl.load(cu_ptr + i + 1), start), n)
    return start, end - start


# ---- training forward ----

@cached
@triton.jit
def _fwd_kernel(
    q_ptr, k_ptr, v_ptr, k_desc, v_desc, out_ptr, lse_ptr, cu_ptr,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, slse_h,
    m_st_ptr, l_st_ptr, acc_st_ptr, s_st_h, sacc_t, sacc_h,
    qk_scale, kv_lo, kv_hi, N,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
    STATE_IN: tl.constexpr, STATE_OUT: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TMA: tl.constexpr, FLAT: tl.constexpr, HEAVY_FIRST: tl.constexpr,
):
    seq = tl.program_id(1)
    h = tl.program_id(2)
    start, seq_len = _span(cu_ptr, seq, N)
    n_tiles = tl.cdiv(seq_len, BLOCK_M)
    # Row blocks stride by the grid: a max_seqlen shorter than the sequence costs time, not rows.
    first = _first_tile(HEAVY_FIRST)
    if FLAT:  # the grid's own tile in a straight line; the stride loop only for tiles past the grid
        if first < n_tiles:
            _fwd_row_block(q_ptr, k_ptr, v_ptr, k_desc, v_desc, out_ptr, lse_ptr, sq_t, sq_h, sk_t, sk_h, sv_t,
                           sv_h, so_t, so_h, slse_h, m_st_ptr, l_st_ptr, acc_st_ptr, s_st_h, sacc_t, sacc_h,
                           qk_scale, kv_lo, kv_hi, first, h, start, seq_len, GROUP, HEAD_DIM, CAUSAL, STATE_IN,
                           STATE_OUT, UPCAST, IEEE, BLOCK_M, BLOCK_N, TMA)
        first += tl.num_programs(0)
    for mb in range(first, n_tiles, tl.num_programs(0)):
        _fwd_row_block(q_ptr, k_ptr, v_ptr, k_desc, v_desc, out_ptr, lse_ptr, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h,
                       so_t, so_h, slse_h, m_st_ptr, l_st_ptr, acc_st_ptr, s_st_h, sacc_t, sacc_h, qk_scale, kv_lo,
                       kv_hi, mb, h, start, seq_len, GROUP, HEAD_DIM, CAUSAL, STATE_IN, STATE_OUT, UPCAST, IEEE,
                       BLOCK_M, BLOCK_N, TMA)


@triton.jit
def _first_tile(HEAVY_FIRST: tl.constexpr):
    """The first query tile of this program along grid axis 0 (then every num_programs(0)-th):
    program i takes tile i, or with HEAVY_FIRST the grid's tile from the end (the longest causal rows
    start first). Which program runs a tile, never the tile's math."""
    first = tl.program_id(0)
    if HEAVY_FIRST:
        first = tl.num_programs(0) - 1 - first
    return first


@triton.jit
def _kv_rows(k_head, v_head, k_desc, v_desc, hk, start, n0, hi, sk_t, sv_t, rd, MASKED: tl.constexpr,
             UPCAST: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    """The K and V rows [BLOCK_N, D] of keys n0.. of kv head hk: through TMA descriptors over
    [tokens, kv heads x D] (TMA), else pointer loads that read 0 at and past hi. The same scores and
    products either way: a TMA block past hi reads the next sequence's tokens (or zeros past the
    tensor), whose scores the masked update sets to -inf whatever K holds, and whose V rows are
    zeroed here (MASKED: the blocks that reach hi), since p = 0 times an inf would be NaN."""
    rn = n0 + tl.arange(0, BLOCK_N)
    if TMA:
        k = k_desc.load([start + n0, hk * HEAD_DIM])
        v = v_desc.load([start + n0, hk * HEAD_DIM])
        if MASKED:
            v = tl.where((rn < hi)[:, None], v, 0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
    else:
        k = _load_rows(k_head, start + rn, rn < hi, sk_t, rd, UPCAST)
        v = _load_rows(v_head, start + rn, rn < hi, sv_t, rd, UPCAST)
    return k, v


@triton.jit
def _fwd_row_block(
    q_ptr, k_ptr, v_ptr, k_desc, v_desc, out_ptr, lse_ptr, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, slse_h,
    m_st_ptr, l_st_ptr, acc_st_ptr, s_st_h, sacc_t, sacc_h, qk_scale, kv_lo, kv_hi,
    mb, h, start, seq_len,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
    STATE_IN: tl.constexpr, STATE_OUT: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TMA: tl.constexpr,
):
    hk = h // GROUP
    rm = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # positions inside the sequence
    rd = tl.arange(0, HEAD_DIM)
    row_ok = rm < seq_len
    tok = start + rm
    q = _load_rows(q_ptr + h * sq_h, tok, row_ok, sq_t, rd, UPCAST)
    if STATE_IN:  # continue from the state of the KV blocks before kv_lo (context parallelism)
        m = tl.load(m_st_ptr + h * s_st_h + tok, mask=row_ok, other=float("-inf"))
        l = tl.load(l_st_ptr + h * s_st_h + tok, mask=row_ok, other=0.0)
        acc = tl.load(acc_st_ptr + tok.to(tl.int64)[:, None] * sacc_t + h * sacc_h + rd[None, :],
                      mask=row_ok[:, None], other=0.0)
    else:
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    hi = seq_len
    if CAUSAL:
        hi = tl.minimum((mb + 1) * BLOCK_M, seq_len)
    hi = tl.minimum(hi, kv_hi)
    k_head = k_ptr + hk * sk_h
    v_head = v_ptr + hk * sv_h
    # Ascending KV blocks (the reduction order), in two loops: the blocks every row of the tile sees
    # whole, unmasked, then the rest (the causal diagonal, the sequence's end), masked.
    whole = hi
    if CAUSAL:
        whole = tl.minimum(hi, mb * BLOCK_M + 1)  # keys up to the tile's first row
    whole = kv_lo + tl.maximum(whole - kv_lo, 0) // BLOCK_N * BLOCK_N
    for n0 in range(kv_lo, whole, BLOCK_N):
        k, v = _kv_rows(k_head, v_head, k_desc, v_desc, hk, start, n0, hi, sk_t, sv_t, rd, False, UPCAST,
                        HEAD_DIM, BLOCK_N, TMA)
        m, l, acc = attn_block_update(q, k, v, m, l, acc, qk_scale, None, v_ptr.dtype.element_ty,
                                      UPCAST, IEEE, False)
    for n0 in range(whole, hi, BLOCK_N):
        k, v = _kv_rows(k_head, v_head, k_desc, v_desc, hk, start, n0, hi, sk_t, sv_t, rd, True, UPCAST,
                        HEAD_DIM, BLOCK_N, TMA)
        rn = n0 + tl.arange(0, BLOCK_N)
        valid = (rn < hi)[None, :]
        if CAUSAL:
            valid = valid & (rn[None, :] <= rm[:, None])
        m, l, acc = attn_block_update(q, k, v, m, l, acc, qk_scale, valid, v_ptr.dtype.element_ty,
                                      UPCAST, IEEE, True)
    if STATE_OUT:
        tl.store(m_st_ptr + h * s_st_h + tok, m, mask=row_ok)
        tl.store(l_st_ptr + h * s_st_h + tok, l, mask=row_ok)
        tl.store(acc_st_ptr + tok.to(tl.int64)[:, None] * sacc_t + h * sacc_h + rd[None, :], acc,
                 mask=row_ok[:, None])
    out, lse = attn_finalize(m, l, acc)
    tl.store(out_ptr + tok.to(tl.int64)[:, None] * so_t + h * so_h + rd[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])  # the one downcast
    tl.store(lse_ptr + h * slse_h + tok, lse, mask=row_ok)


# ---- paged decode / chunked prefill ----

@triton.jit
def _page(bt_row, n0, page_size, n_pages, max_pages):
    """The cache page holding logical position n0 (block table entry clamped to the row, page id to
    the cache)."""
    e = tl.minimum(n0 // page_size, max_pages - 1)
    return tl.minimum(tl.maximum(tl.load(bt_row + e), 0), n_pages - 1).to(tl.int64)


@triton.jit
def _kv_block(kc_head, vc_head, page, n0, ok, page_size, skc_p, skc_s, svc_p, svc_s, rd, UPCAST: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """K and V of the logical block at n0, on `page` (page_size % BLOCK_N == 0: a block never
    straddles two pages)."""
    slot = n0 % page_size + tl.arange(0, BLOCK_N)
    k = _load_rows(kc_head + page * skc_p, slot, ok, skc_s, rd, UPCAST)
    v = _load_rows(vc_head + page * svc_p, slot, ok, svc_s, rd, UPCAST)
    return k, v


@cached
@triton.jit
def _decode_kernel(
    q_ptr, kc_ptr, vc_ptr, out_ptr, lse_ptr, cuq_ptr, kvlen_ptr, bt_ptr,
    sq_t, sq_h, skc_p, skc_s, skc_h, svc_p, svc_s, svc_h, so_t, so_h, slse_h, sbt_b,
    page_size, qk_scale, n_q, n_pages, max_pages,
    GROUP: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_AHEAD: tl.constexpr,
):
    # One program per (row block, sequence, head set): a head set is HEADS consecutive q heads of one
    # kv head's group (HEADS = GROUP: the kv head's K / V are read once for all of its q heads).
    # Its rows are (new token, head) pairs, token-major: row i = token i // HEADS, head i % HEADS.
    # Every index read from memory is clamped to its tensor (valid input: unchanged): lengths to the
    # block table's capacity, page ids to the cache; row blocks stride by the grid (a short
    # max_seqlen_q costs time, not rows).
    b = tl.program_id(1)
    h0 = tl.program_id(2) * HEADS
    q_start, n_new = _span(cuq_ptr, b, n_q)  # cuq_ptr None: a decode step, token b of sequence b
    kv_len = tl.minimum(tl.maximum(tl.load(kvlen_ptr + b), 0), max_pages * page_size)
    for j in range(tl.program_id(0), tl.cdiv(n_new * HEADS, BLOCK_M), tl.num_programs(0)):
        _decode_row_block(q_ptr, kc_ptr, vc_ptr, out_ptr, lse_ptr, bt_ptr, sq_t, sq_h, skc_p, skc_s, skc_h,
                          svc_p, svc_s, svc_h, so_t, so_h, slse_h, sbt_b, page_size, qk_scale, n_pages, max_pages,
                          j, b, h0, q_start, n_new, kv_len, GROUP, HEADS, HEAD_DIM, UPCAST, IEEE, BLOCK_M, BLOCK_N,
                          PAGE_AHEAD)


@triton.jit
def _decode_row_block(
    q_ptr, kc_ptr, vc_ptr, out_ptr, lse_ptr, bt_ptr,
    sq_t, sq_h, skc_p, skc_s, skc_h, svc_p, svc_s, svc_h, so_t, so_h, slse_h, sbt_b,
    page_size, qk_scale, n_pages, max_pages, j, b, h0, q_start, n_new, kv_len,
    GROUP: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_AHEAD: tl.constexpr,
):
    hk = h0 // GROUP
    p0 = kv_len - n_new  # position of the first new token
    ri = j * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = ri < n_new * HEADS
    t_new = ri // HEADS
    h = h0 + ri % HEADS
    pos = p0 + t_new  # each row's absolute position: its causal bound
    tok = q_start + t_new
    rd = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + tok.to(tl.int64)[:, None] * sq_t + h[:, None] * sq_h + rd[None, :],
                mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    hi = tl.minimum(p0 + (tl.minimum((j + 1) * BLOCK_M, n_new * HEADS) - 1) // HEADS + 1, kv_len)
    kc_head = kc_ptr + hk * skc_h
    vc_head = vc_ptr + hk * svc_h
    # Logical KV blocks from position 0, ascending, in two loops as in the forward: the blocks every
    # row of the tile sees whole (up to the first row's position), unmasked, then the rest, masked.
    whole = tl.minimum(hi, p0 + (j * BLOCK_M) // HEADS + 1)
    whole = tl.maximum(whole, 0) // BLOCK_N * BLOCK_N
    bt_row = bt_ptr + b * sbt_b
    nxt = _page(bt_row, 0, page_size, n_pages, max_pages)
    for n0 in range(0, whole, BLOCK_N):
        if PAGE_AHEAD:  # the K / V addresses come from the previous iteration: the loads pipeline
            page = nxt
            nxt = _page(bt_row, n0 + BLOCK_N, page_size, n_pages, max_pages)
        else:
            page = _page(bt_row, n0, page_size, n_pages, max_pages)
        ok = n0 + tl.arange(0, BLOCK_N) < hi
        k, v = _kv_block(kc_head, vc_head, page, n0, ok, page_size, skc_p, skc_s, svc_p, svc_s, rd, UPCAST, BLOCK_N)
        m, l, acc = attn_block_update(q, k, v, m, l, acc, qk_scale, None, vc_ptr.dtype.element_ty,
                                      UPCAST, IEEE, False)
    for n0 in range(whole, hi, BLOCK_N):  # a block or two: the page id read in place
        rn = n0 + tl.arange(0, BLOCK_N)
        col_ok = rn < hi
        page = _page(bt_row, n0, page_size, n_pages, max_pages)
        k, v = _kv_block(kc_head, vc_head, page, n0, col_ok, page_size, skc_p, skc_s, svc_p, svc_s, rd, UPCAST,
                         BLOCK_N)
        # The training forward's mask for these rows: keys past a row's position are invisible. Blocks
        # past a row's own bound (another row of the tile reaches further) leave its state unchanged.
        valid = col_ok[None, :] & (rn[None, :] <= pos[:, None])
        m, l, acc = attn_block_update(q, k, v, m, l, acc, qk_scale, valid, vc_ptr.dtype.element_ty,
                                      UPCAST, IEEE, True)
    out, lse = attn_finalize(m, l, acc)
    tl.store(out_ptr + tok.to(tl.int64)[:, None] * so_t + h[:, None] * so_h + rd[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(lse_ptr + h * slse_h + tok, lse, mask=row_ok)


# ---- backward ----

@cached
@triton.jit
def _bwd_preprocess_kernel(o_ptr, do_ptr, dlse_ptr, delta_ptr, N, so_t, so_h, sdo_t, sdo_h, sdl_h, sde_h,
                           HAS_DLSE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr):
    """delta[h, t] = sum_d dO * O (fp32, O as stored) - dLSE[h, t]: one value per row."""
    h = tl.program_id(1)
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    rd = tl.arange(0, HEAD_DIM)
    ok = rt < N
    o = tl.load(o_ptr + rt.to(tl.int64)[:, None] * so_t + h * so_h + rd[None, :], mask=ok[:, None], other=0.0)
    do = tl.load(do_ptr + rt.to(tl.int64)[:, None] * sdo_t + h * sdo_h + rd[None, :], mask=ok[:, None],
                 other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if HAS_DLSE:
        delta = delta - tl.load(dlse_ptr + h * sdl_h + rt, mask=ok, other=0.0)
    tl.store(delta_ptr + h * sde_h + rt, delta, mask=ok)


@triton.jit
def _bwd_p_ds(q, k, v, do, lse2, delta, qk_scale, valid, IEEE: tl.constexpr, MASKED: tl.constexpr = True):
    """Probabilities p [BM, BN] (recomputed from the LSE) and ds = p * (dO v^T - delta). Without
    MASKED every key is visible to every row (`valid` unused): the same arithmetic minus the select."""
    s = _qk(q, k, IEEE) * qk_scale
    p = tl.exp2(s - lse2[:, None])
    if MASKED:
        p = tl.where(valid, p, 0.0)
    dp = _qk(do, v, IEEE)
    ds = p * (dp - delta[:, None])
    return p, ds


@triton.jit
def _dkdv_update(q, k, v, do, lse2, delta, dk, dv, qk_scale, rm, rn, row_ok, col_ok, DT: tl.constexpr,
                 UPCAST: tl.constexpr, IEEE: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                 SCORES_T: tl.constexpr):
    """dv += p^T dO and dk += ds^T q for one query block (without the final scale). SCORES_T (configs
    scores_t) computes the scores transposed, k @ q^T and v @ dO^T [BN, BM]: p^T and ds^T then come
    out of their MMAs as the A operands of the two updates, where p [BM, BN] must be transposed
    through shared memory first. The same products and exp2s, laid out the other way: on the GPU
    another MMA operand order, so not promised to be the same bits (the backward has no cross-path
    bit requirement; determinism and batch invariance hold either way). Without MASKED every key is
    visible to every row (the mask arguments unused)."""
    if SCORES_T:
        pt = tl.exp2(_qk(k, q, IEEE) * qk_scale - lse2[None, :])
        if MASKED:
            valid_t = col_ok[:, None] & row_ok[None, :]
            if CAUSAL:
                valid_t = valid_t & (rn[:, None] <= rm[None, :])
            pt = tl.where(valid_t, pt, 0.0)
        dst = pt * (_qk(v, do, IEEE) - delta[None, :])
        dv = mma(_lowp(pt, DT, UPCAST), do, dv, IEEE)
        dk = mma(_lowp(dst, DT, UPCAST), q, dk, IEEE)
    else:
        valid = None
        if MASKED:
            valid = row_ok[:, None] & col_ok[None, :]
            if CAUSAL:
                valid = valid & (rn[None, :] <= rm[:, None])
        p, ds = _bwd_p_ds(q, k, v, do, lse2, delta, qk_scale, valid, IEEE, MASKED)
        dv = mma(tl.trans(_lowp(p, DT, UPCAST)), do, dv, IEEE)
        dk = mma(tl.trans(_lowp(ds, DT, UPCAST)), q, dk, IEEE)
    return dk, dv


@triton.jit
def _bwd_rows(q_ptr, do_ptr, lse_ptr, delta_ptr, h, tok, ok, sq_t, sq_h, sdo_t, sdo_h, slse_h, rd,
              UPCAST: tl.constexpr):
    """q, dO, lse (log2 units) and delta of rows tok of head h; rows not ok read 0."""
    q = _load_rows(q_ptr + h * sq_h, tok, ok, sq_t, rd, UPCAST)
    do = _load_rows(do_ptr + h * sdo_h, tok, ok, sdo_t, rd, UPCAST)
    lse2 = tl.load(lse_ptr + h * slse_h + tok, mask=ok, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + h * slse_h + tok, mask=ok, other=0.0)
    return q, do, lse2, delta


@cached
@triton.jit
def _bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_ptr,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sdo_t, sdo_h, slse_h, sdk_t, sdk_h, sdv_t, sdv_h,
    qk_scale, scale, N, split_min_len,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    SCORES_T: tl.constexpr,
):
    seq = tl.program_id(1)
    hk = tl.program_id(2)
    start, seq_len = _span(cu_ptr, seq, N)
    for nb in range(tl.program_id(0), tl.cdiv(seq_len, BLOCK_N), tl.num_programs(0)):  # as the forward's
        _bwd_dkdv_block(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                        sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sdo_t, sdo_h, slse_h, sdk_t, sdk_h, sdv_t, sdv_h,
                        qk_scale, scale, nb, hk, start, seq_len, split_min_len, GROUP, HEAD_DIM, CAUSAL, UPCAST,
                        IEEE, BLOCK_M, BLOCK_N, SPLIT, SCORES_T)


@triton.jit
def _bwd_dkdv_block(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sdo_t, sdo_h, slse_h, sdk_t, sdk_h, sdv_t, sdv_h,
    qk_scale, scale, nb, hk, start, seq_len, split_min_len,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    SCORES_T: tl.constexpr,
):
    DT: tl.constexpr = k_ptr.dtype.element_ty
    rn = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, HEAD_DIM)
    col_ok = rn < seq_len
    k = _load_rows(k_ptr + hk * sk_h, start + rn, col_ok, sk_t, rd, UPCAST)
    v = _load_rows(v_ptr + hk * sv_h, start + rn, col_ok, sv_t, rd, UPCAST)
    dk = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)
    lo = 0
    if CAUSAL:  # the first query block that can see this KV block
        lo = (nb * BLOCK_N // BLOCK_M) * BLOCK_M
    # Query blocks ascending. SPLIT (sequences of at least split_min_len): those the causal diagonal
    # crosses masked, then those that see the whole KV block without the mask. Rows past the sequence
    # load q = dO = 0 and add exact zeros to dk / dv; keys past it reach only their own dk / dv rows,
    # never stored.
    masked_end = seq_len
    if SPLIT:
        whole = lo
        if CAUSAL:
            whole = tl.maximum(lo, tl.cdiv((nb + 1) * BLOCK_N - 1, BLOCK_M) * BLOCK_M)
        masked_end = tl.where(seq_len >= split_min_len, tl.minimum(whole, seq_len), seq_len)
    for g in range(GROUP):  # the group's q heads in ascending order: GQA without atomics
        h = hk * GROUP + g
        for m0 in range(lo, masked_end, BLOCK_M):
            rm = m0 + tl.arange(0, BLOCK_M)
            row_ok = rm < seq_len
            q, do, lse2, delta = _bwd_rows(q_ptr, do_ptr, lse_ptr, delta_ptr, h, start + rm, row_ok,
                                           sq_t, sq_h, sdo_t, sdo_h, slse_h, rd, UPCAST)
            dk, dv = _dkdv_update(q, k, v, do, lse2, delta, dk, dv, qk_scale, rm, rn, row_ok, col_ok, DT, UPCAST,
                                  IEEE, CAUSAL, True, SCORES_T)
        if SPLIT:
            for m0 in range(masked_end, seq_len, BLOCK_M):
                rm = m0 + tl.arange(0, BLOCK_M)
                q, do, lse2, delta = _bwd_rows(q_ptr, do_ptr, lse_ptr, delta_ptr, h, start + rm, rm < seq_len,
                                               sq_t, sq_h, sdo_t, sdo_h, slse_h, rd, UPCAST)
                dk, dv = _dkdv_update(q, k, v, do, lse2, delta, dk, dv, qk_scale, None, None, None, None, DT,
                                      UPCAST, IEEE, CAUSAL, False, SCORES_T)  # no mask: its arguments unused
    tok_n = (start + rn).to(tl.int64)[:, None]
    tl.store(dk_ptr + tok_n * sdk_t + hk * sdk_h + rd[None, :], (dk * scale).to(dk_ptr.dtype.element_ty),
             mask=col_ok[:, None])
    tl.store(dv_ptr + tok_n * sdv_t + hk * sdv_h + rd[None, :], dv.to(dv_ptr.dtype.element_ty),
             mask=col_ok[:, None])


@cached
@triton.jit
def _bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cu_ptr,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sdo_t, sdo_h, slse_h, sdq_t, sdq_h,
    qk_scale, scale, N, split_min_len,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    HEAVY_FIRST: tl.constexpr,
):
    seq = tl.program_id(1)
    h = tl.program_id(2)
    start, seq_len = _span(cu_ptr, seq, N)
    for mb in range(_first_tile(HEAVY_FIRST), tl.cdiv(seq_len, BLOCK_M), tl.num_programs(0)):  # as the forward's
        _bwd_dq_block(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                      sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sdo_t, sdo_h, slse_h, sdq_t, sdq_h,
                      qk_scale, scale, mb, h, start, seq_len, split_min_len, GROUP, HEAD_DIM, CAUSAL, UPCAST, IEEE,
                      BLOCK_M, BLOCK_N, SPLIT)


@triton.jit
def _bwd_dq_block(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sdo_t, sdo_h, slse_h, sdq_t, sdq_h,
    qk_scale, scale, mb, h, start, seq_len, split_min_len,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
):
    DT: tl.constexpr = k_ptr.dtype.element_ty
    hk = h // GROUP
    rm = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, HEAD_DIM)
    row_ok = rm < seq_len
    tok = start + rm
    q, do, lse2, delta = _bwd_rows(q_ptr, do_ptr, lse_ptr, delta_ptr, h, tok, row_ok, sq_t, sq_h, sdo_t, sdo_h,
                                   slse_h, rd, UPCAST)
    dq = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    hi = seq_len
    if CAUSAL:
        hi = tl.minimum((mb + 1) * BLOCK_M, seq_len)
    # KV blocks ascending. SPLIT (sequences of at least split_min_len): those every row of the tile sees
    # whole first, without the mask (rows past the sequence, never stored, load q = dO = 0), then the
    # rest masked.
    masked_start = 0
    if SPLIT:
        whole = hi
        if CAUSAL:
            whole = tl.minimum(hi, mb * BLOCK_M + 1)
        masked_start = tl.where(seq_len >= split_min_len, whole // BLOCK_N * BLOCK_N, 0)
        for n0 in range(0, masked_start, BLOCK_N):
            rn = n0 + tl.arange(0, BLOCK_N)
            k = _load_rows(k_ptr + hk * sk_h, start + rn, rn < hi, sk_t, rd, UPCAST)
            v = _load_rows(v_ptr + hk * sv_h, start + rn, rn < hi, sv_t, rd, UPCAST)
            p, ds = _bwd_p_ds(q, k, v, do, lse2, delta, qk_scale, None, IEEE, False)
            dq = mma(_lowp(ds, DT, UPCAST), k, dq, IEEE)
    for n0 in range(masked_start, hi, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        col_ok = rn < hi
        k = _load_rows(k_ptr + hk * sk_h, start + rn, col_ok, sk_t, rd, UPCAST)
        v = _load_rows(v_ptr + hk * sv_h, start + rn, col_ok, sv_t, rd, UPCAST)
        valid = row_ok[:, None] & col_ok[None, :]
        if CAUSAL:
            valid = valid & (rn[None, :] <= rm[:, None])
        p, ds = _bwd_p_ds(q, k, v, do, lse2, delta, qk_scale, valid, IEEE)
        dq = mma(_lowp(ds, DT, UPCAST), k, dq, IEEE)
    tl.store(dq_ptr + tok.to(tl.int64)[:, None] * sdq_t + h * sdq_h + rd[None, :],
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=row_ok[:, None])


# ---- launchers ----

def _cfg(kernel, q):
    return configs.lookup_attention(kernel, arch_of(q.device), q.dtype, q.shape[-1])


def launch_forward(q, k, v, cu_seqlens, max_seqlen, scale, causal, kv_range=None, state_in=None,
                   state_out=False, cfg=None):
    """(out, lse[, (m, l, acc)]). kv_range = (lo, hi): only keys at positions [lo, hi) of each
    sequence (lo a multiple of block_n); state_in continues from a previous range's state. cfg: a
    config other than the locked one (the GPU gate and sweeps; the bits are the class's claim)."""
    N, Hq, D = q.shape
    Hkv = k.shape[1]
    S = cu_seqlens.numel() - 1
    out = torch.empty_like(q)
    lse = torch.empty((Hq, N), dtype=torch.float32, device=q.device)
    want_state = state_out or state_in is not None
    if want_state:
        if state_in is not None:
            m_st, l_st, acc_st = (x.clone() for x in state_in)
        else:
            m_st = torch.full((Hq, N), float("-inf"), dtype=torch.float32, device=q.device)
            l_st = torch.zeros((Hq, N), dtype=torch.float32, device=q.device)
            acc_st = torch.zeros((N, Hq, D), dtype=torch.float32, device=q.device)
    else:
        m_st = l_st = lse
        acc_st = q
    if N == 0 or S == 0:
        return (out, lse, (m_st, l_st, acc_st)) if state_out else (out, lse)
    cfg = cfg or _cfg("attention_fwd", q)
    lo, hi = kv_range if kv_range is not None else (0, INT32_MAX)
    upcast, ieee = operand_flags(q.dtype)
    grid = (max(1, cdiv(max_seqlen, cfg.block_m)), S, Hq)  # max_seqlen sizes it; the rows stride
    tma = cfg.tma_loads and tma_rows_ready(k, v)
    k_desc, v_desc = row_descriptors(tma, cfg.block_n, k, v)
    _fwd_kernel[grid](
        q, k, v, k_desc, v_desc, out, lse, cu_seqlens,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), lse.stride(0),
        m_st, l_st, acc_st, m_st.stride(0), acc_st.stride(0), acc_st.stride(1),
        scale * LOG2E, lo, hi, N,
        GROUP=Hq // Hkv, HEAD_DIM=D, CAUSAL=causal, STATE_IN=state_in is not None, STATE_OUT=want_state,
        UPCAST=upcast, IEEE=ieee, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, TMA=tma, FLAT=cfg.flat,
        HEAVY_FIRST=cfg.heavy_first,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **register_cap(cfg, D),
    )
    return (out, lse, (m_st, l_st, acc_st)) if state_out else (out, lse)


def register_cap(cfg, head_dim: int) -> dict:
    """The launch option of configs maxnreg_d64 (the forward's and dq's rows) at head dims <= 64: none
    when 0 or for larger heads (the compiler's choice; the launch and its cache key are then as
    without the field), and none under the interpreter (no registers to cap)."""
    cap = cfg.maxnreg_d64 if head_dim <= 64 else 0
    return {"maxnreg": cap} if cap and not interpreter_active() else {}


def tma_rows_ready(*xs) -> bool:
    """[tokens, heads, D] tensors readable as [tokens, heads x D] through TMA: 2-byte, the head dim
    contiguous and the heads of a token adjacent (stride D), 16-byte aligned bases and token strides."""
    return all(x.dtype in (torch.bfloat16, torch.float16) and x.stride(2) == 1 and x.stride(1) == x.shape[2]
               and (x.stride(0) * x.element_size()) % 16 == 0 and x.data_ptr() % 16 == 0 and x.shape[0] > 0
               for x in xs)


def row_descriptors(tma: bool, block_rows: int, *xs) -> tuple:
    """Host TMA descriptors of blocks [block_rows, D] over each x viewed as [tokens, heads x D] (tma),
    else the tensors themselves (the kernels then read through pointers and ignore them)."""
    if not tma:
        return xs
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(TensorDescriptor(x, [x.shape[0], x.shape[1] * x.shape[2]], [x.stride(0), 1],
                                  [block_rows, x.shape[2]]) for x in xs)


def decode_heads(cfg, group: int) -> int:
    """q heads per decode program: the config's q_heads (a divisor of the group), 0 = the whole group."""
    return group if cfg.q_heads == 0 or group % cfg.q_heads else cfg.q_heads


def launch_decode(q, k_cache, v_cache, block_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, scale, cfg=None):
    """cu_seqlens_q: the new tokens' offsets [B + 1], or None for one new token per sequence (token b
    of q belongs to sequence b)."""
    N, Hq, D = q.shape
    B = cache_seqlens.numel()
    out = torch.empty_like(q)
    lse = torch.empty((Hq, N), dtype=torch.float32, device=q.device)
    if N == 0 or B == 0:
        return out, lse
    n_pages = k_cache.shape[0]
    max_pages = block_table.shape[1] if n_pages else 0  # no page to read: every length clamps to 0
    key = (q.shape[1:], q.stride(), k_cache.shape, k_cache.stride(), v_cache.stride(), block_table.stride(0), B,
           max_seqlen_q, q.dtype, q.device, cfg)
    grid, template = planned(_DECODE_PLANS, key, _decode_plan, q, k_cache, v_cache, block_table, B, max_seqlen_q, cfg)
    template(grid, q, k_cache, v_cache, out, lse, cu_seqlens_q, cache_seqlens, block_table, out.stride(0),
             out.stride(1), lse.stride(0), scale * LOG2E, N, max_pages)
    return out, lse


_DECODE_PLANS = configs.plan_store()  # launch_decode's (grid, Template) per key (launch.planned)


def _decode_plan(q, k_cache, v_cache, block_table, B: int, max_seqlen_q: int, cfg):
    """(grid, Template) of attention_decode for the heads, head dim and strides of q and the caches,
    the block table's row stride, the sequences, the longest new-token run, dtype, device and config.
    SLOTs: the tensors (cu_seqlens_q may be None: a signature fact, as in any launch), out's strides
    (empty_like keeps q's layout only where q is dense), lse's head stride (the token count), the
    scale, the token count and the block table's width."""
    Hq, D = q.shape[1], q.shape[2]
    group = Hq // k_cache.shape[2]
    cfg = cfg or configs.lookup_decode(arch_of(q.device), q.dtype, D, B * k_cache.shape[2], max_seqlen_q * group)
    heads = decode_heads(cfg, group)
    upcast, ieee = operand_flags(q.dtype)
    return (max(1, cdiv(max_seqlen_q * heads, cfg.block_m)), B, Hq // heads), Template(
        _decode_kernel,
        (SLOT, SLOT, SLOT, SLOT, SLOT, SLOT, SLOT, SLOT,
         q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
         v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), SLOT, SLOT, SLOT,
         block_table.stride(0), k_cache.shape[1], SLOT, SLOT, k_cache.shape[0], SLOT),
        dict(GROUP=group, HEADS=heads, HEAD_DIM=D, UPCAST=upcast, IEEE=ieee,
             BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, PAGE_AHEAD=cfg.page_ahead, num_warps=cfg.num_warps,
             num_stages=cfg.num_stages))


def launch_backward(dout, dlse, q, k, v, out, lse, cu_seqlens, max_seqlen, scale, causal):
    N, Hq, D = q.shape
    Hkv = k.shape[1]
    S = cu_seqlens.numel() - 1
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if N == 0 or S == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    upcast, ieee = operand_flags(q.dtype)
    cq = _cfg("attention_bwd_dq", q)
    ckv = _cfg("attention_bwd_dkdv", q)
    delta = torch.empty((Hq, N), dtype=torch.float32, device=q.device)
    _bwd_preprocess_kernel[(cdiv(N, cq.block_m), Hq)](
        out, dout, dlse if dlse is not None else delta, delta, N, out.stride(0), out.stride(1),
        dout.stride(0), dout.stride(1), dlse.stride(0) if dlse is not None else 0, delta.stride(0),
        HAS_DLSE=dlse is not None, HEAD_DIM=D, BLOCK_T=cq.block_m, num_warps=cq.num_warps)
    common = dict(GROUP=Hq // Hkv, HEAD_DIM=D, CAUSAL=causal, UPCAST=upcast, IEEE=ieee)
    # No zero fill: valid offsets (start at 0, end at N) put every token in a sequence, and the two
    # kernels write every gradient element of every sequence (tested with NaN-filled buffers). The
    # fills cost 0.4 GB of writes at 4 x 8192 tokens, 32 / 8 heads, D 128, 0.8 GB at 64 x 1024. With
    # validate=False and offsets that leave tokens out, those tokens' gradients are not written
    # (undefined, as the forward's outputs there).
    # The split loops are compiled in only when some sequence may reach split_min_len: a pack of
    # shorter ones runs every block masked either way, and the SPLIT build is slower at it (H200,
    # 64 x 1024 at a 2048 threshold: 0.77x). Same bits both ways (the rule is per sequence).
    split_kv = 0 < ckv.split_min_len <= max_seqlen
    split_q = 0 < cq.split_min_len <= max_seqlen
    _bwd_dkdv_kernel[(max(1, cdiv(max_seqlen, ckv.block_n)), S, Hkv)](
        q, k, v, dout, lse, delta, dk, dv, cu_seqlens,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        dout.stride(0), dout.stride(1), lse.stride(0), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
        scale * LOG2E, scale, N, ckv.split_min_len, BLOCK_M=ckv.block_m, BLOCK_N=ckv.block_n,
        SPLIT=split_kv, SCORES_T=ckv.scores_t, num_warps=ckv.num_warps, num_stages=ckv.num_stages, **common)
    _bwd_dq_kernel[(max(1, cdiv(max_seqlen, cq.block_m)), S, Hq)](
        q, k, v, dout, lse, delta, dq, cu_seqlens,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        dout.stride(0), dout.stride(1), lse.stride(0), dq.stride(0), dq.stride(1),
        scale * LOG2E, scale, N, cq.split_min_len, BLOCK_M=cq.block_m, BLOCK_N=cq.block_n,
        SPLIT=split_q, HEAVY_FIRST=cq.heavy_first, num_warps=cq.num_warps, num_stages=cq.num_stages,
        **register_cap(cq, D), **common)
    return dq, dk, dv


# ---- torch.library custom ops (training path): torch.compile-able, autograd registered ----

@torch.library.custom_op("rlk_triton::attention_fwd", mutates_args=())
def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                  max_seqlen: int, scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_forward(q, k, v, cu_seqlens, max_seqlen, scale, causal)


@attention_fwd.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, scale, causal):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("rlk_triton::attention_bwd", mutates_args=())
def attention_bwd(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, cu_seqlens: torch.Tensor,
                  max_seqlen: int, scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_backward(dout, dlse, q, k, v, out, lse, cu_seqlens, max_seqlen, scale, causal)


@attention_bwd.register_fake
def _(dout, dlse, q, k, v, *rest):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, max_seqlen, scale, causal = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens)
    ctx.max_seqlen, ctx.scale, ctx.causal = max_seqlen, scale, causal
    ctx.set_materialize_grads(False)  # an unused lse arrives as None: no [Hq, N] of zeros for the kernel to read


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens = ctx.saved_tensors
    dout = torch.zeros_like(out) if dout is None else dout.contiguous()
    dlse = None if dlse is None else dlse.contiguous()
    dq, dk, dv = call_attention_bwd(dout, dlse, q, k, v, out, lse, cu_seqlens, ctx.max_seqlen, ctx.scale, ctx.causal)
    return dq, dk, dv, None, None, None, None


call_attention_fwd = autograd_op(attention_fwd, _backward, _setup_context)
call_attention_bwd = direct(attention_bwd)
