"""Batch-invariant matmul: out = A @ B (+ C_in), fp32 accumulation, no split-K.

The reduction order of every tl.dot kernel in rlk_triton (this one and linear_logp's fused ones) is
`dot_tile`'s: an output tile [BLOCK_M, BLOCK_N] starts at fp32 zero and adds
tl.dot(A[:, k:k+BLOCK_K], B[k:k+BLOCK_K, :]) for k = 0, BLOCK_K, 2 BLOCK_K, ... in ascending order;
the order inside one tl.dot is the tensor-core instruction's, fixed for a (dtype, tiles, arch).
With ACCUMULATE, C_in is added once, after the K loop: out = C_in + dot, which lets a caller chain
K ranges (linear_logp's vocab chunks) in a fixed order. FOLD_K does that chain inside one launch:
the K ranges [0, FOLD_K), [FOLD_K, 2 FOLD_K), ... each take dot_tile's order from zero and are added
to the running fp32 total in increasing order, (((C_in + dot_0) + dot_1) + ...), the bits of one
launch per range with C_in = the previous launch's fp32 output, without writing and reading that
total between ranges. A fold with no C_in launches its first range alone and folds the rest onto it
(matmul_into): the same bits, and the kernel always has a C_in to start from.

Tiles come from configs.lookup_matmul (kernel, arch, dtype, bucket of M). The buckets of one
(arch, dtype) form a bit class (configs.BIT_CLASSES): every member keeps the reduction order above
with one BLOCK_K-independent sequence of k16 MMA steps per element (the accumulator is updated in
place), and changes only tiles, warps, stages and scheduling, so a row is the same bits at M = 1 and
inside M = 4096; tests/test_config_classes.py proves it per build on the GPU. The grid order (GROUP_M
swizzle for L2 reuse) decides only when a tile runs, not what it computes.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import configs
from .._runtime import arch_of, interpreter_active, shaped
from ..errors import DeviceError, DTypeError, ShapeError
from .dispatch import autograd_op, direct
from .launch import SLOT, DescriptorSlot, Template, cached, cdiv, planned

# Under the interpreter tl.dot on bf16 operands is wrong; upcasting them to fp32 first is exact
# (a bf16 x bf16 product fits in fp32).
_UPCAST_BF16_DOT = interpreter_active()

# Under the interpreter tl.dot is one np.matmul over the whole tile, and the BLAS behind it gives a
# row bits that depend on its position in the tile (OpenBLAS on an AMD EPYC: 10 of 15 positions of a
# 16 x 32 x 32 fp32 tile). `mma` takes a per-element sum instead there. A global constexpr: compiled
# kernels see False and compile to exactly the tl.dot they had (scripts/aot_compile_check.py --baseline).
INTERPRETED_DOT = tl.constexpr(interpreter_active())


@triton.jit
def _row_exact_dot(a, b):
    """Interpreter only: a @ b as fp32 products summed over k by np.sum along one axis. The operands
    are first made C-ordered (a reshape through 1-D copies a strided view, e.g. a transposed tile):
    np.sum's order along an axis follows the product's memory layout, so without it a tile read
    transposed (a descriptor's B^T) would sum in another order than the same tile read row-major."""
    a = tl.reshape(tl.reshape(a.to(tl.float32), (a.shape[0] * a.shape[1],)), (a.shape[0], a.shape[1]))
    b = tl.reshape(tl.reshape(b.to(tl.float32), (b.shape[0] * b.shape[1],)), (b.shape[0], b.shape[1]))
    return tl.sum(a[:, :, None] * b[None, :, :], axis=1)


@triton.jit
def mma(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b in fp32: every tl.dot of the library goes through here (matmul, linear_logp,
    attention). IEEE: fp32 operands use IEEE fp32 products, never TF32.

    Interpreter: each output element is acc + sum_k a[m, k] b[k, n], the products formed in fp32
    (exact for bf16 / fp16 operands) and summed over k in one order for every element and every
    operand layout (_row_exact_dot), so a row's bits depend on its own operands only, never on its
    position in the tile or its neighbours. The GPU's tensor-core order differs: the interpreter proves invariance
    of the library's structure (tiles, K steps, masks), the GPU proves it of the instructions."""
    if INTERPRETED_DOT:
        acc = acc + _row_exact_dot(a, b)
    elif IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def mma_new(a, b, IEEE: tl.constexpr):
    """a @ b in fp32 with no accumulator in (attention's scores): mma's arithmetic, the GPU's
    tl.dot without an acc operand."""
    if INTERPRETED_DOT:
        s = _row_exact_dot(a, b)
    elif IEEE:
        s = tl.dot(a, b, input_precision="ieee")
    else:
        s = tl.dot(a, b)
    return s


@triton.jit
def dot_tile(a_ptr, stride_am, stride_ak, b_ptr, stride_bk, stride_bn, rm, rn, K,
             BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """sum_k A[rm, k] B[k, rn] in fp32 over ascending K steps. rm / rn must be in range (callers wrap
    them modulo M / N and mask the store)."""
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((rm.shape[0], rn.shape[0]), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = rk < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = mma(a, b, acc, IEEE)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def dot_tile_desc(a_desc, b_desc, m0, n0, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  B_T: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, k_lo=0, A_T: tl.constexpr = False):
    """dot_tile through TMA descriptors: a_desc over A [M, K] (blocks [BLOCK_M, BLOCK_K]) or, with A_T,
    over A^T [K, M] (blocks [BLOCK_K, BLOCK_M]); b_desc over B [K, N] (blocks [BLOCK_K, BLOCK_N]) or,
    with B_T, over B^T [N, K] (blocks [BLOCK_N, BLOCK_K]).
    The same ascending K steps and tl.dot as dot_tile, so the same bits on every in-range element.
    Out-of-range rows, columns and the K tail load as zeros (dot_tile wraps rows / columns instead:
    those outputs are masked by every caller; a zero K tail is what dot_tile's mask loads too).
    k_lo: sum over k in [k_lo, K) only (a multiple of BLOCK_K; FOLD_K's ranges)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K - k_lo, BLOCK_K)):
        if A_T:
            a = a_desc.load([k_lo + k * BLOCK_K, m0]).T
        else:
            a = a_desc.load([m0, k_lo + k * BLOCK_K])
        if B_T:
            b = b_desc.load([n0, k_lo + k * BLOCK_K]).T
        else:
            b = b_desc.load([k_lo + k * BLOCK_K, n0])
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = mma(a, b, acc, IEEE)
    return acc


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program pid, in groups of GROUP_M row tiles (L2 reuse of the B tiles)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    return pid_m, pid_n


@cached
@triton.jit
def _matmul_kernel(
    a_ptr, stride_am, stride_ak, b_ptr, stride_bk, stride_bn,
    c_in_ptr, stride_cm, stride_cn, out_ptr, stride_om, stride_on, bias_ptr,
    M, N, K,
    ACCUMULATE: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, FOLD_K: tl.constexpr = 0,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (om < M)[:, None] & (on < N)[None, :]
    om64 = om.to(tl.int64)[:, None]
    on64 = on.to(tl.int64)[None, :]
    k_first = K
    if FOLD_K:  # the chain of K ranges (module doc): the first range, C_in, then the others in order
        k_first = tl.minimum(K, FOLD_K)
    acc = dot_tile(a_ptr, stride_am, stride_ak, b_ptr, stride_bk, stride_bn, om % M, on % N, k_first,
                   BLOCK_K, EVEN_K, UPCAST, IEEE)
    if ACCUMULATE:
        acc = tl.load(c_in_ptr + om64 * stride_cm + on64 * stride_cn, mask=mask, other=0.0) + acc
    if FOLD_K:
        for k0 in range(FOLD_K, K, FOLD_K):
            acc = acc + dot_tile(a_ptr + k0 * stride_ak, stride_am, stride_ak, b_ptr + k0 * stride_bk, stride_bk,
                                 stride_bn, om % M, on % N, tl.minimum(K - k0, FOLD_K), BLOCK_K, EVEN_K, UPCAST, IEEE)
    if HAS_BIAS:  # added in fp32 before the one rounding to the output dtype
        acc += tl.load(bias_ptr + on % N).to(tl.float32)[None, :]
    tl.store(out_ptr + om64 * stride_om + on64 * stride_on, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_tile(acc, c_in_ptr, stride_cm, out_ptr, stride_om, bias_ptr, m0, n0, M, N,
                ACCUMULATE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """_matmul_kernel's epilogue for a [BLOCK_M, BLOCK_N] piece at (m0, n0): out = C_in + acc (+ bias)."""
    om = m0 + tl.arange(0, BLOCK_M)
    on = n0 + tl.arange(0, BLOCK_N)
    mask = (om < M)[:, None] & (on < N)[None, :]
    om64 = om.to(tl.int64)[:, None]
    if ACCUMULATE:
        acc = tl.load(c_in_ptr + om64 * stride_cm + on[None, :], mask=mask, other=0.0) + acc
    if HAS_BIAS:
        acc += tl.load(bias_ptr + on % N).to(tl.float32)[None, :]
    tl.store(out_ptr + om64 * stride_om + on[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def column_quarters(x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """x [BLOCK_M, BLOCK_N] as its four [BLOCK_M, BLOCK_N / 4] column quarters, left to right.

    Epilogues run on quarters: a 128 x 256 fp32 tile with its elementwise temporaries overflows a
    thread's 255 registers (ptxas spill stores per thread, whole tile or halves -> quarters: d logits
    7112 -> 468 B, d hidden 1876 -> 28 B, matmul 308 -> 0 B, compiled without the JIT's
    specialization; with it, quarters: 44 / 0 / 0 B; scripts/aot_compile_check.py). The
    pieces are the same elements, so an elementwise epilogue gives the same bits."""
    left, right = tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
    q0, q1 = tl.split(tl.permute(tl.reshape(left, (BLOCK_M, 2, BLOCK_N // 4)), (0, 2, 1)))
    q2, q3 = tl.split(tl.permute(tl.reshape(right, (BLOCK_M, 2, BLOCK_N // 4)), (0, 2, 1)))
    return q0, q1, q2, q3


@triton.jit
def _store_quarters(acc, c_in_ptr, stride_cm, out_ptr, stride_om, bias_ptr, m0, n0, M, N,
                    ADD_C_IN: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """_store_tile on acc's column quarters, left to right (column_quarters)."""
    Q: tl.constexpr = BLOCK_N // 4
    q0, q1, q2, q3 = column_quarters(acc, BLOCK_M, BLOCK_N)
    _store_tile(q0, c_in_ptr, stride_cm, out_ptr, stride_om, bias_ptr, m0, n0, M, N, ADD_C_IN, HAS_BIAS, BLOCK_M, Q)
    _store_tile(q1, c_in_ptr, stride_cm, out_ptr, stride_om, bias_ptr, m0, n0 + Q, M, N, ADD_C_IN, HAS_BIAS, BLOCK_M, Q)
    _store_tile(q2, c_in_ptr, stride_cm, out_ptr, stride_om, bias_ptr, m0, n0 + 2 * Q, M, N, ADD_C_IN, HAS_BIAS,
                BLOCK_M, Q)
    _store_tile(q3, c_in_ptr, stride_cm, out_ptr, stride_om, bias_ptr, m0, n0 + 3 * Q, M, N, ADD_C_IN, HAS_BIAS,
                BLOCK_M, Q)


@cached
@triton.jit
def _matmul_desc_kernel(
    a_desc, b_desc, c_in_ptr, stride_cm, out_ptr, stride_om, bias_ptr, M, N, K, n_progs,
    ACCUMULATE: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    B_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FOLD_K: tl.constexpr = 0, A_T: tl.constexpr = False,
):
    # B_T: b_desc is over B^T [N, K] (a linear layer's weight), A_T: a_desc over A^T [K, M] (linear_logp's
    # d weight = d_logits^T @ hidden), as in dot_tile_desc.
    # _matmul_kernel's tiles, grid order and K order, run by n_progs persistent programs (flattened:
    # the next tile's loads overlap this tile's epilogue). The epilogue goes by column quarters
    # (column_quarters): the same bits, fewer live registers and less shared memory for its layout
    # change than the whole tile.
    for item in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), n_progs, flatten=True):
        pid_m, pid_n = grouped_tile(item, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        if FOLD_K:  # the chain of K ranges in registers (module doc); C_in enters after the first range
            # always with a C_in: folding from none spilled 3 KB a thread on sm90 (matmul_into splits it)
            tl.static_assert(ACCUMULATE, "FOLD_K needs a C_in")
            acc = dot_tile_desc(a_desc, b_desc, m0, n0, tl.minimum(K, FOLD_K), BLOCK_M, BLOCK_N, BLOCK_K, B_T,
                                UPCAST, IEEE, 0, A_T)
            om = m0 + tl.arange(0, BLOCK_M)
            on = n0 + tl.arange(0, BLOCK_N)
            acc = tl.load(c_in_ptr + om.to(tl.int64)[:, None] * stride_cm + on[None, :],
                          mask=(om < M)[:, None] & (on < N)[None, :], other=0.0) + acc
            for k0 in range(FOLD_K, K, FOLD_K):
                acc = acc + dot_tile_desc(a_desc, b_desc, m0, n0, tl.minimum(K, k0 + FOLD_K), BLOCK_M, BLOCK_N,
                                          BLOCK_K, B_T, UPCAST, IEEE, k0, A_T)
        else:
            acc = dot_tile_desc(a_desc, b_desc, m0, n0, K, BLOCK_M, BLOCK_N, BLOCK_K, B_T, UPCAST, IEEE, 0, A_T)
        ADD_C_IN: tl.constexpr = ACCUMULATE and not FOLD_K
        _store_quarters(acc, c_in_ptr, stride_cm, out_ptr, stride_om, bias_ptr, m0, n0, M, N, ADD_C_IN, HAS_BIAS,
                        BLOCK_M, BLOCK_N)


_SM_COUNT: dict = {}


def persistent_programs(device: torch.device, n_items: int) -> int:
    """Programs of a persistent launch: one per SM (the interpreter: 3, so tests cover the striding).
    Only when a tile runs depends on it, never what it computes."""
    if device.type != "cuda":
        return max(1, min(n_items, 3))
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return max(1, min(n_items, _SM_COUNT[index]))


_TMA_DTYPES = (torch.bfloat16, torch.float16)


def tma_layout(t: torch.Tensor) -> bool:
    """What TMA descriptors need of an operand's layout here: 2 bytes an element, two dims, a unit last
    stride, 16-byte aligned rows that do not overlap (a broadcast operand, row stride 0, takes the
    pointer loads). The base address must be 16-byte aligned too (tma_ready)."""
    if t.dtype not in _TMA_DTYPES or t.dim() != 2:
        return False
    row, col = t.stride()
    return col == 1 and row >= max(1, t.shape[1]) and (row * 2) % 16 == 0  # 2-byte elements


def tma_ready(*tensors: torch.Tensor) -> bool:
    """TMA descriptors can read these operands: tma_layout, and 16-byte aligned bases."""
    for t in tensors:  # a loop, not all(generator): on every decode matmul's host path
        if not tma_layout(t) or t.data_ptr() % 16:
            return False
    return True


def operand_flags(dtype: torch.dtype) -> tuple[bool, bool]:
    """(UPCAST, IEEE) for tl.dot on operands of dtype."""
    return (_UPCAST_BF16_DOT and dtype == torch.bfloat16), dtype == torch.float32


def matmul_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, c_in: Optional[torch.Tensor] = None,
                cfg: Optional[configs.MatmulConfig] = None, bias: Optional[torch.Tensor] = None,
                fold_k: int = 0) -> torch.Tensor:
    """out = a @ b (+ c_in) (+ bias), written into `out` (any strides; may be c_in itself).

    fold_k (a multiple of the config's block_k; 0 = off): the K ranges of fold_k columns are summed
    as separate products chained in fp32 (module doc): the bits of one call per range, each with
    c_in = the previous call's fp32 out (bias is not supported then).

    a [M, K] and b [K, N] of one dtype, any strides; out [M, N] of any float dtype; c_in [M, N];
    bias [N] contiguous. A config with persistent_tma takes the descriptor kernel when the operands
    allow it (tma_ready, unit-stride out / c_in; an `a` or `b` that is a transposed row-major matrix,
    such as weight.t(), is read through a descriptor over that matrix), else the pointer kernel: the
    same bits either way. What to launch is decided once per shape, strides, dtype, device and flags
    (_Plan).
    """
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return out
    if K == 0:  # an empty sum: zero, plus c_in, plus bias
        base = c_in.float() if c_in is not None else torch.zeros(out.shape, device=out.device)
        out.copy_(base + bias.float() if bias is not None else base)
        return out
    if fold_k:
        cfg = cfg or configs.lookup_matmul("matmul", arch_of(a.device), a.dtype, rows=M, cols=N)
        if fold_k % cfg.block_k or bias is not None:
            raise ValueError(f"fold_k {fold_k} needs a multiple of block_k {cfg.block_k} and no bias")
        fold_k = fold_k if fold_k < K else 0  # one range: the plain kernel
        if fold_k and c_in is None:
            # The first range as its own call, the rest chained onto it: the fold's bits by its definition
            # (and fp32 addition commutes). One launch folding from no C_in spills 3 KB a thread on sm90
            # (255 registers; with C_in, 176 B): 0.85 ms against 0.38 for a pass with C_in on the H100.
            first = out if out.dtype == torch.float32 else torch.empty(out.shape, dtype=torch.float32,
                                                                       device=out.device)
            matmul_into(a[:, :fold_k], b[:fold_k], first, cfg=cfg)
            return matmul_into(a[:, fold_k:], b[fold_k:], out, c_in=first, cfg=cfg, fold_k=fold_k)
    c = c_in if c_in is not None else out
    key = (cfg, fold_k, c_in is None, bias is None, a.device, a.dtype, a.shape, a.stride(), b.shape, b.stride(),
           out.stride(), c.stride())
    plan = planned(_PLANS, key, _Plan, a, b, out, c, c_in is not None, bias is not None, cfg, fold_k)
    plan(a, b, out, c, bias if bias is not None else out)
    return out


_PLANS = configs.plan_store()  # matmul_into's _Plan per key (launch.planned)


class _Plan:
    """matmul_into's decision for one key (its operands' shapes and strides, a's dtype and device, the
    config, fold_k, and whether c_in and bias are given): the config, the kernel, its grid and its
    arguments, as launch templates with the tensors as SLOTs. A decode step repeats one shape, so it is
    decided once and each call pays for its tensors only (ops.launch.Template). The descriptor kernel
    also needs 16-byte aligned bases, a fact of each call's tensors (tma_ready)."""

    def __init__(self, a, b, out, c, accumulate: bool, has_bias: bool, cfg, fold_k: int):
        M, K = a.shape
        N = b.shape[1]
        cfg = cfg or configs.lookup_matmul("matmul", arch_of(a.device), a.dtype, rows=M, cols=N)
        upcast, ieee = operand_flags(a.dtype)
        a_t = a.stride(0) == 1 and a.stride(1) != 1
        b_t = b.stride(0) == 1 and b.stride(1) != 1
        a_rows = a.t() if a_t else a  # the operands as their descriptors see them: unit last stride
        b_rows = b.t() if b_t else b
        a_block = (cfg.block_k, cfg.block_m) if a_t else (cfg.block_m, cfg.block_k)
        b_block = (cfg.block_n, cfg.block_k) if b_t else (cfg.block_k, cfg.block_n)
        self.tma = None
        self.grid = (cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n),)
        if cfg.persistent_tma and tma_layout(a_rows) and tma_layout(b_rows) and out.stride(1) == 1 \
                and c.stride(1) == 1:
            n_progs = persistent_programs(a.device, self.grid[0])
            self.tma_grid = (n_progs,)
            self.tma = Template(
                _matmul_desc_kernel, (DescriptorSlot(a_block, a_t), DescriptorSlot(b_block, b_t), SLOT, c.stride(0),
                                      SLOT, out.stride(0), SLOT, M, N, K, n_progs),
                dict(ACCUMULATE=accumulate, HAS_BIAS=has_bias, UPCAST=upcast, IEEE=ieee, B_T=b_t,
                     BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                     FOLD_K=fold_k, A_T=a_t, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
        self.pointers = Template(
            _matmul_kernel,
            (SLOT, a.stride(0), a.stride(1), SLOT, b.stride(0), b.stride(1), SLOT, c.stride(0), c.stride(1),
             SLOT, out.stride(0), out.stride(1), SLOT, M, N, K),
            dict(ACCUMULATE=accumulate, HAS_BIAS=has_bias, UPCAST=upcast, IEEE=ieee, EVEN_K=K % cfg.block_k == 0,
                 BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                 FOLD_K=fold_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages))

    def __call__(self, a, b, out, c, bias):
        """bias: the bias, or any tensor when the plan has none (the kernel reads it only with HAS_BIAS)."""
        if self.tma is not None and not (a.data_ptr() % 16 or b.data_ptr() % 16):
            self.tma(self.tma_grid, a, b, c, out, bias)
        else:
            self.pointers(self.grid, a, b, c, out, bias)


# ---- the public op: torch.library custom ops with autograd ----

@torch.library.custom_op("rlk_triton::matmul", mutates_args=())
def _matmul_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    return matmul_into(a, b, out, bias=bias)


@_matmul_op.register_fake
def _(a, b, bias):
    return a.new_empty((a.shape[0], b.shape[1]))


def _matmul_setup(ctx, inputs, output):
    a, b, bias = inputs
    ctx.save_for_backward(a, b)
    ctx.has_bias = bias is not None


def _matmul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad = grad.contiguous()
    # d a = grad @ b^T: row i reads grad row i only (the same kernel: rows batch-invariant).
    da = _matmul_direct(grad, b.t(), None) if ctx.needs_input_grad[0] else None
    # d b = a^T @ grad and d bias = 1^T @ grad: sums over the rows of the batch in ascending
    # block_k steps: deterministic, not batch-invariant.
    db = _matmul_direct(a.t(), grad, None) if ctx.needs_input_grad[1] else None
    dbias = None
    if ctx.has_bias and ctx.needs_input_grad[2]:
        dbias = _matmul_direct(grad.new_ones((1, grad.shape[0])), grad, None).reshape(-1)
    return da, db, dbias


call_matmul = autograd_op(_matmul_op, _matmul_backward, _matmul_setup)
_matmul_direct = direct(_matmul_op)  # the backward's products (differentiable with create_graph)


def matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """a @ b (+ bias) in a's dtype with fp32 accumulation and no split-K; differentiable.

    a [..., K] (leading dims flattened), b [K, N] (any strides: pass weight.t() for a linear
    layer), bias [N]; one dtype (bf16, fp16, fp32; fp32 is IEEE, never TF32), one device.
    Rows of the result and of d a are bitwise independent of the other rows (docs/matmul.md).
    Empty shapes are valid: M = 0 or N = 0 give an empty result, K = 0 the empty sum (zeros, plus
    bias), forward and backward, without a launch.
    """
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype in _DTYPES and b.dtype == a.dtype
            and b.device == a.device and b.dim() == 2 and 1 <= a.dim() and a.shape[-1] == b.shape[0]
            and (bias is None or (isinstance(bias, torch.Tensor) and bias.dtype == a.dtype and bias.device == a.device
                                  and bias.shape == b.shape[1:]))):  # the common case in one pass (host time)
        _check_matmul_args(a, b, bias)
    if a.is_cpu and not interpreter_active():
        raise DeviceError("a", "CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)")
    if a.dim() == 2:
        return call_matmul(a, b, bias.contiguous() if bias is not None else None)
    lead = a.shape[:-1]
    # not reshape(-1, K): with K = 0 (or any empty a) the -1 could be anything
    out = call_matmul(a.reshape(math.prod(lead), a.shape[-1]), b, bias.contiguous() if bias is not None else None)
    return shaped(out, (*lead, b.shape[1]))


_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_matmul_args(a, b, bias) -> None:
    """matmul's argument checks, each with its typed error naming the argument."""
    for name, x in (("a", a), ("b", b)) + ((("bias", bias),) if bias is not None else ()):
        if not isinstance(x, torch.Tensor):
            raise DTypeError(name, f"expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in _DTYPES:
            raise DTypeError(name, f"dtype {x.dtype} is not one of bfloat16, float16, float32")
        if x.dtype != a.dtype:
            raise DTypeError(name, f"dtype {x.dtype} differs from a's {a.dtype}")
        if x.device != a.device:
            raise DeviceError(name, f"on {x.device}, a on {a.device}")
    if a.dim() < 1 or b.dim() != 2:
        raise ShapeError("b" if a.dim() >= 1 else "a", f"need a [..., K] and b [K, N], got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    if a.shape[-1] != b.shape[0]:
        raise ShapeError("b", f"K = {b.shape[0]} does not match a's last dim {a.shape[-1]}")
    if bias is not None and tuple(bias.shape) != (b.shape[1],):
        raise ShapeError("bias", f"shape {tuple(bias.shape)} is not [N] = [{b.shape[1]}]")
