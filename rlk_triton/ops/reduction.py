"""The one row-reduction template the row-wise kernels share, and its reduction order.

Reduction order (every kernel that reduces along a row with these helpers):
  1. A row is split into tiles of BLOCK_V consecutive elements (BLOCK_V from configs.LOCKED_CONFIGS).
  2. Tiles are folded into the running state strictly in increasing order: the full tiles
     0, 1, ..., V // BLOCK_V - 1, then the masked tail tile if V % BLOCK_V != 0.
  3. Inside a tile, tl.max / tl.sum reduce BLOCK_V lanes with the tree the compiler emits for that
     (BLOCK_V, num_warps); it is fixed for a given config and build, never data- or batch-dependent.
  4. Everything is fp32; inputs are upcast on load (also what the interpreter needs for bf16).
One program owns one row, so no result ever mixes rows and no atomics are involved.

Online softmax state, in natural-log units, for x = logits / T:
  m   running max of x seen so far (-inf before any finite value)
  s   sum_j exp(x_j - m)
  t   sum_j exp(x_j - m) * (x_j - m)        (only for entropy)
so that logsumexp = m + log(s) and entropy = log(s) - t / s. Keeping t relative to the max, rather
than sum p * x, avoids cancelling two numbers of the size of the logits (|x| ~ 1e4 stays exact).
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
