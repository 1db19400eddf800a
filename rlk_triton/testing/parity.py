"""Parity against the float64 references, judged by contracts/. Shared by the tests and the CLI.

A case is seeded and self-describing; `judge_*` returns, per judgment, the ratio of the worst
error to what the contract allows (<= 1 passes) so that reports show the margin, not just a bool.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import contracts
from .._runtime import arch_of
from .invariance import RowOp

IGNORE_INDEX = -100
FP32_MIN_NORMAL = 2.0**-126  # below it GPU fp32 arithmetic may flush to zero
LAYOUTS = ("contiguous", "row_stride", "slice3d")


@dataclass(frozen=True)
class LogpCase:
    rows: int
    V: int
    dtype: torch.dtype
    temperature: object = 1.0  # a float, or "rows" for random per-row temperatures
    scale: float = 3.0  # logits ~ N(0, scale^2), with a few peaked tokens
    layout: str = "contiguous"
    seed: int = 0

    def label(self) -> str:
        dt = contracts.dtype_name(self.dtype)
        return f"N={self.rows} V={self.V} {dt} T={self.temperature} scale={self.scale} {self.layout}"


def make_logits(rows, V, dtype, scale, gen, device):
    """Logits shaped like an LM's: a Gaussian body plus a few tokens pushed up by a few sigma."""
    x = torch.randn(rows, V, generator=gen) * scale
    if V > 1:
        peaks = torch.randint(0, V, (rows, min(4, V)), generator=gen)
        x.scatter_add_(1, peaks, torch.rand(peaks.shape, generator=gen) * 4 * scale)
    return x.to(device=device, dtype=dtype)


def build_case(case: LogpCase, device):
    """(logits as the op sees them, targets, temperature arg, ref inputs as float64 numpy)."""
    gen = torch.Generator().manual_seed(case.seed)
    dense = make_logits(case.rows, case.V, case.dtype, case.scale, gen, device)
    targets = torch.randint(0, case.V, (case.rows,), generator=gen)
    if case.rows > 2:
        targets[1] = IGNORE_INDEX
    targets = targets.to(device)
    if case.temperature == "rows":
        temp = (0.5 + torch.rand(case.rows, generator=gen)).to(device)
    else:
        temp = float(case.temperature)
    if case.layout == "contiguous":
        logits, tgt, t_arg = dense, targets, temp
    elif case.layout == "row_stride":  # rows of a wider buffer
        buf = torch.zeros(case.rows, case.V + 24, dtype=case.dtype, device=device)
        buf[:, 8:8 + case.V] = dense
        logits, tgt, t_arg = buf[:, 8:8 + case.V], targets, temp
    elif case.layout == "slice3d":  # [B, T+1, V][:, :-1]: the shifted logits of a training step
        if case.rows % 2:
            raise ValueError("slice3d needs an even number of rows")
        b, t = 2, case.rows // 2
        buf = torch.zeros(b, t + 1, case.V, dtype=case.dtype, device=device)
        buf[:, :-1] = dense.view(b, t, case.V)
        logits, tgt = buf[:, :-1], targets.view(b, t)
        t_arg = temp.view(b, t) if torch.is_tensor(temp) else temp
    else:
        raise ValueError(f"unknown layout {case.layout!r}")
    ref_t = temp.double().cpu().numpy() if torch.is_tensor(temp) else temp
    return logits, tgt, t_arg, dense.double().cpu().numpy(), targets.cpu().numpy(), ref_t


def row_scale(logits64, temperature):
    """Per-row max |logits / T| (finite entries) + log V: bounds |x| and |lse|, the numbers the
    fp32 arithmetic handles; its rounding error grows with them."""
    t = np.asarray(temperature, np.float64)
    x = np.abs(logits64 / (t[:, None] if t.ndim else t))
    x = np.where(np.isfinite(x), x, 0.0)
    V = x.shape[-1]
    return (x.max(axis=-1) if V else np.zeros(x.shape[:-1])) + np.log(max(V, 1))


