"""Selected-token log-probabilities (and entropy) from logits: kernels, launchers, custom ops.

Forward: the row's vocab is split into chunks of CHUNK_V columns (configs "selected_logp_chunk", a
function of (arch, dtype, V bucket) only), so that a few rows still fill the GPU:
  1. `_fwd_kernel`, grid (scored rows, chunks): streams its chunk's tiles once, in increasing
     order, and stores the chunk's softmax state (m, s, t) in an fp32 workspace [2 or 3, rows, chunks].
  2. `_fwd_merge_kernel`, MERGE_ROWS rows per program: merges each row's chunk states in one step
     (reduction.merge_all_softmax_states) and writes fp32 logp, entropy and the two row statistics the backward needs (max and
     log-sum, kept apart so that exp(x - lse) stays exact for logits of size ~1e4).
A row of one chunk (V <= CHUNK_V) is finished by `_fwd_kernel` itself (FINISH): the unsplit kernel's
bits, and no workspace or second launch. Which path
runs and every row's reduction order depend on V only (reduction.py gives the order).
Backward: elementwise per (row, vocab tile); no reduction, no atomics.

Row addressing: row r of the [..., V] logits starts at
  (r // inner_size) * stride_outer + (r % inner_size) * stride_inner,
which covers [N, V] with any row stride and [B, T, V] slices such as logits[:, :-1] without a copy.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import configs, native
from .._runtime import arch_of
from .reduction import log_of_sum, merge_all_softmax_states, online_softmax_tile
from .dispatch import autograd_op, direct, wants_grad
from .launch import SLOT, Template, cached, cdiv, next_power_of_2, planned


@triton.jit
def _row_of(row_index_ptr, pid, total_rows, HAS_ROW_INDEX: tl.constexpr):
    """(row, row_ok) of scored row pid (a scalar, or a vector of scored rows). A row index outside
    [0, total_rows) (row_indices with validate=False) is clamped to row 0 and flagged: no program
    reads or writes outside the logits (the launcher never launches on zero rows); a valid index
    passes unchanged."""
    if HAS_ROW_INDEX:
        row = tl.load(row_index_ptr + pid).to(tl.int64)
    else:
        row = pid.to(tl.int64)
    row_ok = (row >= 0) & (row < total_rows)
    return tl.where(row_ok, row, 0), row_ok


@triton.jit
def _row_start(logits_ptr, stride_outer, stride_inner, inner_size, row):
    """Address of the first logit of row `row` of the [..., V] logits."""
    return logits_ptr + (row // inner_size) * stride_outer + (row % inner_size) * stride_inner


@triton.jit
def _inv_temperature(temperature_ptr, temperature, pid, PER_ROW_TEMPERATURE: tl.constexpr):
    if PER_ROW_TEMPERATURE:
        temperature = tl.load(temperature_ptr + pid)
    return 1.0 / tl.cast(temperature, tl.float32)


@triton.jit
def _row_results(m, s, t, x_t, target, V, ignore_index, row_ok):
    """(logp, log-sum, entropy) of a row from its softmax state and its target's x (elementwise).
    A row that does not exist (row_ok false: a bad row index) gets NaN logp. Its entropy is made NaN
    by the callers through the state (a select on the entropy here moved its subtraction away from
    log_s's multiply in the merge kernel's PTX, and ptxas then rounded it differently: 1 ulp on the
    H200 for valid rows)."""
    log_s = log_of_sum(s)
    logp = (x_t - m) - log_s  # subtract the max first: exact for x_t close to it
    logp = tl.where((target >= 0) & (target < V), logp, float("nan"))
    logp = tl.where(target == ignore_index, 0.0, logp)
    logp = tl.where(row_ok, logp, float("nan"))
    return logp, log_s, log_s - t / s


# n_rows / n_chunks are never specialized: Triton turns an int argument equal to 1 into a Python
# constant, which has no .to().
@cached
@triton.jit(do_not_specialize=["inner_size", "temperature", "ignore_index", "n_rows", "n_chunks", "total_rows"])
def _fwd_kernel(
    logits_ptr, stride_outer, stride_inner, inner_size,
    target_ptr, row_index_ptr, temperature_ptr, temperature,
    logp_ptr, entropy_ptr, row_max_ptr, row_logsum_ptr, state_ptr,
    V, ignore_index, n_rows, n_chunks, total_rows,
    HAS_ROW_INDEX: tl.constexpr, PER_ROW_TEMPERATURE: tl.constexpr, WITH_ENTROPY: tl.constexpr,
    FINISH: tl.constexpr, BLOCK_V: tl.constexpr, CHUNK_V: tl.constexpr,
):
    # Program (scored row, vocab chunk): the chunk's tiles folded in increasing order from the empty
    # state. FINISH (the row is one chunk): the state is the row's, so write the results; else store
    # the chunk's state for _fwd_merge_kernel.
    pid = tl.program_id(0)
    chunk = tl.program_id(1)
    row, row_ok = _row_of(row_index_ptr, pid, total_rows, HAS_ROW_INDEX)
    row_ptr = _row_start(logits_ptr, stride_outer, stride_inner, inner_size, row)
    inv_t = _inv_temperature(temperature_ptr, temperature, pid, PER_ROW_TEMPERATURE)

    lanes = tl.arange(0, BLOCK_V)
    start = chunk * CHUNK_V  # CHUNK_V is a multiple of BLOCK_V: the chunks' tiles are the row's tiles
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    t = tl.zeros((), tl.float32)
    width = tl.minimum(V - start, CHUNK_V)  # CHUNK_V but in the last chunk
    n_full = width // BLOCK_V
    for tile in range(0, n_full):  # full tiles: unmasked, vectorized loads
        x = tl.load(row_ptr + start + tile * BLOCK_V + lanes).to(tl.float32) * inv_t
        m, s, t = online_softmax_tile(x, m, s, t, WITH_ENTROPY)
    if n_full * BLOCK_V < width:  # the row's tail tile: last in the last chunk
        offs = start + n_full * BLOCK_V + lanes
        x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32) * inv_t
        m, s, t = online_softmax_tile(x, m, s, t, WITH_ENTROPY)

    if FINISH:
        target = tl.load(target_ptr + pid).to(tl.int64)
        in_range = (target >= 0) & (target < V)
        x_t = tl.load(row_ptr + tl.where(in_range, target, 0)).to(tl.float32) * inv_t
        logp, log_s, entropy = _row_results(m, s, t, x_t, target, V, ignore_index, row_ok)
        entropy = tl.where(row_ok, entropy, float("nan"))  # (the same bits for valid rows on the H200)
        tl.store(logp_ptr + pid, logp)
        tl.store(row_max_ptr + pid, m)
        tl.store(row_logsum_ptr + pid, log_s)
        if WITH_ENTROPY:
            tl.store(entropy_ptr + pid, entropy)
    else:
        # states [m, s (, t)] x [rows, chunks], fp32: a row's chunk states are contiguous
        out = state_ptr + pid.to(tl.int64) * n_chunks + chunk
        plane = n_rows.to(tl.int64) * n_chunks
        tl.store(out, m)
        tl.store(out + plane, tl.where(row_ok, s, float("nan")))  # a missing row: NaN sum, so NaN results
        if WITH_ENTROPY:
            tl.store(out + 2 * plane, t)


@cached
@triton.jit(do_not_specialize=["inner_size", "temperature", "ignore_index", "n_rows", "n_chunks", "total_rows"])
def _fwd_merge_kernel(
    logits_ptr, stride_outer, stride_inner, inner_size,
    target_ptr, row_index_ptr, temperature_ptr, temperature,
    logp_ptr, entropy_ptr, row_max_ptr, row_logsum_ptr, state_ptr,
    V, ignore_index, n_rows, n_chunks, total_rows,
    HAS_ROW_INDEX: tl.constexpr, PER_ROW_TEMPERATURE: tl.constexpr, WITH_ENTROPY: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, CHUNKS: tl.constexpr,
):
    # A block of scored rows: each row's chunk states merged in one step (merge_all_softmax_states;
    # row by row, so the block never mixes rows), then the results as in _fwd_kernel's FINISH.
    block = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    ok = block < n_rows
    pid = tl.minimum(block, n_rows - 1)  # lanes past the end redo the last row; their stores are masked
    row, row_ok = _row_of(row_index_ptr, pid, total_rows, HAS_ROW_INDEX)
    row_ptr = _row_start(logits_ptr, stride_outer, stride_inner, inner_size, row)
    inv_t = _inv_temperature(temperature_ptr, temperature, pid, PER_ROW_TEMPERATURE)
    target = tl.load(target_ptr + pid).to(tl.int64)
    in_range = (target >= 0) & (target < V)
    x_t = tl.load(row_ptr + tl.where(in_range, target, 0)).to(tl.float32) * inv_t

    plane = n_rows.to(tl.int64) * n_chunks
    cols = tl.arange(0, CHUNKS)  # CHUNKS = next_pow2(n_chunks): a function of V only
    have = (cols < n_chunks)[None, :]
    at = state_ptr + pid.to(tl.int64)[:, None] * n_chunks + cols[None, :]
    m_c = tl.load(at, mask=have, other=float("-inf"))  # chunks past the last: empty states
    s_c = tl.load(at + plane, mask=have, other=0.0)
    t_c = s_c  # not read without entropy
    if WITH_ENTROPY:
        t_c = tl.load(at + 2 * plane, mask=have, other=0.0)
    m, s, t = merge_all_softmax_states(m_c, s_c, t_c, WITH_ENTROPY)

    logp, log_s, entropy = _row_results(m, s, t, x_t, target, V, ignore_index, row_ok)
    tl.store(logp_ptr + block, logp, mask=ok)
    tl.store(row_max_ptr + block, m, mask=ok)
    tl.store(row_logsum_ptr + block, log_s, mask=ok)
    if WITH_ENTROPY:
        tl.store(entropy_ptr + block, entropy, mask=ok)


@cached
@triton.jit(do_not_specialize=["inner_size", "temperature", "ignore_index", "total_rows"])
def _bwd_kernel(
    logits_ptr, stride_outer, stride_inner, inner_size,
    target_ptr, row_index_ptr, temperature_ptr, temperature,
    row_max_ptr, row_logsum_ptr, entropy_ptr,
    grad_logp_ptr, grad_entropy_ptr, grad_logits_ptr, grad_row_stride,
    V, ignore_index, total_rows,
    HAS_ROW_INDEX: tl.constexpr, PER_ROW_TEMPERATURE: tl.constexpr, WITH_ENTROPY_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    pid = tl.program_id(0)
    tile = tl.program_id(1)
    row, row_ok = _row_of(row_index_ptr, pid, total_rows, HAS_ROW_INDEX)
    row_ptr = _row_start(logits_ptr, stride_outer, stride_inner, inner_size, row)
    if PER_ROW_TEMPERATURE:
        temperature = tl.load(temperature_ptr + pid)
    inv_t = 1.0 / tl.cast(temperature, tl.float32)

    offs = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = offs < V
    x = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32) * inv_t
    log_p = (x - tl.load(row_max_ptr + pid)) - tl.load(row_logsum_ptr + pid)
    p = tl.exp2(log_p * 1.4426950408889634)

    target = tl.load(target_ptr + pid).to(tl.int64)
    g = tl.load(grad_logp_ptr + pid)
    g = tl.where(target == ignore_index, 0.0, g)
    # d logp / d x_j = onehot_j - p_j
    dx = tl.where(offs == target, g, 0.0) - g * p
    if WITH_ENTROPY_GRAD:
        # d H / d x_j = -p_j (log p_j + H); p_j = 0 (x_j = -inf) contributes nothing
        h = tl.load(grad_entropy_ptr + pid)
        ent = tl.load(entropy_ptr + pid)
        dx -= h * tl.where(p > 0.0, p * (log_p + ent), 0.0)
    dx = dx * inv_t
    out_ptr = grad_logits_ptr + row * grad_row_stride
    # a row that does not exist (bad row index) writes nothing: its logp is NaN and it has no gradient
    # (a valid row's store mask is offs < V, as before)
    tl.store(out_ptr + offs, dx.to(grad_logits_ptr.dtype.element_ty), mask=offs < tl.where(row_ok, V, 0))


def row_layout(logits: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """(tensor, stride_outer, stride_inner, inner_size) addressing the rows of [..., V] logits.

    Up to two leading dims are addressed through their strides (no copy). More leading dims are
    viewed as two when their strides allow it, else copied (documented in docs/selected_logp.md).
    """
    if logits.dim() == 1:
        return logits, 0, 0, 1
    if logits.dim() == 2:
        return logits, logits.stride(0), 0, 1
    if logits.dim() > 3:
        try:
            logits = logits.view(-1, logits.shape[-2], logits.shape[-1])
        except RuntimeError:
            logits = logits.reshape(-1, logits.shape[-2], logits.shape[-1])
    return logits, logits.stride(0), logits.stride(1), max(logits.shape[1], 1)


def _config(kernel: str, logits: torch.Tensor) -> configs.LaunchConfig:
    return configs.lookup(kernel, arch_of(logits.device), logits.dtype, logits.shape[-1])


def _temperature_args(temperature: float, temperature_rows: Optional[torch.Tensor], like):
    if temperature_rows is None:
        return like, float(temperature), False  # any pointer: not read
    return temperature_rows, 1.0, True


# The merge kernel's rows per program: row by row, so it never changes a row's bits.
MERGE_ROWS = 32


def chunk_count(V: int, chunk_v: int) -> int:
    """Vocab chunks of a row: a function of V and the locked chunk width only (one for V = 0)."""
    return max(cdiv(V, chunk_v), 1)


def total_rows(logits: torch.Tensor) -> int:
    """The rows of [..., V] logits (row numbers of row_index lie in [0, total_rows))."""
    return math.prod(logits.shape[:-1])


def dense_index(ids: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The kernels read index tensors densely: a strided view is copied (in its dtype), a dense one
    passes unchanged."""
    return ids if ids is None or ids.is_contiguous() else ids.contiguous()


