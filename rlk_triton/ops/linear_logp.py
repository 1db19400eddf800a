"""LM head + selected-token logp (and entropy) without materializing [tokens, vocab] logits.

Forward, for a (vocab-sharded) weight W [V_local, H]:
  1. `_tile_stats_kernel`, one program per (row block, block_n vocab tile) in the grouped GEMM
     order: it computes z = (hidden @ W_tile^T + bias) / T with tl.dot (matmul.dot_tile's K order)
     and writes the tile's per-row softmax state as stats [5, tiles, N]: max, sum, entropy term, the
     target's z (0 where the tile does not hold the target) and a hit count.
  2. `_merge_kernel` folds the tile states in increasing global vocab order (reduction.py). Under
     tensor parallelism the ranks' stats are gathered first, in rank order = vocab order.
Backward, chunk by chunk (configs chunk_v, a multiple of the forward's block_n) in vocab order:
  d_logits = (g (onehot - p) - g_ent p (log p + entropy)) / T, recomputed from hidden and W, rounded
  to the inputs' dtype (the one downcast of the backward) into a [N, chunk] buffer;
  dW_chunk = d_logits^T @ hidden   (K = tokens, ascending: deterministic, not batch-invariant);
  dH      += d_logits @ W_chunk    (fp32 accumulator, chunks added in increasing order; rows are
                                    batch-invariant; under TP the accumulator travels rank to rank);
  dbias_chunk = sum over row blocks, ascending, of the fp32 column sums of each block.
Extra memory: forward stats (5 x tiles x N fp32, freed after the merge); backward the [N, chunk_v]
buffer and the fp32 [N, H] accumulator.
saved="logits": the forward also writes z - (the tile's row max) into an [N, S] buffer (float16, or
float32 for float32 inputs; S = the kept columns, every one unless saved_vocab says fewer: whole
backward chunks from the vocab's start) and keeps those tiles' row maxima; the backward's d logits of
those columns then come from `_dlogits_saved_kernel`, an elementwise pass over that buffer, instead
of a recomputed GEMM tile, and the other columns' from `_dlogits_kernel` as in "recompute".
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import configs
from .._runtime import arch_of
from ..errors import ShapeError
from .matmul import (column_quarters, dot_tile, dot_tile_desc, grouped_tile, matmul_into, operand_flags,
                     persistent_programs, tma_ready)
from .reduction import merge_softmax_states, online_softmax_rows
from .dispatch import autograd_op, direct
from .launch import cached, cdiv, host_descriptor

N_STATS = 5  # max, sum, entropy term, target z, hit count


@triton.jit
def _logits_tile(x_ptr, stride_xn, w_ptr, stride_wv, x_desc, w_desc, bias_ptr, m0, n0, rm, cols, N, V_local, H, inv_t,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, DESC: tl.constexpr):
    """z = (hidden[rm] @ W[cols]^T + bias[cols]) * (1 / T) in fp32, the K order of dot_tile (DESC:
    through TMA descriptors, the same bits). Rows / cols out of range hold garbage: callers mask."""
    if DESC:
        acc = dot_tile_desc(x_desc, w_desc, m0, n0, H, BLOCK_M, BLOCK_N, BLOCK_K, True, UPCAST, IEEE)
    else:
        acc = dot_tile(x_ptr, stride_xn, 1, w_ptr, 1, stride_wv, rm % N, cols % V_local, H,
                       BLOCK_K, EVEN_K, UPCAST, IEEE)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols % V_local).to(tl.float32)[None, :]
    return acc * inv_t


@triton.jit
def _store_relative(z, m, rm, n0, row_ok, V_local, saved_ptr, stride_sn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """saved[rm, n0 : n0 + BLOCK_N] = z - m (m: the tile's row max), rounded to the buffer's dtype, in
    column eighths (the epilogue's register budget, as matmul.column_quarters says; ptxas on sm90 with
    triton 3.6: whole tile 1308, quarters 196, eighths 100 spill-store bytes per thread). Relative to
    the tile max the values that carry the softmax mass sit near 0, where the rounding is finest."""
    Q: tl.constexpr = BLOCK_N // 4
    q0, q1, q2, q3 = column_quarters(z - m[:, None], BLOCK_M, BLOCK_N)
    base = saved_ptr + rm.to(tl.int64)[:, None] * stride_sn
    _store_halves(q0, base, n0, row_ok, V_local, BLOCK_M, Q)
    _store_halves(q1, base, n0 + Q, row_ok, V_local, BLOCK_M, Q)
    _store_halves(q2, base, n0 + 2 * Q, row_ok, V_local, BLOCK_M, Q)
    _store_halves(q3, base, n0 + 3 * Q, row_ok, V_local, BLOCK_M, Q)


@triton.jit
def _store_halves(x, base, c0, row_ok, V_local, BLOCK_M: tl.constexpr, W: tl.constexpr):
    """x [BLOCK_M, W] stored at columns c0 .. c0 + W of the rows at base, as its two column halves."""
    left, right = tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, W // 2)), (0, 2, 1)))
    c = c0 + tl.arange(0, W // 2)
    ty = base.dtype.element_ty
    tl.store(base + c[None, :], left.to(ty), mask=row_ok[:, None] & (c < V_local)[None, :])
    c += W // 2
    tl.store(base + c[None, :], right.to(ty), mask=row_ok[:, None] & (c < V_local)[None, :])


# n_tiles / n_chunks are never specialized: Triton turns an int argument equal to 1 into a Python
# constant, which has no .to() (one vocab tile, V_local <= block_n). save_cols is: its divisibility
# by 16 lets the saved-logits store go as 16-byte vectors (an unspecialized mask bound gave one 2-byte
# store per element; tests/test_aot_compile.py).
@cached
@triton.jit(do_not_specialize=["inv_t", "n_tiles"])
def _tile_stats_kernel(
    x_ptr, stride_xn, w_ptr, stride_wv, x_desc, w_desc, bias_ptr, target_local_ptr, stats_ptr,
    saved_ptr, stride_sn, save_cols, N, H, V_local, n_tiles, inv_t, n_progs,
    HAS_BIAS: tl.constexpr, WITH_ENTROPY: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, DESC: tl.constexpr, SAVE: tl.constexpr,
):
    # (row block, vocab tile) work items in matmul's grouped order: the logits GEMM's L2 reuse, with
    # the softmax state of the tile as its epilogue. Pointer path: one program per item. DESC: n_progs
    # persistent programs stride over the items (flattened, so the next item's loads overlap this
    # epilogue). Either way an item's arithmetic is the same. (Triton's warp specialization of this
    # loop gave the same bits and no speed on the H200: docs/reports/h200-round4-2026-12-03.json.)
    for item in tl.range(tl.program_id(0), tl.cdiv(N, BLOCK_M) * n_tiles, n_progs, flatten=DESC):
        pid_m, tile = grouped_tile(item, N, V_local, BLOCK_M, BLOCK_N, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rm < N
        cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        z = _logits_tile(x_ptr, stride_xn, w_ptr, stride_wv, x_desc, w_desc, bias_ptr, pid_m * BLOCK_M,
                         tile * BLOCK_N, rm, cols, N, V_local, H, inv_t,
                         HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST, IEEE, DESC)
        z = tl.where((cols < V_local)[None, :], z, float("-inf"))
        m, s, t = online_softmax_rows(z, tl.full((BLOCK_M,), float("-inf"), tl.float32),
                                      tl.zeros((BLOCK_M,), tl.float32), tl.zeros((BLOCK_M,), tl.float32),
                                      WITH_ENTROPY)
        target = tl.load(target_local_ptr + rm, mask=row_ok, other=-1)
        tz = tl.sum(tl.where(cols[None, :] == target[:, None], z, 0.0), 1)  # one lane at most: exact
        # the count of cols == target as a range test: one tile-sized temporary less, which keeps
        # the epilogue within the 255 registers of a thread (ptxas: 2308 spill bytes -> 0)
        hit = ((target >= tile * BLOCK_N) & (target < tile * BLOCK_N + BLOCK_N)).to(tl.float32)
        out = stats_ptr + tile.to(tl.int64) * N + rm
        plane = n_tiles.to(tl.int64) * N
        tl.store(out, m, mask=row_ok)
        tl.store(out + plane, s, mask=row_ok)
        tl.store(out + 2 * plane, t, mask=row_ok)
        tl.store(out + 3 * plane, tz, mask=row_ok)
        tl.store(out + 4 * plane, hit, mask=row_ok)
        if SAVE:  # saved="logits": z less the tile's row max (stats plane 0), for the backward, in the
            # kept columns only (masked stores past save_cols: a branch here fails triton 3.6's sm90 passes)
            _store_relative(z, m, rm, tile * BLOCK_N, row_ok, save_cols, saved_ptr, stride_sn, BLOCK_M, BLOCK_N)


@triton.jit
def _load_tile_state(p, plane, ok):
    """A row block's tile state (m, s, t, target z, hit) at p (stats plane 0; planes `plane` apart)."""
    return (tl.load(p, mask=ok, other=float("-inf")), tl.load(p + plane, mask=ok, other=0.0),
            tl.load(p + 2 * plane, mask=ok, other=0.0), tl.load(p + 3 * plane, mask=ok, other=0.0),
            tl.load(p + 4 * plane, mask=ok, other=0.0))


@triton.jit
def _fold_tile_state(m, s, t, tz, hit, state, WITH_ENTROPY: tl.constexpr):
    """Fold a tile state (_load_tile_state) into the row block's running state."""
    m, s, t = merge_softmax_states(m, s, t, state[0], state[1], state[2], WITH_ENTROPY)
    return m, s, t, tz + state[3], hit + state[4]


@cached
@triton.jit(do_not_specialize=["ignore_index", "n_chunks"])
def _merge_kernel(stats_ptr, target_ptr, logp_ptr, entropy_ptr, row_max_ptr, row_logsum_ptr,
                  N, n_chunks, ignore_index, WITH_ENTROPY: tl.constexpr, BLOCK: tl.constexpr,
                  TILES: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < N
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    t = tl.zeros((BLOCK,), tl.float32)
    tz = tl.zeros((BLOCK,), tl.float32)
    hit = tl.zeros((BLOCK,), tl.float32)
    plane = n_chunks.to(tl.int64) * N
    # Increasing global vocab-tile order, TILES tiles a step: the step's states are all loaded, then
    # merged one by one, so a step waits for one memory latency instead of one per tile. Each row's
    # operations and their order are those of a tile-by-tile loop: any TILES and BLOCK give the same
    # bits (tests/test_linear_logp.py::test_merge_launch_gives_the_same_bits).
    p = stats_ptr + rows  # the step's first tile; advanced as a (64-bit) pointer: tiles x N may pass 2**31
    n_full = n_chunks // TILES * TILES
    for _ in range(0, n_full, TILES):
        states = ()
        for j in tl.static_range(TILES):
            states = states + (_load_tile_state(p + j * N, plane, ok),)
        for j in tl.static_range(TILES):
            m, s, t, tz, hit = _fold_tile_state(m, s, t, tz, hit, states[j], WITH_ENTROPY)
        p += TILES * N
    for _ in range(n_full, n_chunks):  # the last n_chunks % TILES tiles
        m, s, t, tz, hit = _fold_tile_state(m, s, t, tz, hit, _load_tile_state(p, plane, ok), WITH_ENTROPY)
        p += N
    log_s = tl.log2(s) * 0.6931471805599453
    logp = (tz - m) - log_s
    logp = tl.where(hit == 1.0, logp, float("nan"))  # no (or a doubled) target: never silent
    target = tl.load(target_ptr + rows, mask=ok, other=0)
    logp = tl.where(target == ignore_index, 0.0, logp)
    tl.store(logp_ptr + rows, logp, mask=ok)
    tl.store(row_max_ptr + rows, m, mask=ok)
    tl.store(row_logsum_ptr + rows, log_s, mask=ok)
    if WITH_ENTROPY:
        tl.store(entropy_ptr + rows, log_s - t / s, mask=ok)


@triton.jit
def _row_terms(r, row_max_ptr, row_logsum_ptr, grad_logp_ptr, target_local_ptr, grad_entropy_ptr, entropy_ptr,
               WITH_ENTROPY_GRAD: tl.constexpr):
    """The per-row inputs of d logits at rows r: (row max, log sum, g, target, g entropy, entropy)."""
    row_max = tl.load(row_max_ptr + r)
    row_logsum = tl.load(row_logsum_ptr + r)
    g = tl.load(grad_logp_ptr + r)  # zero on ignored rows (the launcher's job)
    target = tl.load(target_local_ptr + r)
    ge = g
    ent = g
    if WITH_ENTROPY_GRAD:
        ge = tl.load(grad_entropy_ptr + r)
        ent = tl.load(entropy_ptr + r)
    return row_max, row_logsum, g, target, ge, ent


@triton.jit
def _dlogits_piece(z, rm, local, c0, row_max, row_logsum, g, target, ge, ent, inv_t, N, chunk_width,
                   d_ptr, stride_dn, dbias_part_ptr, stride_pb, pid_m,
                   HAS_BIAS: tl.constexpr, WITH_ENTROPY_GRAD: tl.constexpr):
    """d_logits for the columns `local` (inside the chunk) of a row block, from their fp32 logits z:
    elementwise in z, stored in the buffer's dtype; with HAS_BIAS also the block's fp32 column sums."""
    row_ok = rm < N
    col_ok = local < chunk_width
    log_p = (z - row_max[:, None]) - row_logsum[:, None]
    p = tl.exp2(log_p * 1.4426950408889634)
    dz = tl.where((c0 + local)[None, :] == target[:, None], g[:, None], 0.0) - g[:, None] * p
    if WITH_ENTROPY_GRAD:
        dz -= ge[:, None] * tl.where(p > 0.0, p * (log_p + ent[:, None]), 0.0)
    dz = tl.where(row_ok[:, None] & col_ok[None, :], dz * inv_t, 0.0)
    tl.store(d_ptr + rm.to(tl.int64)[:, None] * stride_dn + local[None, :],
             dz.to(d_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
    if HAS_BIAS:  # this row block's fp32 column sums; blocks are added in order by _dbias_kernel
        tl.store(dbias_part_ptr + pid_m.to(tl.int64) * stride_pb + local, tl.sum(dz, 0), mask=col_ok)


@cached
@triton.jit(do_not_specialize=["inv_t", "c0"])
def _dlogits_kernel(
    x_ptr, stride_xn, w_ptr, stride_wv, x_desc, w_desc, bias_ptr, target_local_ptr,
    row_max_ptr, row_logsum_ptr, entropy_ptr, grad_logp_ptr, grad_entropy_ptr,
    d_ptr, stride_dn, dbias_part_ptr, stride_pb,
    N, H, V_local, c0, chunk_width, inv_t, n_progs,
    HAS_BIAS: tl.constexpr, WITH_ENTROPY_GRAD: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, DESC: tl.constexpr,
):
    # Work items and programs as in _tile_stats_kernel, over this chunk's columns. The epilogue is
    # elementwise in the logits and runs on the tile's column quarters (matmul.column_quarters): the
    # same bits as the whole tile, fewer live registers.
    for item in tl.range(tl.program_id(0), tl.cdiv(N, BLOCK_M) * tl.cdiv(chunk_width, BLOCK_N), n_progs,
                         flatten=DESC):
        pid_m, pid_n = grouped_tile(item, N, chunk_width, BLOCK_M, BLOCK_N, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        local = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # column inside the chunk
        z = _logits_tile(x_ptr, stride_xn, w_ptr, stride_wv, x_desc, w_desc, bias_ptr, pid_m * BLOCK_M,
                         c0 + pid_n * BLOCK_N, rm, c0 + local, N, V_local, H, inv_t,
                         HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST, IEEE, DESC)
        row_max, row_logsum, g, target, ge, ent = _row_terms(
            rm % N, row_max_ptr, row_logsum_ptr, grad_logp_ptr, target_local_ptr, grad_entropy_ptr, entropy_ptr,
            WITH_ENTROPY_GRAD)
        Q: tl.constexpr = BLOCK_N // 4
        q0, q1, q2, q3 = column_quarters(z, BLOCK_M, BLOCK_N)
        quarter = pid_n * BLOCK_N + tl.arange(0, Q)
        _dlogits_piece(q0, rm, quarter, c0, row_max, row_logsum, g, target, ge, ent, inv_t, N, chunk_width,
                       d_ptr, stride_dn, dbias_part_ptr, stride_pb, pid_m, HAS_BIAS, WITH_ENTROPY_GRAD)
        _dlogits_piece(q1, rm, quarter + Q, c0, row_max, row_logsum, g, target, ge, ent, inv_t, N, chunk_width,
                       d_ptr, stride_dn, dbias_part_ptr, stride_pb, pid_m, HAS_BIAS, WITH_ENTROPY_GRAD)
        _dlogits_piece(q2, rm, quarter + 2 * Q, c0, row_max, row_logsum, g, target, ge, ent, inv_t, N,
                       chunk_width, d_ptr, stride_dn, dbias_part_ptr, stride_pb, pid_m, HAS_BIAS,
                       WITH_ENTROPY_GRAD)
        _dlogits_piece(q3, rm, quarter + 3 * Q, c0, row_max, row_logsum, g, target, ge, ent, inv_t, N,
                       chunk_width, d_ptr, stride_dn, dbias_part_ptr, stride_pb, pid_m, HAS_BIAS,
                       WITH_ENTROPY_GRAD)


# c0 is specialized (a multiple of chunk_v, so always divisible by 16): it lets the saved logits load
# as 16-byte vectors (unspecialized: one 2-byte load per element; tests/test_aot_compile.py).
@cached
@triton.jit(do_not_specialize=["inv_t"])
def _dlogits_saved_kernel(
    saved_ptr, stride_sn, tile_max_ptr, target_local_ptr, row_max_ptr, row_logsum_ptr, entropy_ptr,
    grad_logp_ptr, grad_entropy_ptr, d_ptr, stride_dn, dbias_part_ptr, stride_pb,
    N, c0, chunk_width, inv_t,
    HAS_BIAS: tl.constexpr, WITH_ENTROPY_GRAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PIECES: tl.constexpr,
):
    # saved="logits": _dlogits_kernel's epilogue on the forward's saved z - tile max instead of a
    # recomputed GEMM tile. One program per (row block, block_n column block) of the chunk; chunks
    # are multiples of the forward's block_n (the launcher checks), so a block is one forward tile
    # and its row max is one number per row.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    r = rm % N
    tile = (c0 + pid_n * BLOCK_N) // BLOCK_N
    m_tile = tl.load(tile_max_ptr + tile.to(tl.int64) * N + r)
    row_max, row_logsum, g, target, ge, ent = _row_terms(
        r, row_max_ptr, row_logsum_ptr, grad_logp_ptr, target_local_ptr, grad_entropy_ptr, entropy_ptr,
        WITH_ENTROPY_GRAD)
    # column pieces, left to right, in a loop that is not unrolled: elementwise, so any split gives the
    # same bits, and one piece's temporaries at a time fit the registers (ptxas on sm90: unrolled
    # quarters spilled 948-2420 B per thread)
    Q: tl.constexpr = BLOCK_N // PIECES
    base = saved_ptr + r.to(tl.int64)[:, None] * stride_sn + c0
    for q in range(0, PIECES):
        local = pid_n * BLOCK_N + q * Q + tl.arange(0, Q)
        rel = tl.load(base + local[None, :], mask=(local < chunk_width)[None, :], other=0.0)
        z = rel.to(tl.float32) + m_tile[:, None]
        _dlogits_piece(z, rm, local, c0, row_max, row_logsum, g, target, ge, ent, inv_t, N, chunk_width,
                       d_ptr, stride_dn, dbias_part_ptr, stride_pb, pid_m, HAS_BIAS, WITH_ENTROPY_GRAD)


@cached
@triton.jit
def _dbias_kernel(part_ptr, stride_pb, n_blocks, out_ptr, width, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < width
    acc = tl.zeros((BLOCK,), tl.float32)
    p = part_ptr + cols  # advanced as a (64-bit) pointer: blocks x the pass's columns may pass 2**31
    for _ in range(0, n_blocks):  # row blocks in increasing order
        acc += tl.load(p, mask=ok, other=0.0)
        p += stride_pb
    tl.store(out_ptr + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


# ---- launchers ----

def tile_config(kernel: str, hidden: torch.Tensor) -> configs.MatmulConfig:
    return configs.lookup_matmul(kernel, arch_of(hidden.device), hidden.dtype)


def pass_chunks(cfg: configs.MatmulConfig, n_rows: int, elem_bytes: int) -> int:
    """Vocab chunks per backward pass for a call of n_rows rows of d logits of elem_bytes each: the
    table's chunks_per_pass, fewer where one pass would pass pass_workspace_max. A speed and memory
    choice only (every count gives the bits of one pass per chunk:
    test_chunks_per_pass_gives_the_chunk_by_chunk_bits)."""
    per = cfg.chunks_per_pass
    if cfg.pass_workspace_max:
        per = min(per, cfg.pass_workspace_max // max(1, n_rows * cfg.chunk_v * elem_bytes))
    return max(1, per)


def chunk_count(V_local: int, chunk_v: int) -> int:
    return cdiv(V_local, chunk_v)


def _operands(cfg: configs.MatmulConfig, hidden: torch.Tensor, weight: torch.Tensor):
    """(x_desc, w_desc, DESC) for the fused kernels. The descriptor path needs a config that asks for
    it and TMA-compatible operands (matmul.tma_ready); otherwise the pointer path, which gives the
    same bits, one program per work item. Built once per call: every vocab chunk reuses them."""
    if not (cfg.persistent_tma and hidden.shape[1] > 0 and tma_ready(hidden, weight)):  # H = 0: no K extent
        return hidden, weight, False
    x_desc = host_descriptor(_tile_stats_kernel, hidden, (cfg.block_m, cfg.block_k))
    w_desc = host_descriptor(_tile_stats_kernel, weight, (cfg.block_n, cfg.block_k))
    return x_desc, w_desc, True


def _programs(desc: bool, device: torch.device, n_items: int) -> int:
    """Programs of a fused launch: persistent (one per SM) on the descriptor path, else one per item."""
    return persistent_programs(device, n_items) if desc else n_items


def tile_stats(hidden, weight, bias, target_local, temperature: float, with_entropy: bool,
               saved: Optional[torch.Tensor] = None):
    """The softmax states of this vocab shard's block_n tiles, in vocab order: fp32 [5, tiles, N].
    saved: an [N, S] buffer (saved="logits") that receives z - the tile's row max of the shard's
    first S columns (S: kept_columns)."""
    N, H = hidden.shape
    V_local = weight.shape[0]
    cfg = tile_config("linear_logp_fwd", hidden)
    n_tiles = cdiv(V_local, cfg.block_n)
    stats = torch.empty((N_STATS, n_tiles, N), dtype=torch.float32, device=hidden.device)
    if N == 0 or n_tiles == 0:
        return stats
    upcast, ieee = operand_flags(hidden.dtype)
    x_desc, w_desc, desc = _operands(cfg, hidden, weight)
    n_progs = _programs(desc, hidden.device, cdiv(N, cfg.block_m) * n_tiles)
    _tile_stats_kernel[(n_progs,)](
        hidden, hidden.stride(0), weight, weight.stride(0), x_desc, w_desc, bias if bias is not None else weight,
        target_local, stats, saved if saved is not None else stats, saved.stride(0) if saved is not None else 0,
        saved.shape[1] if saved is not None else 0, N, H, V_local, n_tiles, 1.0 / temperature, n_progs,
        HAS_BIAS=bias is not None, WITH_ENTROPY=with_entropy, UPCAST=upcast, IEEE=ieee,
        EVEN_K=H % cfg.block_k == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, DESC=desc, SAVE=saved is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return stats


SAVED = ("recompute", "logits")


def kept_columns(cfg: configs.MatmulConfig, V_local: int, vocab_start: int, global_V: int,
                 saved_vocab: Optional[int]) -> int:
    """How many of this shard's columns saved="logits" keeps: its part of the vocab's first
    saved_vocab columns (None: all of them), rounded down to whole backward chunks (cfg: the
    linear_logp_dlogits config; chunk_v is a multiple of the forward's block_n, so the kept columns
    are whole forward tiles too) unless that covers the vocab. Fixed by V and saved_vocab, never by
    the tokens: a token's d hidden then never depends on its batch."""
    if saved_vocab is None or saved_vocab >= global_V:
        kept = global_V
    else:
        kept = saved_vocab // cfg.chunk_v * cfg.chunk_v
    return min(max(kept - vocab_start, 0), V_local)


def saved_dtype(dtype: torch.dtype) -> torch.dtype:
    """The saved logits' dtype: float16 for 16-bit inputs (2 bytes; finer than bfloat16 near the tile
    max, where the values sit), float32 for float32 inputs."""
    return torch.float32 if dtype == torch.float32 else torch.float16


# The merge's launch: rows per program, warps, tiles per unrolled step (by with_entropy). Rows are
# independent and a row's arithmetic does not depend on them (see _merge_kernel): speed choices only.
# H100, 1024 x 151936, states read from HBM: 0.037 ms with entropy at 16 tiles (32: 0.057), 0.029
# without at 32 (16: 0.153, where ptxas interleaves the step's loads with the merge), against 0.37 /
# 0.26 ms tile by tile (docs/reports/h100-linear-logp-merge-2026-12-06.json, last run).
MERGE_BLOCK, MERGE_WARPS, MERGE_TILES = 64, 2, {True: 16, False: 32}


def merge(stats, target, ignore_index: int, with_entropy: bool, *, block: int = MERGE_BLOCK,
          num_warps: int = MERGE_WARPS, tiles: Optional[int] = None):
    """(logp, entropy, row_max, row_logsum) fp32 [N] from tile states [5, tiles, N] in vocab order.
    block / num_warps / tiles: the launch (the locked one by default; others for the tests and sweeps)."""
    n_chunks, N = stats.shape[1], stats.shape[2]
    tiles = MERGE_TILES[with_entropy] if tiles is None else tiles
    dev = stats.device
    if not target.is_contiguous():  # the kernel reads the targets densely
        target = target.contiguous()
    logp, row_max, row_logsum = (torch.empty(N, dtype=torch.float32, device=dev) for _ in range(3))
    entropy = torch.empty(N if with_entropy else 0, dtype=torch.float32, device=dev)
    if N:
        _merge_kernel[(cdiv(N, block),)](
            stats, target, logp, entropy if with_entropy else logp, row_max, row_logsum,
            N, n_chunks, ignore_index, WITH_ENTROPY=with_entropy, BLOCK=block, TILES=tiles, num_warps=num_warps,
        )
    return logp, entropy, row_max, row_logsum


def backward_chunks(grad_logp, grad_entropy, hidden, weight, bias, target_local, row_max, row_logsum,
                    entropy, temperature: float, acc_in: Optional[torch.Tensor], final: bool,
                    saved: Optional[torch.Tensor] = None, tile_max: Optional[torch.Tensor] = None):
    """This shard's part of the backward.

    grad_logp must already be zero on ignored rows. saved / tile_max (saved="logits"): the forward's
    z - tile max [N, S] of the shard's first S columns and those tiles' row maxima; their d logits then
    come from them instead of a recomputed GEMM. acc_in: the fp32 d hidden accumulated over the
    vocab before this shard (None: this shard starts the vocab). Returns (d hidden, d weight,
    d bias): d hidden in hidden's dtype when `final`, else the fp32 accumulator for the next shard.
    """
    N, H = hidden.shape
    V_local = weight.shape[0]
    dev, dt = hidden.device, hidden.dtype
    cfg = tile_config("linear_logp_dlogits", hidden)
    C = cfg.chunk_v
    grad_weight = torch.empty_like(weight)
    grad_bias = torch.empty_like(bias) if bias is not None else None
    n_chunks = chunk_count(V_local, C) if N else 0
    if n_chunks == 0:  # nothing of this shard touches d hidden
        if N == 0 or V_local == 0:
            grad_weight.zero_()
            if grad_bias is not None:
                grad_bias.zero_()
        acc = acc_in if acc_in is not None else torch.zeros((N, H), dtype=torch.float32, device=dev)
        return (acc.to(dt) if final else acc), grad_weight, grad_bias
    P = C * pass_chunks(cfg, N, hidden.element_size())  # vocab columns per pass (whole chunks)
    d_logits = torch.empty((N, min(P, V_local)), dtype=dt, device=dev)
    n_row_blocks = cdiv(N, cfg.block_m)
    dbias_part = (torch.empty((n_row_blocks, d_logits.shape[1]), dtype=torch.float32, device=dev)
                  if bias is not None else row_max)
    with_h = grad_entropy is not None
    upcast, ieee = operand_flags(dt)
    mm_cfg = configs.lookup_matmul("matmul", arch_of(dev), dt)
    dh_cfg = configs.lookup_matmul("linear_logp_dhidden", arch_of(dev), dt)
    x_desc, w_desc, desc = _operands(cfg, hidden, weight)
    if saved is not None:
        fwd = tile_config("linear_logp_fwd", hidden)
        if (fwd.block_m, fwd.block_n) != (cfg.block_m, cfg.block_n) or C % cfg.block_n:
            raise RuntimeError("configs: saved logits need linear_logp_dlogits' tiles equal to the forward's "
                               f"and chunk_v a multiple of block_n (fwd {fwd}, dlogits {cfg})")
    kept = saved.shape[1] if saved is not None else 0
    acc = acc_in
    n_passes = cdiv(V_local, P)
    for c in range(n_passes):  # increasing vocab order: chunks, and passes of whole chunks
        c0 = c * P
        width = min(P, V_local - c0)
        # the pass's kept columns come first (kept is whole chunks or the shard); d logits of a column
        # are the same bits whichever launch of the pass writes them (elementwise in the column)
        split = min(max(kept - c0, 0), width)
        if split:
            _dlogits_saved_kernel[(n_row_blocks, cdiv(split, cfg.block_n))](
                saved, saved.stride(0), tile_max, target_local, row_max, row_logsum, entropy if with_h else row_max,
                grad_logp, grad_entropy if with_h else grad_logp,
                d_logits, d_logits.stride(0), dbias_part, dbias_part.stride(0) if bias is not None else 0,
                N, c0, split, 1.0 / temperature,
                HAS_BIAS=bias is not None, WITH_ENTROPY_GRAD=with_h, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                PIECES=min(8, cfg.block_n // 8), num_warps=cfg.num_warps,
            )
        if split < width:
            rest = width - split
            d_rest, part_rest = d_logits[:, split:], dbias_part[:, split:] if bias is not None else dbias_part
            n_progs = _programs(desc, dev, n_row_blocks * cdiv(rest, cfg.block_n))
            _dlogits_kernel[(n_progs,)](
                hidden, hidden.stride(0), weight, weight.stride(0), x_desc, w_desc,
                bias if bias is not None else weight, target_local, row_max, row_logsum, entropy if with_h else row_max,
                grad_logp, grad_entropy if with_h else grad_logp,
                d_rest, d_rest.stride(0), part_rest, part_rest.stride(0) if bias is not None else 0,
                N, H, V_local, c0 + split, rest, 1.0 / temperature, n_progs,
                HAS_BIAS=bias is not None, WITH_ENTROPY_GRAD=with_h, UPCAST=upcast, IEEE=ieee,
                EVEN_K=H % cfg.block_k == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                GROUP_M=cfg.group_m, DESC=desc, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )
        d = d_logits[:, :width]
        matmul_into(d.t(), hidden, grad_weight[c0:c0 + width], cfg=mm_cfg)
        last = c == n_passes - 1
        if last and final:
            out = torch.empty((N, H), dtype=dt, device=dev)
        elif acc is None:
            out = torch.empty((N, H), dtype=torch.float32, device=dev)
        else:
            out = acc  # in place: each tile is read and written by one program
        matmul_into(d, weight[c0:c0 + width], out, c_in=acc, cfg=dh_cfg, fold_k=C)  # chunk by chunk
        acc = out
        if bias is not None:
            _dbias_kernel[(cdiv(width, 1024),)](
                dbias_part, dbias_part.stride(0), n_row_blocks, grad_bias[c0:c0 + width], width,
                BLOCK=1024, num_warps=4,
            )
    return acc, grad_weight, grad_bias


def local_targets(target, vocab_start: int, V_local: int, ignore_index: int):
    """Global target ids -> this shard's column, or -1 where the shard does not hold the target."""
    local = target.to(torch.int64) - vocab_start
    held = (target != ignore_index) & (local >= 0) & (local < V_local)
    return torch.where(held, local, -1).to(torch.int32).contiguous()


def _grad_logp_or_zero(grad_logp, target, ignore_index, like):
    g = torch.zeros_like(like) if grad_logp is None else grad_logp.to(torch.float32)
    return torch.where(target == ignore_index, 0.0, g).contiguous()


# ---- one shard (no tensor parallelism): torch.library custom ops ----

@torch.library.custom_op("rlk_triton::linear_logp_fwd", mutates_args=())
def linear_logp_fwd(
    hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor,
    temperature: float, ignore_index: int, with_entropy: bool, save_cols: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp, entropy, row_max, row_logsum, saved, tile_max); saved [N, save_cols] and tile_max
    [its tiles, N] are empty unless save_cols (saved="logits": what the backward reads instead of
    recomputing; save_cols from kept_columns)."""
    target_local = local_targets(target, 0, weight.shape[0], ignore_index)
    stats, saved, tile_max = _stats_and_saved(hidden, weight, bias, target_local, temperature, with_entropy,
                                              save_cols)
    return (*merge(stats, target, ignore_index, with_entropy), saved, tile_max)


def _stats_and_saved(hidden, weight, bias, target_local, temperature, with_entropy, save_cols: int):
    """(stats, saved, tile_max): the tile states, the kept-logits buffer [N, save_cols] and the kept
    tiles' row maxima [tiles, N] (stats plane 0); the last two empty ([0, 0], [0, N]) when nothing is kept."""
    if not 0 <= save_cols <= weight.shape[0]:  # kept_columns never asks more: columns past V would stay unwritten
        raise ShapeError("save_cols", f"{save_cols} outside [0, {weight.shape[0]}], the shard's vocab")
    saved = hidden.new_empty((hidden.shape[0], save_cols) if save_cols else (0, 0), dtype=saved_dtype(hidden.dtype))
    stats = tile_stats(hidden, weight, bias, target_local, temperature, with_entropy, saved if save_cols else None)
    tiles = cdiv(save_cols, tile_config("linear_logp_fwd", hidden).block_n)
    return stats, saved, stats[0, :tiles].clone()


@linear_logp_fwd.register_fake
def _(hidden, weight, bias, target, temperature, ignore_index, with_entropy, save_cols):
    n = hidden.shape[0]
    f = lambda k: hidden.new_empty(k, dtype=torch.float32)  # noqa: E731
    tiles = cdiv(save_cols, tile_config("linear_logp_fwd", hidden).block_n)
    return (f(n), f(n if with_entropy else 0), f(n), f(n),
            hidden.new_empty((n, save_cols) if save_cols else (0, 0), dtype=saved_dtype(hidden.dtype)),
            f((tiles, n) if save_cols else (0, n)))


@torch.library.custom_op("rlk_triton::linear_logp_bwd", mutates_args=())
def linear_logp_bwd(
    grad_logp: torch.Tensor, grad_entropy: Optional[torch.Tensor], hidden: torch.Tensor,
    weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor, row_max: torch.Tensor,
    row_logsum: torch.Tensor, entropy: torch.Tensor, temperature: float, ignore_index: int,
    saved: Optional[torch.Tensor], tile_max: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    target_local = local_targets(target, 0, weight.shape[0], ignore_index)
    dh, dw, db = backward_chunks(grad_logp, grad_entropy, hidden, weight, bias, target_local, row_max,
                                 row_logsum, entropy, temperature, acc_in=None, final=True, saved=saved,
                                 tile_max=tile_max)
    return dh, dw, (db if db is not None else weight.new_empty(0))


@linear_logp_bwd.register_fake
def _(grad_logp, grad_entropy, hidden, weight, bias, *rest):
    return (torch.empty_like(hidden), torch.empty_like(weight),
            torch.empty_like(bias) if bias is not None else weight.new_empty(0))


def _setup_context(ctx, inputs, output):
    hidden, weight, bias, target, temperature, ignore_index, with_entropy, save_cols = inputs
    _, entropy, row_max, row_logsum, saved, tile_max = output
    ctx.save_for_backward(hidden, weight, bias, target, row_max, row_logsum, entropy, saved, tile_max)
    ctx.temperature, ctx.ignore_index, ctx.save_cols = temperature, ignore_index, save_cols
    # Outputs without a gradient reach _backward as None, not as zeros: autograd would otherwise
    # allocate and clear an [N, V] tensor for `saved` on every backward (2.3 GiB at 8192 x 151936).
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_logp, grad_entropy, _grad_max, _grad_logsum, _grad_saved, _grad_tile_max):
    hidden, weight, bias, target, row_max, row_logsum, entropy, saved, tile_max = ctx.saved_tensors
    g = _grad_logp_or_zero(grad_logp, target, ctx.ignore_index, row_max)
    ge = grad_entropy.contiguous() if grad_entropy is not None and grad_entropy.numel() else None
    keep = ctx.save_cols > 0
    dh, dw, db = call_linear_logp_bwd(g, ge, hidden, weight, bias, target, row_max, row_logsum, entropy,
                                      ctx.temperature, ctx.ignore_index, saved if keep else None,
                                      tile_max if keep else None)
    return dh, dw, (db if bias is not None else None), None, None, None, None, None


call_linear_logp_fwd = autograd_op(linear_logp_fwd, _backward, _setup_context)
call_linear_logp_bwd = direct(linear_logp_bwd)


# ---- vocab-parallel shards (tensor parallelism) ----

def gather_stats(stats: torch.Tensor, group) -> torch.Tensor:
    """All ranks' tile states [5, tiles, N], concatenated in rank order (= vocab order)."""
    import torch.distributed as dist

    k = dist.get_world_size(group)
    counts = [torch.zeros(1, dtype=torch.int64, device=stats.device) for _ in range(k)]
    dist.all_gather(counts, torch.tensor([stats.shape[1]], dtype=torch.int64, device=stats.device), group=group)
    counts = [int(c) for c in counts]
    padded = stats.new_zeros((N_STATS, max(counts), stats.shape[2]))
    padded[:, :stats.shape[1]] = stats
    parts = [torch.empty_like(padded) for _ in range(k)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[:, :n] for p, n in zip(parts, counts)], dim=1).contiguous()


class LinearLogpTP(torch.autograd.Function):
    """linear_logp over a vocab shard of a process group; see docs/linear_logp.md for the TP rule."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, temperature, ignore_index, with_entropy, group,
                vocab_start, save_cols=0):
        target_local = local_targets(target, vocab_start, weight.shape[0], ignore_index)
        # saved="logits": this shard's kept z - tile max and those tiles' maxima (local tile indices), as
        # one shard keeps them; tiles start at the shard's start, on the forward's tile boundaries when aligned
        stats, saved, tile_max = _stats_and_saved(hidden, weight, bias, target_local, temperature, with_entropy,
                                                  save_cols)
        logp, entropy, row_max, row_logsum = merge(gather_stats(stats, group), target, ignore_index,
                                                   with_entropy)
        ctx.save_for_backward(hidden, weight, bias, target, target_local, row_max, row_logsum, entropy, saved,
                              tile_max)
        ctx.temperature, ctx.ignore_index, ctx.group, ctx.save_cols = temperature, ignore_index, group, save_cols
        ctx.mark_non_differentiable(row_max, row_logsum)
        return logp, entropy, row_max, row_logsum

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy, _grad_max, _grad_logsum):
        import torch.distributed as dist

        hidden, weight, bias, target, target_local, row_max, row_logsum, entropy, saved, tile_max = ctx.saved_tensors
        keep = ctx.save_cols > 0
        group = ctx.group
        rank, k = dist.get_rank(group), dist.get_world_size(group)
        g = _grad_logp_or_zero(grad_logp, target, ctx.ignore_index, row_max)
        ge = grad_entropy.contiguous() if grad_entropy is not None and grad_entropy.numel() else None
        # d hidden accumulates over the vocab in increasing chunk order: rank r continues the sum
        # of ranks 0..r-1, so the sequence of additions is the single-shard one.
        acc_in = None
        if rank > 0:
            acc_in = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
            dist.recv(acc_in, src=dist.get_global_rank(group, rank - 1), group=group)
        last = rank == k - 1
        out, dw, db = backward_chunks(g, ge, hidden, weight, bias, target_local, row_max, row_logsum,
                                      entropy, ctx.temperature, acc_in=acc_in, final=last,
                                      saved=saved if keep else None, tile_max=tile_max if keep else None)
        if not last:
            dist.send(out, dst=dist.get_global_rank(group, rank + 1), group=group)
            out = torch.empty_like(hidden)
        dist.broadcast(out, src=dist.get_global_rank(group, k - 1), group=group)
        return out, dw, db, None, None, None, None, None, None, None