def _softmax_terms(x64, tgt64, t64, g, ignore_index):
    """(T, z = x / T, row max of z, softmax p, row_scale, |g| with ignored rows 0), rows as columns."""
    t = np.asarray(t64, np.float64)
    t = t[:, None] if t.ndim else t
    x = x64 / t
    m = np.max(np.where(np.isfinite(x), x, -np.inf), axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        p = np.exp(x - m)
    p = p / p.sum(axis=-1, keepdims=True)
    sc = row_scale(x64, t64)[:, None]
    g = np.where(np.asarray(tgt64) == ignore_index, 0.0, np.abs(g))[:, None]
    return t, x, m, p, sc, g


def logp_grad_sensitivity(x64, tgt64, t64, g, h, ref_grad, ignore_index=IGNORE_INDEX):
    """First-order size of fp32 rounding in d logits_j, for the gradient judgment.

    The kernel forms p_j = exp(x_j - lse) with a relative error of order eps * row_scale, and
    log p_j + H with an absolute one of the same order, so
      |error_j| ~ eps * (|d_j| + row_scale * max(p_j, 2^-126) * (|g| + |h| * (1 + row_scale)) / T),
    the first term for the final products (by g, h and 1/T) of the element itself.
    """
    t, x, m, p, sc, g = _softmax_terms(x64, tgt64, t64, g, ignore_index)
    p = np.maximum(p, FP32_MIN_NORMAL)  # fp32 holds p to eps * max(p, smallest normal)
    return np.abs(ref_grad) + sc * p * (g + np.abs(h)[:, None] * (1.0 + sc)) / t


def saved_logits_sensitivity(x64, tgt64, t64, g, h, ignore_index=IGNORE_INDEX):
    """First-order size of rounding the saved logits (linear_logp saved="logits") in d logits_j.

    The forward keeps z_j - (its tile's row max), rounded to the saved dtype: an absolute error of
    u_saved * |z_j - tile max| <= u_saved * (row max - z_j), which moves log p_j by as much, so
      |error_j| ~ u_saved * (row max - z_j) * p_j * (|g| + |h| * (1 + row_scale)) / T.
    Returned without u_saved (the caller scales it, as it does logp_grad_sensitivity's)."""
    t, x, m, p, sc, g = _softmax_terms(x64, tgt64, t64, g, ignore_index)
    with np.errstate(invalid="ignore"):  # a -inf logit: p = 0 there
        spread = np.where(p > 0, (m - x) * p, 0.0)
    return spread * (g + np.abs(h)[:, None] * (1.0 + sc)) / t


def judge_selected_logp(case: LogpCase, device, with_grad=True, backend="triton") -> dict:
    """{judgment or output name: ratio of the worst error to the contract bound}."""
    from ..logp import selected_logp
    from ..reference import selected_logp_grad_reference, selected_logp_reference

    arch = arch_of(torch.device(device))
    logits, tgt, t_arg, x64, tgt64, t64 = build_case(case, device)
    leaf = logits.detach().requires_grad_(with_grad)
    logp, ent = selected_logp(leaf, tgt, temperature=t_arg, return_entropy=True, ignore_index=IGNORE_INDEX,
                              backend=backend)
    ref_logp, ref_ent = selected_logp_reference(x64, tgt64, t64, IGNORE_INDEX)
    scale = row_scale(x64, t64)
    fwd = contracts.judgment("selected_logp", case.dtype, "forward_accuracy", arch)["outputs"]
    out = {
        "logp": contracts.scaled_abs_ratio(logp.detach().reshape(-1).cpu(), ref_logp, scale, fwd["logp"]),
        "entropy": contracts.scaled_abs_ratio(ent.detach().reshape(-1).cpu(), ref_ent, scale, fwd["entropy"]),
    }
    if with_grad:
        gen = torch.Generator().manual_seed(case.seed + 1)
        g = torch.randn(case.rows, generator=gen)
        h = torch.randn(case.rows, generator=gen)
        loss = (logp.reshape(-1) * g.to(device)).sum() + (ent.reshape(-1) * h.to(device)).sum()
        loss.backward()
        ref_grad, ref_flushed = (
            selected_logp_grad_reference(x64, tgt64, g.double().numpy(), h.double().numpy(), t64,
                                         IGNORE_INDEX, flush_below=f) for f in (None, FP32_MIN_NORMAL))
        bound = contracts.judgment("selected_logp", case.dtype, "gradient_accuracy", arch)
        ours = leaf.grad.detach().reshape(case.rows, case.V).double().cpu().numpy()
        sens = logp_grad_sensitivity(x64, tgt64, t64, g.double().numpy(), h.double().numpy(), ref_grad)
        out["grad"] = contracts.rounding_plus_sensitivity_ratio(ours, ref_grad, sens, bound, ref_flushed)
    return out


def selected_logp_row_op(V, dtype, device, temperature="rows", scale=3.0, backend="triton") -> RowOp:
    """selected_logp as a RowOp for the invariance harness (inputs: logits, targets, temperatures)."""
    from ..logp import selected_logp, selected_logp_indexed

    def make_rows(n, gen):
        logits = make_logits(n, V, dtype, scale, gen, device)
        targets = torch.randint(0, V, (n,), generator=gen).to(device)
        temps = (0.5 + torch.rand(n, generator=gen)).to(device)
        return logits, targets, temps

    def t_arg(temps):
        return temps if temperature == "rows" else float(temperature)

    def forward(logits, targets, temps):
        return selected_logp(logits, targets, temperature=t_arg(temps), return_entropy=True, backend=backend)

    def indexed(inputs, rows):
        logits, targets, temps = inputs
        t = temps[rows] if temperature == "rows" else float(temperature)
        return selected_logp_indexed(logits, targets[rows], rows, temperature=t, return_entropy=True,
                                     backend=backend)

    def padding(n, gen):  # what a padded batch holds: zero logits, ignored targets, T = 1
        return (torch.zeros(n, V, dtype=dtype, device=device),
                torch.full((n,), IGNORE_INDEX, dtype=torch.long, device=device),
                torch.ones(n, device=device))

    return RowOp(f"selected_logp.{backend}[V={V},{contracts.dtype_name(dtype)},T={temperature}]",
                 forward, make_rows, grad_inputs=(0,), indexed=indexed, make_padding=padding)


def selected_logp_harness():
    """How `rlk-triton check` checks selected_logp's claims (rlk_triton/operators.py)."""
    from .harness import Harness

    def cases(on_gpu):
        # the float64 reference on the host dominates the time: few rows even on a GPU
        rows, big = (32, (1, 3, 1000, 32000, 50257, 151936, 262144)) if on_gpu else (4, (1, 3, 1000, 50257))
        out = []
        for i, dtype in enumerate((torch.bfloat16, torch.float16, torch.float32)):
            for V in big:
                for T, layout in (("rows", "contiguous"), (0.7, "slice3d")):
                    out.append(LogpCase(rows, V, dtype, T, 3.0, layout, seed=i * 1000 + V))
        return out

    def row_ops(device, on_gpu):
        Vs = (1000, 151936) if on_gpu else (1000,)
        return [selected_logp_row_op(V, dt, device, backend=b) for b in ("triton", "torch_reference")
                for V in Vs for dt in (torch.bfloat16, torch.float16, torch.float32)]

    def probe(backend, device):
        for dt in (torch.bfloat16, torch.float32):
            ratios = judge_selected_logp(LogpCase(4, 257, dt, "rows", 3.0, "contiguous", seed=1), device,
                                         backend=backend)
            if max(ratios.values()) > 1.0:
                raise AssertionError(f"probe result outside the contract: error / bound {ratios}")

    return Harness("selected_logp", cases, judge_selected_logp, row_ops, probe)