def launch_forward(logits, target_ids, row_index, temperature, temperature_rows,
                   ignore_index, with_entropy):
    """Runs the forward kernels. target_ids / row_index / temperature_rows are 1-D over scored rows.
    A row index outside the logits' rows gives NaN logp and entropy (no read outside the logits)."""
    target_ids, row_index, temperature_rows = (dense_index(t) for t in (target_ids, row_index, temperature_rows))
    n = target_ids.numel()
    dev = logits.device
    logp = torch.empty(n, dtype=torch.float32, device=dev)
    entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=dev)
    row_max = torch.empty(n, dtype=torch.float32, device=dev)
    row_logsum = torch.empty(n, dtype=torch.float32, device=dev)
    if n == 0:
        return logp, entropy, row_max, row_logsum
    rows = total_rows(logits)
    if rows == 0:  # scored rows of no logits (row_index, unvalidated): nothing exists to clamp to
        for out in (logp, entropy, row_max, row_logsum):
            out.fill_(float("nan"))
        return logp, entropy, row_max, row_logsum
    lg, so, si, inner = row_layout(logits)
    t_ptr, t_val, per_row = _temperature_args(temperature, temperature_rows, logp)
    key = (logits.shape[-1], so, si, inner, logits.dtype, dev, row_index is not None, per_row, with_entropy)
    plan = planned(_FORWARD_PLANS, key, _ForwardPlan, logits, key)
    # chunk states (m, s, t): t only with entropy; FINISH writes none (any pointer: not read)
    states = logp if plan.finish else torch.empty((3 if with_entropy else 2, n, plan.n_chunks), dtype=torch.float32,
                                                  device=dev)
    values = (lg, target_ids, row_index if row_index is not None else target_ids, t_ptr, t_val,
              logp, entropy if with_entropy else logp, row_max, row_logsum, states, ignore_index, n, rows)
    plan.chunks((n, plan.n_chunks), *values)
    if not plan.finish:
        plan.merge((cdiv(n, MERGE_ROWS),), *values)
    return logp, entropy, row_max, row_logsum


