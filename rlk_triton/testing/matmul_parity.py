"""The batch-invariant matmul against float64, judged by contracts/matmul.yaml.

Error model: an output element is an fp32 sum of K exact products (bf16 / fp16 products are exact in
fp32), rounded once to the output dtype, so
  forward   |ours - ref| <= atol + rtol * S,  S = sum_k |a_ik b_kj| + |bias_j|  (scaled_abs; |ref| <= S,
            so rtol holds the output rounding u_dtype plus the accumulation's relative error)
  gradients rounding_plus_sensitivity with sensitivity |dC| @ |B|^T (d a), |A|^T @ |dC| (d b),
            sum_i |dC_ij| (d bias): the same sums for the backward products.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import contracts
from .._runtime import arch_of
from .invariance import RowOp


@dataclass(frozen=True)
class MatmulCase:
    M: int
    N: int
    K: int
    dtype: torch.dtype
    bias: bool = True
    scale: float = 1.0
    seed: int = 0

    def label(self) -> str:
        return f"M={self.M} N={self.N} K={self.K} {contracts.dtype_name(self.dtype)} bias={self.bias} scale={self.scale}"


def build_matmul_case(case: MatmulCase, device):
    gen = torch.Generator().manual_seed(case.seed)
    a = (torch.randn(case.M, case.K, generator=gen) * case.scale).to(device, case.dtype)
    b = (torch.randn(case.K, case.N, generator=gen) / max(case.K, 1) ** 0.5).to(device, case.dtype)
    bias = (torch.randn(case.N, generator=gen) * 0.1).to(device, case.dtype) if case.bias else None
    g = torch.randn(case.M, case.N, generator=gen).to(device, case.dtype)
    return a, b, bias, g


def matmul_errors(case: MatmulCase, device) -> dict:
    """{name: (ours, ref64, scale or sensitivity)} for the output and the three gradients."""
    from ..ops.matmul import matmul

    a, b, bias, g = build_matmul_case(case, device)
    la, lb = a.detach().requires_grad_(), b.detach().requires_grad_()
    lbias = bias.detach().requires_grad_() if bias is not None else None
    out = matmul(la, lb, lbias)
    out.backward(g)
    A, B, G = (x.double().cpu().numpy() for x in (a, b, g))
    bias64 = bias.double().cpu().numpy() if bias is not None else 0.0
    res = {"out": (out.detach().double().cpu().numpy(), A @ B + bias64, np.abs(A) @ np.abs(B) + np.abs(bias64)),
           "d_a": (la.grad.double().cpu().numpy(), G @ B.T, np.abs(G) @ np.abs(B).T),
           "d_b": (lb.grad.double().cpu().numpy(), A.T @ G, np.abs(A).T @ np.abs(G))}
    if bias is not None:
        res["d_bias"] = (lbias.grad.double().cpu().numpy(), G.sum(0), np.abs(G).sum(0))
    return res


def judge_matmul(case: MatmulCase, device, backend="triton") -> dict:
    if backend != "triton":
        raise ValueError(f"matmul has no backend {backend!r}")
    arch = arch_of(torch.device(device))
    fwd = contracts.judgment("matmul", case.dtype, "forward_accuracy", arch)["outputs"]["out"]
    bound = contracts.judgment("matmul", case.dtype, "gradient_accuracy", arch)
    ratios = {}
    for name, (ours, ref, scale) in matmul_errors(case, device).items():
        if name == "out":
            ratios[name] = contracts.scaled_abs_ratio(ours, ref, scale, fwd)
        else:
            ratios[name] = contracts.rounding_plus_sensitivity_ratio(ours, ref, scale, bound)
    return ratios


def matmul_row_op(N, K, dtype, device, bias=True) -> RowOp:
    """a @ b + bias as a RowOp over the rows of a; b and bias are shared."""
    from ..ops.matmul import matmul

    gen0 = torch.Generator().manual_seed(99)
    b = (torch.randn(K, N, generator=gen0) / K ** 0.5).to(device, dtype)
    bi = (torch.randn(N, generator=gen0) * 0.1).to(device, dtype) if bias else None

    def make_rows(n, gen):
        return (torch.randn(n, K, generator=gen).to(device, dtype),)

    return RowOp(f"matmul[N={N},K={K},{contracts.dtype_name(dtype)}]", lambda a: (matmul(a, b, bi),),
                 make_rows, grad_inputs=(0,))


def matmul_harness():
    """How `rlk-triton check` checks the matmul's claims (rlk_triton/operators.py)."""
    from .harness import Harness

    def cases(on_gpu):
        shapes = [(256, 4096, 4096), (77, 1000, 3000)] if on_gpu else [(37, 70, 50), (5, 64, 96)]
        return [MatmulCase(m, n, k, dt, bias=i % 2 == 0, seed=m + i)
                for m, n, k in shapes for i, dt in enumerate((torch.bfloat16, torch.float16, torch.float32))]

    def row_ops(device, on_gpu):
        n, k = (4096, 4096) if on_gpu else (70, 50)
        return [matmul_row_op(n, k, dt, device) for dt in (torch.bfloat16, torch.float32)]

    def probe(backend, device):
        r = judge_matmul(MatmulCase(9, 20, 33, torch.float32, seed=1), device, backend)
        if max(r.values()) > 1.0:
            raise AssertionError(f"probe result outside the contract: error / bound {r}")

    return Harness("matmul", cases, judge_matmul, row_ops, probe)
