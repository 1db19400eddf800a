"""Batch-invariant matmul: out = A @ B (+ C_in), fp32 accumulation, no split-K.

The reduction order of every tl.dot kernel in rlk_triton (this one and linear_logp's fused ones) is
`dot_tile`'s: an output tile [BLOCK_M, BLOCK_N] starts at fp32 zero and adds
tl.dot(A[:, k:k+BLOCK_K], B[k:k+BLOCK_K, :]) for k = 0, BLOCK_K, 2 BLOCK_K, ... in ascending order;
the order inside one tl.dot is the tensor-core instruction's, fixed for a (dtype, tiles, arch).
With ACCUMULATE, C_in is added once, after the K loop: out = C_in + dot, which lets a caller chain
K ranges (linear_logp's vocab chunks) in a fixed order.

Tiles come from configs.lookup_matmul (kernel, arch, dtype): never from M, so a row of the output is
the same instructions on the same operands whatever the number of rows; the grid order (GROUP_M
swizzle for L2 reuse) decides only when a tile runs, not what it computes.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import configs
from .._runtime import arch_of, interpreter_active

# Under the interpreter tl.dot on bf16 operands is wrong; upcasting them to fp32 first is exact
# (a bf16 x bf16 product fits in fp32).
_UPCAST_BF16_DOT = interpreter_active()


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
        if IEEE:  # fp32 operands: IEEE fp32 products, never TF32
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
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


@triton.jit
def _matmul_kernel(
    a_ptr, stride_am, stride_ak, b_ptr, stride_bk, stride_bn,
    c_in_ptr, stride_cm, stride_cn, out_ptr, stride_om, stride_on,
    M, N, K,
    ACCUMULATE: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = dot_tile(a_ptr, stride_am, stride_ak, b_ptr, stride_bk, stride_bn, om % M, on % N, K,
                   BLOCK_K, EVEN_K, UPCAST, IEEE)
    mask = (om < M)[:, None] & (on < N)[None, :]
    om64 = om.to(tl.int64)[:, None]
    on64 = on.to(tl.int64)[None, :]
    if ACCUMULATE:
        acc = tl.load(c_in_ptr + om64 * stride_cm + on64 * stride_cn, mask=mask, other=0.0) + acc
    tl.store(out_ptr + om64 * stride_om + on64 * stride_on, acc.to(out_ptr.dtype.element_ty), mask=mask)


def operand_flags(dtype: torch.dtype) -> tuple[bool, bool]:
    """(UPCAST, IEEE) for tl.dot on operands of dtype."""
    return (_UPCAST_BF16_DOT and dtype == torch.bfloat16), dtype == torch.float32


def matmul_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, c_in: Optional[torch.Tensor] = None,
                cfg: Optional[configs.MatmulConfig] = None) -> torch.Tensor:
    """out = a @ b (+ c_in), written into `out` (any strides; may be c_in itself).

    a [M, K] and b [K, N] of one dtype, any strides; out [M, N] of any float dtype; c_in [M, N].
    """
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return out
    if K == 0:  # an empty sum: zero, plus c_in
        out.copy_(c_in if c_in is not None else torch.zeros_like(out))
        return out
    cfg = cfg or configs.lookup_matmul("matmul", arch_of(a.device), a.dtype)
    upcast, ieee = operand_flags(a.dtype)
    c = c_in if c_in is not None else out
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
    _matmul_kernel[grid](
        a, a.stride(0), a.stride(1), b, b.stride(0), b.stride(1),
        c, c.stride(0), c.stride(1), out, out.stride(0), out.stride(1),
        M, N, K,
        ACCUMULATE=c_in is not None, UPCAST=upcast, IEEE=ieee, EVEN_K=K % cfg.block_k == 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