_FORWARD_PLANS = configs.plan_store()  # launch_forward's _ForwardPlan per key (launch.planned)


class _ForwardPlan:
    """launch_forward's decision for one key (V, the logits' row layout, dtype, device and flags): the
    chunk count and the Templates of the chunk kernel and the merge kernel. SLOTs: the tensors, the
    temperature, ignore_index, the scored rows and the logits' rows."""

    def __init__(self, logits, key):
        V, so, si, inner, _, _, has_row_index, per_row, with_entropy = key
        cfg = _config("selected_logp_fwd", logits)
        split = _config("selected_logp_chunk", logits)
        if split.block_v % cfg.block_v:
            raise AssertionError(f"locked chunk {split.block_v} is not a multiple of the tile {cfg.block_v}")
        self.n_chunks = chunk_count(V, split.block_v)
        self.finish = self.n_chunks == 1  # one chunk: its state is the row's (merging it into the empty state is exact)
        args = (SLOT, so, si, inner, SLOT, SLOT, SLOT, SLOT, SLOT, SLOT, SLOT, SLOT, SLOT, V, SLOT, SLOT, self.n_chunks,
                SLOT)
        flags = dict(HAS_ROW_INDEX=has_row_index, PER_ROW_TEMPERATURE=per_row, WITH_ENTROPY=with_entropy)
        self.chunks = Template(_fwd_kernel, args, flags | dict(
            FINISH=self.finish, BLOCK_V=cfg.block_v, CHUNK_V=split.block_v, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages))
        self.merge = Template(_fwd_merge_kernel, args, flags | dict(
            BLOCK_ROWS=MERGE_ROWS, CHUNKS=next_power_of_2(self.n_chunks), num_warps=split.num_warps))


