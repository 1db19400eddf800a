"""The one row-reduction template the row-wise kernels share, and its reduction order.

Reduction order (every kernel that reduces along a row with these helpers):
  1. A row is split into tiles of BLOCK_V consecutive elements (BLOCK_V from configs.LOCKED_CONFIGS).
  2. Tiles are folded into the running state strictly in increasing order: the full tiles
     0, 1, ..., V // BLOCK_V - 1, then the masked tail tile if V % BLOCK_V != 0.
  3. Inside a tile, tl.max / tl.sum reduce BLOCK_V lanes with the tree the compiler emits for that
     (BLOCK_V, num_warps); it is fixed for a given config and build, never data- or batch-dependent.
  4. Everything is fp32; inputs are upcast on load (also what the interpreter needs for bf16).
One program owns one row (in selected_logp's forward, one chunk of a row: steps 5-7), so no result
ever mixes rows and no atomics are involved.

selected_logp's forward adds a chunk level above the tiles (rlk_triton/ops/selected_logp.py):
  5. The row is cut into chunks of CHUNK_V consecutive columns (configs "selected_logp_chunk", a
     multiple of BLOCK_V and a function of (arch, dtype, V bucket) only): chunk c holds the tiles
     c * CHUNK_V / BLOCK_V, ... of steps 1-3, in increasing order, from the empty state; the row's
     masked tail tile is the last tile of the last chunk.
  6. The chunk states merge into the row's state in one step (merge_all_softmax_states below): the
     row max over the chunk maxima, then each chunk's s (and t, re-anchored) scaled to it and summed
     by one tl.sum over next_pow2(chunks) lanes, the compiler's fixed tree for that width (chunks
     past the last are empty states: zero terms). One row per row of the merge kernel's tile.
     (A sequential fold, chunk after chunk, costs ~0.65 us per chunk of serial latency on the H200:
     26 us at 64 rows x 151936 with 10 chunks; the one-step merge has no chain.)
  7. A row of one chunk (V <= CHUNK_V) skips step 6 and finishes in the chunk's program, with the
     bits of steps 1-4.
The number of chunks and their bounds depend on V and the locked width only, never on the row count.

Online softmax state, in natural-log units, for x = logits / T:
  m   running max of x seen so far (-inf before any finite value)
  s   sum_j exp(x_j - m)
  t   sum_j exp(x_j - m) * (x_j - m)        (only for entropy)
so that logsumexp = m + log(s) and entropy = log(s) - t / s. Keeping t relative to the max, rather
than sum p * x, avoids cancelling two numbers of the size of the logits (|x| ~ 1e4 stays exact).

Segment sums over tokens (embedding backward, rlk_triton/ops/embedding.py):
  1. Token indices are stably sorted by id (torch.argsort(stable=True)): each id's tokens form one
     contiguous segment, in ascending token order. Padding and out-of-range ids sort last, unused.
  2. One program per (id, column tile) folds its segment's gradient rows one token at a time,
     acc = ((0 + g_t0) + g_t1) + ..., in fp32, for t0 < t1 < ...; rows are loaded four at a time
     but added in that order (a masked row adds +0.0, which leaves acc unchanged).
  3. The sum is rounded once to the weight's dtype and written; ids without tokens get zero rows.
So dW[v] is a function of v's tokens' gradients in token order only: no atomics, no tree, nothing
that depends on the other ids or the launch.
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def online_softmax_tile(x, m, s, t, WITH_ENTROPY: tl.constexpr):
    """Fold one fp32 tile x (masked lanes = -inf) into the state (m, s, t)."""
    m_new = tl.maximum(m, tl.max(x, 0))
    # While the row is all -inf so far, shift by 0 instead of -inf so that no inf - inf appears.
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    d = x - shift  # <= 0, exact when x and the max are close (Sterbenz)
    e = tl.exp2(d * 1.4426950408889634)
    alpha = tl.exp2((m - shift) * 1.4426950408889634)  # rescale of the old state; 0 when m = -inf
    if WITH_ENTROPY:
        # Re-anchor t from m to the new shift: sum e^{x-m}(x-m) -> alpha * (t + (m - shift) * s).
        moved = tl.where(s > 0.0, (m - shift) * s, 0.0)
        t = alpha * (t + moved) + tl.sum(tl.where(e > 0.0, e * d, 0.0), 0)
    s = s * alpha + tl.sum(e, 0)
    return m_new, s, t


@triton.jit
def log_of_sum(s):
    """Natural log of the state's sum (s >= 1 once a finite value was seen)."""
    return tl.log2(s) * 0.6931471805599453


