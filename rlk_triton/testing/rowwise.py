"""Parity and invariance for the row-wise layer ops, RMSNorm and SwiGLU, judged by contracts/.

One definition of what is measured, shared by the tests, scripts/measure_rowwise.py and the registry:
`*_measurements` return, per output or gradient, (ours, float64 reference, scale or sensitivity);
`judge_*` turn them into {name: error / contract bound} (<= 1 passes).

Error scales (scaled_abs, forward; elementwise, float64):
  rmsnorm  y         |y_ref|, with y_ref the float64 normalization of the h the op itself returned
                     (x, or its residual stream: the documented downcast point), so the judgment is
                     the kernel's arithmetic plus the one rounding of y
           residual  |x + residual| (one rounding of an fp32 sum)
  swiglu   y         |y_ref| (1 + (1 - s) |g|) + F |g u|: exp(-g) carries a relative error ~ |g| eps,
                     which reaches s = sigmoid(g) scaled by (1 - s); and s falls below fp32's smallest
                     normal for g < -87.3 (exp(-g) overflows for g < -88.7), where a GPU may flush it:
                     F = 2^-126 / 2^-24 = 2^-102 is that floor in units of the fp32 unit roundoff
Gradient sensitivities (rounding_plus_sensitivity: the first-order response to fp32 rounding, in
units of the fp32 unit roundoff), with w' = w + offset, xhat = h rstd, g the upstream gradient:
  rmsnorm  d x       rstd (|g w'| + |xhat| mean_k |g_k w'_k xhat_k|) + |g_residual|
           d weight  sqrt(N) sum_rows |g xhat|   (N sequential adds at most, errors add randomly)
  swiglu   with s = sigmoid(g), T = 1 + g (1 - s), rs = (1 - s)(|g| + 2) + 2 (relative error of s):
           d up      |dy g s| (rs + 2) + F |dy g|
           d gate    |dy u| s (|T| (rs + 3) + |g| (s rs + 2 (1 - s))) + F |dy u| (1 + |g|)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import contracts
from .._runtime import arch_of
from ..errors import BackendError
from .invariance import RowOp

BACKENDS = ("triton",)
SIGMOID_FLUSH = 2.0**-102  # 2^-126 (fp32's smallest normal) in units of the fp32 unit roundoff 2^-24
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_backend(backend):
    if backend not in BACKENDS:
        raise BackendError("backend", f"unknown backend {backend!r} (have: {', '.join(BACKENDS)})")


def _np(t):
    return t.detach().double().cpu().numpy()


def _randn(shape, gen, scale=1.0):
    return torch.randn(shape, generator=gen) * scale


# ---- RMSNorm ----

@dataclass(frozen=True)
class NormCase:
    rows: int
    H: int
    dtype: torch.dtype
    residual: bool = False
    weight_offset: float = 0.0
    scale: float = 1.0  # x ~ N(0, scale^2) with a few outlier channels
    layout: str = "contiguous"  # or "row_stride": rows of a wider buffer
    weight_fp32: bool = False
    eps: float = 1e-6
    seed: int = 0

    def label(self) -> str:
        dt = contracts.dtype_name(self.dtype)
        extra = (" +residual" if self.residual else "") + (" w:fp32" if self.weight_fp32 else "")
        return (f"N={self.rows} H={self.H} {dt}{extra} offset={self.weight_offset} scale={self.scale} "
                f"{self.layout}")


def make_hidden(rows, H, dtype, scale, gen, device):
    """Hidden states: Gaussian, with a few channels 20x larger (the massive activations of LLMs)."""
    x = _randn((rows, H), gen, scale)
    if H > 4:
        hot = torch.randint(0, H, (2,), generator=gen)
        x[:, hot] *= 20.0
    return x.to(device=device, dtype=dtype)


def make_norm_weight(H, dtype, weight_offset, gen, device):
    """Around 1 as trained RMSNorm scales are; stored around 0 when an offset of 1 adds the 1 (Gemma)."""
    w = _randn(H, gen, 0.2) + (1.0 - weight_offset)
    return w.to(device=device, dtype=dtype)


def build_norm_case(case: NormCase, device):
    gen = torch.Generator().manual_seed(case.seed)
    x = make_hidden(case.rows, case.H, case.dtype, case.scale, gen, device)
    res = make_hidden(case.rows, case.H, case.dtype, 2 * case.scale, gen, device) if case.residual else None
    w = make_norm_weight(case.H, torch.float32 if case.weight_fp32 else case.dtype, case.weight_offset, gen, device)
    if case.layout == "row_stride":
        def strided(t):
            buf = torch.zeros(case.rows, case.H + 24, dtype=t.dtype, device=device)
            buf[:, 8:8 + case.H] = t
            return buf[:, 8:8 + case.H]
        x = strided(x)
        res = strided(res) if res is not None else None
    elif case.layout != "contiguous":
        raise ValueError(f"unknown layout {case.layout!r}")
    gy = _randn((case.rows, case.H), gen).to(device=device, dtype=case.dtype)
    gres = _randn((case.rows, case.H), gen).to(device=device, dtype=case.dtype) if case.residual else None
    return x, res, w, gy, gres


def rmsnorm_measurements(case: NormCase, device, with_grad=True, backend="triton") -> dict:
    """{name: (ours, ref, scale or sensitivity, "forward" | "gradient")}, float64 numpy arrays."""
    from ..ops.rmsnorm import rms_norm
    from ..reference.norms import rms_norm_grad_reference, rms_norm_reference

    _check_backend(backend)
    x, res, w, gy, gres = build_norm_case(case, device)
    xl = x.detach().requires_grad_(with_grad)
    wl = w.detach().requires_grad_(with_grad)
    rl = res.detach().requires_grad_(with_grad) if res is not None else None
    out = rms_norm(xl, wl, eps=case.eps, residual=rl, weight_offset=case.weight_offset)
    y, h = (out if res is not None else (out, xl))
    h64, w64 = _np(h), _np(w)
    ref_y, rstd = rms_norm_reference(h64, w64, case.eps, case.weight_offset)
    m = {"y": (_np(y), ref_y, np.abs(ref_y), "forward")}
    if res is not None:
        ref_h = _np(x) + _np(res)
        m["residual"] = (h64, ref_h, np.abs(ref_h), "forward")
    if with_grad:
        outs, ups = (y, h), (gy, gres)
        if res is None:
            outs, ups = (y,), (gy,)
        grads = torch.autograd.grad(outs, (xl, wl), ups)
        g64 = _np(gy)
        gr64 = _np(gres) if gres is not None else None
        ref_dx, ref_dw = rms_norm_grad_reference(h64, w64, g64, case.eps, case.weight_offset, gr64)
        xhat = h64 * rstd[:, None]
        gw = g64 * (w64 + case.weight_offset)
        sens_dx = rstd[:, None] * (np.abs(gw) + np.abs(xhat) * np.mean(np.abs(gw * xhat), -1, keepdims=True))
        if gr64 is not None:
            sens_dx = sens_dx + np.abs(gr64)
        sens_dw = np.sqrt(case.rows) * np.sum(np.abs(g64 * xhat), axis=0)
        m["grad_x"] = (_np(grads[0]), ref_dx, sens_dx, "gradient")
        m["grad_weight"] = (_np(grads[1]), ref_dw, sens_dw, "gradient")
    return m


def _judge(op, dtype, device, measured) -> dict:
    arch = arch_of(torch.device(device))
    fwd = contracts.judgment(op, dtype, "forward_accuracy", arch)["outputs"]
    grad = contracts.judgment(op, dtype, "gradient_accuracy", arch)
    out = {}
    for name, (ours, ref, scale, kind) in measured.items():
        if kind == "forward":
            out[name] = contracts.scaled_abs_ratio(ours, ref, scale, fwd[name])
        else:
            out[name] = contracts.rounding_plus_sensitivity_ratio(ours, ref, scale, grad)
    return out


def judge_rmsnorm(case: NormCase, device, with_grad=True, backend="triton") -> dict:
    """{output or gradient name: ratio of the worst error to the contracts/rmsnorm.yaml bound}."""
    return _judge("rmsnorm", case.dtype, device, rmsnorm_measurements(case, device, with_grad, backend))


def rmsnorm_row_op(H, dtype, device, residual=True, weight_offset=0.0, scale=1.0) -> RowOp:
    """rms_norm as a RowOp (inputs: x[, residual]; the weight is fixed and differentiated too, so the
    dW path runs, but dW itself sums over the batch and is not a row property)."""
    from ..ops.rmsnorm import rms_norm

    weight = make_norm_weight(H, dtype, weight_offset, torch.Generator().manual_seed(1234), device)

    def make_rows(n, gen):
        x = make_hidden(n, H, dtype, scale, gen, device)
        return (x, make_hidden(n, H, dtype, 2 * scale, gen, device)) if residual else (x,)

    def forward(x, res=None):
        out = rms_norm(x, weight.detach().requires_grad_(True), residual=res, weight_offset=weight_offset)
        return out if residual else (out,)

    name = f"rmsnorm.triton[H={H},{contracts.dtype_name(dtype)},{'residual' if residual else 'plain'}]"
    return RowOp(name, forward, make_rows, grad_inputs=(0, 1) if residual else (0,))


# ---- SwiGLU ----

@dataclass(frozen=True)
class GluCase:
    rows: int
    I: int
    dtype: torch.dtype
    scale: float = 1.0  # gate ~ N(0, scale^2): large scales reach sigmoid's tails
    layout: str = "separate"  # or "fused": the halves of one [rows, 2I] tensor
    seed: int = 0

    def label(self) -> str:
        return f"N={self.rows} I={self.I} {contracts.dtype_name(self.dtype)} scale={self.scale} {self.layout}"


def build_glu_case(case: GluCase, device):
    gen = torch.Generator().manual_seed(case.seed)
    gate = _randn((case.rows, case.I), gen, case.scale)
    up = _randn((case.rows, case.I), gen)
    gy = _randn((case.rows, case.I), gen).to(device=device, dtype=case.dtype)
    if case.layout == "fused":
        gu = torch.cat([gate, up], -1).to(device=device, dtype=case.dtype)
        return gu, gy
    if case.layout != "separate":
        raise ValueError(f"unknown layout {case.layout!r}")
    return (gate.to(device=device, dtype=case.dtype), up.to(device=device, dtype=case.dtype)), gy


def _glu_call(inputs, I):
    """(gate, up leaves, y) for either layout; the leaves are what gradients are taken of."""
    from ..ops.swiglu import swiglu

    if isinstance(inputs, tuple):
        return inputs, swiglu(*inputs)
    return (inputs,), swiglu(inputs[..., :I], inputs[..., I:])


def swiglu_measurements(case: GluCase, device, with_grad=True, backend="triton") -> dict:
    from ..reference.norms import swiglu_grad_reference, swiglu_reference

    _check_backend(backend)
    inputs, gy = build_glu_case(case, device)
    if isinstance(inputs, tuple):
        inputs = tuple(t.detach().requires_grad_(with_grad) for t in inputs)
        g64, u64 = _np(inputs[0]), _np(inputs[1])
    else:
        inputs = inputs.detach().requires_grad_(with_grad)
        g64, u64 = _np(inputs[..., :case.I]), _np(inputs[..., case.I:])
    leaves, y = _glu_call(inputs, case.I)
    ref = swiglu_reference(g64, u64)
    e = np.exp(-np.abs(g64))
    s = np.where(g64 >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    scale = np.abs(ref) * (1.0 + (1.0 - s) * np.abs(g64)) + SIGMOID_FLUSH * np.abs(g64 * u64)
    m = {"y": (_np(y), ref, scale, "forward")}
    if with_grad:
        grads = torch.autograd.grad(y, leaves, gy)
        if len(leaves) == 2:
            dgate, dup = _np(grads[0]), _np(grads[1])
        else:
            dgate, dup = _np(grads[0][..., :case.I]), _np(grads[0][..., case.I:])
        dy = _np(gy)
        ref_dg, ref_du = swiglu_grad_reference(g64, u64, dy)
        rs = (1.0 - s) * (np.abs(g64) + 2.0) + 2.0
        T = 1.0 + g64 * (1.0 - s)
        sens_du = np.abs(dy * g64 * s) * (rs + 2.0) + SIGMOID_FLUSH * np.abs(dy * g64)
        sens_dg = (np.abs(dy * u64) * s * (np.abs(T) * (rs + 3.0) + np.abs(g64) * (s * rs + 2.0 * (1.0 - s)))
                   + SIGMOID_FLUSH * np.abs(dy * u64) * (1.0 + np.abs(g64)))
        m["grad_gate"] = (dgate, ref_dg, sens_dg, "gradient")
        m["grad_up"] = (dup, ref_du, sens_du, "gradient")
    return m


def judge_swiglu(case: GluCase, device, with_grad=True, backend="triton") -> dict:
    """{output or gradient name: ratio of the worst error to the contracts/swiglu.yaml bound}."""
    return _judge("swiglu", case.dtype, device, swiglu_measurements(case, device, with_grad, backend))


def swiglu_row_op(I, dtype, device, layout="separate", scale=3.0) -> RowOp:
    """swiglu as a RowOp: inputs (gate, up), or (gate_up,) whose halves are passed as views."""
    from ..ops.swiglu import swiglu

    def make_rows(n, gen):
        g = _randn((n, I), gen, scale).to(device=device, dtype=dtype)
        u = _randn((n, I), gen).to(device=device, dtype=dtype)
        return (g, u) if layout == "separate" else (torch.cat([g, u], -1),)

    def forward(*inputs):
        if layout == "separate":
            return (swiglu(*inputs),)
        return (swiglu(inputs[0][:, :I], inputs[0][:, I:]),)

    name = f"swiglu.triton[I={I},{contracts.dtype_name(dtype)},{layout}]"
    return RowOp(name, forward, make_rows, grad_inputs=(0, 1) if layout == "separate" else (0,))


# ---- registry descriptors (rlk_triton.registry adds them to operators()) ----

def rmsnorm_cases(on_gpu: bool) -> list:
    rows, Hs = (64, (1, 64, 1000, 4096, 8192, 16384, 20000)) if on_gpu else (3, (1, 1000, 9000))
    out = []
    for i, dtype in enumerate(DTYPES):
        for H in Hs:
            out.append(NormCase(rows, H, dtype, residual=False, seed=i * 1000 + H))
            out.append(NormCase(rows, H, dtype, residual=True, weight_offset=1.0, layout="row_stride",
                                seed=i * 1000 + H + 1))
    return out


def swiglu_cases(on_gpu: bool) -> list:
    rows, Is = (64, (1, 1000, 14336)) if on_gpu else (4, (1, 300, 5000))
    return [GluCase(rows, I, dtype, scale, layout, seed=i * 1000 + I)
            for i, dtype in enumerate(DTYPES) for I in Is
            for scale, layout in ((3.0, "separate"), (30.0, "fused"))]


def _probe(judge, cases):
    def probe(backend, device):
        for case in cases:
            ratios = judge(case, device, backend=backend)
            if max(ratios.values()) > 1.0:
                raise AssertionError(f"probe result outside the contract: error / bound {ratios}")
    return probe


def rmsnorm_harness():
    from .harness import Harness

    def row_ops(device, on_gpu):
        Hs, dts = ((1000, 8192), DTYPES) if on_gpu else ((300,), (torch.bfloat16, torch.float32))
        return [rmsnorm_row_op(H, dt, device, residual=res, weight_offset=1.0 if res else 0.0)
                for H in Hs for dt in dts for res in (False, True)]

    probe = _probe(judge_rmsnorm, [NormCase(4, 257, dt, residual=True, weight_offset=1.0, seed=1)
                                   for dt in (torch.bfloat16, torch.float32)])
    return Harness("rmsnorm", rmsnorm_cases, judge_rmsnorm, row_ops, probe)


def swiglu_harness():
    from .harness import Harness

    def row_ops(device, on_gpu):
        Is, dts = ((1000, 14336), DTYPES) if on_gpu else ((300,), (torch.bfloat16, torch.float32))
        return [swiglu_row_op(I, dt, device, layout) for I in Is for dt in dts
                for layout in ("separate", "fused")]

    probe = _probe(judge_swiglu, [GluCase(4, 257, dt, 3.0, "fused", seed=1)
                                  for dt in (torch.bfloat16, torch.float32)])
    return Harness("swiglu", swiglu_cases, judge_swiglu, row_ops, probe)