def launch_backward(grad_logp, grad_entropy, logits, target_ids, row_index, temperature,
                    temperature_rows, ignore_index, row_max, row_logsum, entropy):
    """Returns d logits, contiguous, in the logits' dtype and shape (zero rows where not scored)."""
    target_ids, row_index, temperature_rows = (dense_index(t) for t in (target_ids, row_index, temperature_rows))
    V = logits.shape[-1]
    n = target_ids.numel()
    alloc = torch.zeros if row_index is not None else torch.empty
    grad = alloc(logits.shape, dtype=logits.dtype, device=logits.device)
    rows = total_rows(logits)
    if n == 0 or V == 0 or rows == 0:
        return grad
    cfg = _config("selected_logp_bwd", logits)
    lg, so, si, inner = row_layout(logits)
    t_ptr, t_val, per_row = _temperature_args(temperature, temperature_rows, row_max)
    with_h = grad_entropy is not None
    _bwd_kernel[(n, cdiv(V, cfg.block_v))](
        lg, so, si, inner,
        target_ids, row_index if row_index is not None else target_ids, t_ptr, t_val,
        row_max, row_logsum, entropy if with_h else row_max,
        grad_logp, grad_entropy if with_h else grad_logp, grad, V,
        V, ignore_index, rows,
        HAS_ROW_INDEX=row_index is not None, PER_ROW_TEMPERATURE=per_row, WITH_ENTROPY_GRAD=with_h,
        BLOCK_V=cfg.block_v, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return grad


# ---- torch.library custom ops: usable under torch.compile, autograd through register_autograd ----

@torch.library.custom_op("rlk_triton::selected_logp_fwd", mutates_args=())
def selected_logp_fwd(
    logits: torch.Tensor, target_ids: torch.Tensor, row_index: Optional[torch.Tensor],
    temperature: float, temperature_rows: Optional[torch.Tensor], ignore_index: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_forward(logits, target_ids, row_index, temperature, temperature_rows,
                          ignore_index, with_entropy)


@selected_logp_fwd.register_fake
def _(logits, target_ids, row_index, temperature, temperature_rows, ignore_index, with_entropy):
    n = target_ids.numel()
    f = lambda k: logits.new_empty(k, dtype=torch.float32)  # noqa: E731
    return f(n), f(n if with_entropy else 0), f(n), f(n)


@torch.library.custom_op("rlk_triton::selected_logp_bwd", mutates_args=())
def selected_logp_bwd(
    grad_logp: torch.Tensor, grad_entropy: Optional[torch.Tensor], logits: torch.Tensor,
    target_ids: torch.Tensor, row_index: Optional[torch.Tensor], temperature: float,
    temperature_rows: Optional[torch.Tensor], ignore_index: int, row_max: torch.Tensor,
    row_logsum: torch.Tensor, entropy: torch.Tensor,
) -> torch.Tensor:
    return launch_backward(grad_logp, grad_entropy, logits, target_ids, row_index, temperature,
                           temperature_rows, ignore_index, row_max, row_logsum, entropy)


@selected_logp_bwd.register_fake
def _(grad_logp, grad_entropy, logits, *rest):
    return torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)


def _setup_context(ctx, inputs, output):
    logits, target_ids, row_index, temperature, temperature_rows, ignore_index, with_entropy = inputs
    _, entropy, row_max, row_logsum = output
    ctx.save_for_backward(logits, target_ids, row_index, temperature_rows, row_max, row_logsum, entropy)
    ctx.temperature = temperature
    ctx.ignore_index = ignore_index
    # unused outputs arrive as None, not as zeros: no fills for the row statistics, and an entropy that
    # was returned but not differentiated (logged, detached) leaves the kernel's entropy term off
    ctx.set_materialize_grads(False)


def _backward_args(ctx, grad_logp, grad_entropy) -> tuple:
    """The backward launcher's arguments from the saved tensors and the incoming gradients."""
    logits, target_ids, row_index, temperature_rows, row_max, row_logsum, entropy = ctx.saved_tensors
    if grad_logp is None:
        grad_logp = torch.zeros_like(row_max)
    if grad_entropy is not None and grad_entropy.numel() == 0:
        grad_entropy = None
    return (grad_logp.contiguous(), None if grad_entropy is None else grad_entropy.contiguous(), logits,
            target_ids, row_index, ctx.temperature, temperature_rows, ctx.ignore_index, row_max, row_logsum, entropy)


def _backward(ctx, grad_logp, grad_entropy, _grad_max, _grad_logsum):
    grad = call_selected_logp_bwd(*_backward_args(ctx, grad_logp, grad_entropy))
    return grad, None, None, None, None, None, None


call_selected_logp_fwd = autograd_op(selected_logp_fwd, _backward, _setup_context)
call_selected_logp_bwd = direct(selected_logp_bwd)


# ---- the admitted native kernels (backend="cuda_native"; docs/native.md) ----

def _native_backward(ctx, grad_logp, grad_entropy, _grad_max, _grad_logsum):
    """_backward through the native backward kernel (the Triton kernel's arithmetic, gated with it)."""
    return (native.selected_logp_bwd(*_backward_args(ctx, grad_logp, grad_entropy)),
            None, None, None, None, None, None, None)


class _NativeForward(torch.autograd.Function):
    """The native forward and backward, with the custom op's setup_context on the same saved tensors."""

    @staticmethod
    def forward(ctx, logits, target_ids, row_index, temperature, temperature_rows, ignore_index, with_entropy,
                layout):
        out = native.selected_logp_fwd(logits, target_ids, row_index, temperature, temperature_rows, ignore_index,
                                       with_entropy, layout=layout)
        _setup_context(ctx, (logits, target_ids, row_index, temperature, temperature_rows, ignore_index,
                             with_entropy), out)
        ctx.mark_non_differentiable(*out[2:])
        return out

    backward = staticmethod(_native_backward)


def native_forward(logits2d, target_ids, temperature, temperature_rows, ignore_index, with_entropy, layout,
                   row_index=None):
    """(logp, entropy, row_max, row_logsum) through the native kernels: the caller has checked the
    admission and the layout (native._slp_config's, passed on: rlk_triton.logp._native_selected_logp).
    row_index: the scored rows (the indexed variant), or None."""
    if wants_grad((logits2d,)):
        return _NativeForward.apply(logits2d, target_ids, row_index, temperature, temperature_rows, ignore_index,
                                    with_entropy, layout)
    # a rollout: no graph to record, so not the autograd.Function's host time either
    return native.selected_logp_fwd(logits2d, target_ids, row_index, temperature, temperature_rows, ignore_index,
                                    with_entropy, layout=layout)