# ---- Row blocks and tile states (linear_logp) ----
# linear_logp computes logits tile by tile and never stores them, so it reduces a block of rows at
# once, and cuts a row's vocab into tiles of block_n columns at fixed global positions:
#   1. Each tile's state (m, s, t) comes from online_softmax_rows applied once to the empty state
#      (online_softmax_tile's arithmetic, one state per row of the block), and is stored.
#   2. Tile states then merge into the row's state strictly in increasing global vocab order,
#      starting from the empty state (merge_softmax_states).
# A tile's state is a pure function of its rows and its vocab range, so a vocab shard that starts
# on a tile boundary yields the same states on any rank: the merge then sees the same sequence.


@triton.jit
def online_softmax_rows(x, m, s, t, WITH_ENTROPY: tl.constexpr):
    """online_softmax_tile for a [rows, cols] fp32 tile: per-row states m, s, t of shape [rows]."""
    m_new = tl.maximum(m, tl.max(x, 1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    d = x - shift[:, None]
    e = tl.exp2(d * 1.4426950408889634)
    alpha = tl.exp2((m - shift) * 1.4426950408889634)
    if WITH_ENTROPY:
        moved = tl.where(s > 0.0, (m - shift) * s, 0.0)
        t = alpha * (t + moved) + tl.sum(tl.where(e > 0.0, e * d, 0.0), 1)
    s = s * alpha + tl.sum(e, 1)
    return m_new, s, t


@triton.jit
def merge_softmax_states(m, s, t, m_c, s_c, t_c, WITH_ENTROPY: tl.constexpr):
    """Fold a tile's state (m_c, s_c, t_c) into the running state (m, s, t). An empty tile
    (m_c = -inf, s_c = t_c = 0) leaves the state bitwise unchanged."""
    m_new = tl.maximum(m, m_c)
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2((m - shift) * 1.4426950408889634)
    beta = tl.exp2((m_c - shift) * 1.4426950408889634)
    if WITH_ENTROPY:
        t = alpha * (t + tl.where(s > 0.0, (m - shift) * s, 0.0)) \
            + beta * (t_c + tl.where(s_c > 0.0, (m_c - shift) * s_c, 0.0))
    s = s * alpha + s_c * beta
    return m_new, s, t


@triton.jit
def merge_all_softmax_states(m_c, s_c, t_c, WITH_ENTROPY: tl.constexpr):
    """Merge [rows, chunks] chunk states (empty ones: m = -inf, s = t = 0) into per-row states in one
    step: m = max_c m_c; s = sum_c s_c e^(m_c - m); t = sum_c e^(m_c - m) (t_c + (m_c - m) s_c)."""
    m = tl.max(m_c, 1)
    shift = tl.where(m == float("-inf"), 0.0, m)
    d = m_c - shift[:, None]
    beta = tl.exp2(d * 1.4426950408889634)  # 0 for an empty chunk
    s = tl.sum(s_c * beta, 1)
    t = tl.zeros_like(s)
    if WITH_ENTROPY:
        t = tl.sum(beta * (t_c + tl.where(s_c > 0.0, d * s_c, 0.0)), 1)
    return m, s, t


# ---- Sums of products along a row, and the row-block partition of dW (RMSNorm) ----
# A row's hidden dim H is read in tiles of BLOCK_H = min(next_pow2(H), configs block_v):
#   1. Lanes accumulate the tiles' products in increasing tile order (fold_products: lane k holds
#      elements k, k + BLOCK_H, ...; one tile when H <= BLOCK_H), starting from 0.
#   2. One tl.sum over the BLOCK_H lanes: the compiler's fixed tree for (BLOCK_H, num_warps).
# RMSNorm's sum of squares (forward) and its row dot product sum_j (g w)_j xhat_j (backward) use it.
# dW = sum over rows of g * xhat reduces ACROSS rows, on a partition that depends on nothing but the
# row count N and two locked numbers (never the SM count, never atomics):
#   3. Rows are cut into blocks of R consecutive rows (configs "rmsnorm_dw_rows"); the program of
#      block b adds its rows' terms in increasing row order into an fp32 partial row P[b, :].
#   4. The partials reduce as in 1-2, blocks taking the place of tiles: per column, lane b of a
#      [BLOCK_B, columns] tile (BLOCK_B from configs "rmsnorm_dw_reduce") accumulates the partials of
#      blocks b, b + BLOCK_B, ... in increasing order, then one tl.sum tree over the BLOCK_B lanes;
#      dW is rounded to the weight's dtype once. Columns are independent: their tiling never matters.
# So dW is run-to-run deterministic for a given N, and bitwise equal for equal (rows, order).


@triton.jit
def fold_products(acc, a, b):
    """Lane-wise fold of one fp32 tile's products a * b into acc (masked lanes hold a = 0)."""
    return acc + a * b


# ---- Batch statistics over masked tokens: masked_whiten (rlk_triton/ops/advantages.py) ----
#   1. One program per row folds its BLOCK_T-token tiles in increasing order, each tile reduced by
#      tl.sum's tree over BLOCK_T lanes (values of inactive lanes are 0): the row's sum and count.
#   2. One program folds the rows' sums in tiles of BLOCK_B rows in increasing order (tl.sum per
#      tile): the batch mean = sum / count (counts are int32, exact).
#   3. Steps 1-2 again on the squared deviations from that mean (two passes: no cancellation): the
#      variance; the divisor sqrt_rn(var + eps) or sqrt_rn(var) + eps; then an elementwise apply.
#   Blocks are the locked rl_policy_loss_rows / _batch widths: the order depends on B and T only
#   through the number of tiles, and padding rows or masked tokens add exact zeros.
# ---- Per-sequence statistics: rollout_correction (rlk_triton/ops/rollout_correction.py) ----
#   One program per row: pass 1 folds the row's tiles in increasing order (tl.sum / tl.max per
#   tile) into its sums of lr, k1, k2, k3, its maxima of k2 / k3 and its count; pass 2 re-reads the
#   tiles and writes the weights and the keep mask. Nothing crosses rows.


# ---- Attention: the online softmax over KV blocks (rlk_triton/ops/attention.py) ----
# Per query row, state (m, l, acc) in fp32, m in log2 units (scores times scale * log2 e):
#   1. Start from m = -inf, l = 0, acc = 0. KV blocks of BLOCK_N keys (configs "attention_fwd"; the
#      decode kernel's block_n is locked equal) are measured from the sequence's position 0 and folded
#      strictly in ascending order by attn_block_update, the one helper both kernels call:
#        s = where(visible, (q @ k^T) * (scale * log2 e), -inf)       (fp32 tl.dot; the product
#            rounded alone, PTX mul.rn, so a block every row sees whole, folded without the where,
#            gives the same bits: each kernel runs those blocks in an unmasked loop, then the rest)
#        m_new = max(m, rowmax(s)); shift = m_new, or 0 while m_new = -inf (no -inf - -inf)
#        p = exp2(s - shift); alpha = exp2(m - shift)
#        l = l * alpha + rowsum(p);  acc = acc * alpha + p_lowp @ v  (p rounded to v's dtype)
#      A block with no visible key for a row leaves that row's state bitwise unchanged (alpha = 1,
#      p = 0), so loops that differ only by such blocks (training vs decode) give the same bits.
#   2. out = acc / l, rounded once to the output dtype; lse = (m + log2 l) * ln 2 (natural log).
# Context parallelism chains the state: a KV range starting at a multiple of BLOCK_N continues from
# the previous range's (m, l, acc) -- the same updates in the same order. Merging independently
# normalized partials (merge_softmax_states' arithmetic) is not associative, hence not bitwise.
