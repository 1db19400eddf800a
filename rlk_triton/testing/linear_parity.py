"""linear_logp against the float64 reference, judged by contracts/linear_logp.yaml.

Error model behind the judgments (docs/linear_logp.md):
- forward: logits are fp32 dot products of H terms, so their error grows with sum_k |h_k w_k|;
  row_scale = max_j (sum_k |h_k w_jk| + |b_j|) / T + log V bounds every number the row handles.
- gradients: d logits is rounded to the inputs' dtype (relative u_dtype) after fp32 arithmetic whose
  first-order error is u_fp32 * S (S = parity.logp_grad_sensitivity); the products that follow add
  fp32 rounding of the same terms. So an element of d hidden = sum_j d_j W_jk is judged against
  sensitivity = sum_j (max(|d_j|, floor / u_dtype) + (u_fp32 / u_dtype) S_j) |W_jk|
  (d weight and d bias likewise, over tokens; floor = the absolute error of values in the dtype's
  subnormal range, ROUNDING_FLOOR); row_rtol is then a small multiple of u_dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .. import contracts
from .._runtime import arch_of
from .invariance import RowOp
from .parity import FP32_MIN_NORMAL, IGNORE_INDEX, logp_grad_sensitivity, saved_logits_sensitivity

UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}
# The absolute rounding error of a tiny d logits element: half the dtype's smallest subnormal for
# fp16; for bf16 and fp32, whose exponent range is fp32's, the smallest normal 2^-126: GPU fp32
# arithmetic flushes subnormals to zero, and the interpreter mis-converts bf16 subnormals.
ROUNDING_FLOOR = {"bfloat16": 2.0**-126, "float16": 2.0**-25, "float32": 2.0**-126}


@dataclass(frozen=True)
class LinearCase:
    rows: int
    H: int
    V: int
    dtype: torch.dtype
    temperature: float = 1.0
    scale: float = 3.0  # logits ~ N(0, scale^2)
    bias: bool = False
    seed: int = 0
    saved: str = "recompute"  # linear_logp's saved= (what the backward keeps)
    saved_vocab: Optional[int] = None  # with saved="logits": the kept columns (None: all)

    def label(self) -> str:
        kept = "" if self.saved_vocab is None else f" saved_vocab={self.saved_vocab}"
        return (f"N={self.rows} H={self.H} V={self.V} {contracts.dtype_name(self.dtype)} "
                f"T={self.temperature} scale={self.scale} bias={self.bias} saved={self.saved}{kept}")


def make_linear_inputs(rows, H, V, dtype, scale, bias, gen, device):
    """hidden ~ N(0, 1); weight rows ~ N(0, scale^2 / H), so logits ~ N(0, scale^2), plus a few
    weight rows pushed along a shared direction so that some tokens stand out, as in an LM."""
    hidden = torch.randn(rows, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) * (scale / max(H, 1) ** 0.5)
    if V > 4 and rows:
        direction = hidden.mean(0) / (hidden.mean(0).norm() + 1e-6)
        peaks = torch.randint(0, V, (min(4, V),), generator=gen)
        weight[peaks] += direction * (2 * scale)
    b = (torch.randn(V, generator=gen) * scale * 0.3).to(device, dtype) if bias else None
    return hidden.to(device, dtype), weight.to(device, dtype), b


def build_linear_case(case: LinearCase, device):
    gen = torch.Generator().manual_seed(case.seed)
    hidden, weight, bias = make_linear_inputs(case.rows, case.H, case.V, case.dtype, case.scale, case.bias,
                                              gen, device)
    targets = torch.randint(0, case.V, (case.rows,), generator=gen)
    if case.rows > 2:
        targets[1] = IGNORE_INDEX
    return hidden, weight, bias, targets.to(device)


def linear_row_scale(h64, w64, b64, temperature):
    """max_j (sum_k |h_k w_jk| + |b_j|) / T + log V per row."""
    a = np.abs(h64) @ np.abs(w64).T
    if b64 is not None:
        a = a + np.abs(b64)
    V = w64.shape[0]
    return (a.max(axis=-1) if V else np.zeros(h64.shape[0])) / temperature + np.log(max(V, 1))


def grad_weights(rows, seed):
    """The upstream gradients of logp and entropy a case uses (float64 CPU)."""
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randn(rows, generator=gen).double(), torch.randn(rows, generator=gen).double()


def linear_errors(case: LinearCase, device, with_grad=True) -> dict:
    """Runs the case and returns compare_to_reference's dict (shared by judge_linear_logp and
    scripts/measure_linear_logp.py)."""
    from ..logp import linear_logp

    hidden, weight, bias, targets = build_linear_case(case, device)
    leaves = [x.detach().requires_grad_(with_grad) if x is not None else None for x in (hidden, weight, bias)]
    logp, ent = linear_logp(leaves[0], leaves[1], targets, bias=leaves[2], temperature=case.temperature,
                            return_entropy=True, saved=case.saved, saved_vocab=case.saved_vocab)
    outs = {"logp": logp.detach(), "entropy": ent.detach()}
    g, ge = grad_weights(case.rows, case.seed)
    if with_grad:
        ((logp * g.float().to(device)).sum() + (ent * ge.float().to(device)).sum()).backward()
        outs.update({n: x.grad for n, x in zip(("d_hidden", "d_weight", "d_bias"), leaves) if x is not None})
    from ..ops.linear_logp import saved_dtype

    saved = saved_dtype(hidden.dtype) if case.saved == "logits" else None
    return compare_to_reference(outs, hidden, weight, bias, targets, case.temperature, g, ge, saved)


def compare_to_reference(outs, hidden, weight, bias, targets, temperature, g, ge, saved=None) -> dict:
    """{name: (ours, ref64, ref64 with fp32 subnormals flushed or None, row_scale or sensitivity)}
    for the outputs and gradients in `outs` (gradients of sum g * logp + ge * entropy). saved: the
    dtype of the saved logits (saved="logits"), whose rounding the sensitivity then includes."""
    from ..reference.linear_logp import linear_logits64, linear_logp_grad_reference, linear_logp_reference

    h64, w64 = hidden.double().cpu().numpy(), weight.double().cpu().numpy()
    b64 = bias.double().cpu().numpy() if bias is not None else None
    t64 = targets.cpu().numpy()
    ref_logp, ref_ent = linear_logp_reference(h64, w64, t64, b64, temperature)
    scale = linear_row_scale(h64, w64, b64, temperature)
    out = {"logp": (outs["logp"].double().cpu().numpy(), ref_logp, None, scale),
           "entropy": (outs["entropy"].double().cpu().numpy(), ref_ent, None, scale)}
    if "d_hidden" not in outs:
        return out
    g, ge = np.asarray(g, np.float64), np.asarray(ge, np.float64)
    refs = [linear_logp_grad_reference(h64, w64, t64, g, ge, b64, temperature, IGNORE_INDEX, flush_below=f)
            for f in (None, FP32_MIN_NORMAL)]
    d64 = refs[0][3]
    x64 = linear_logits64(h64, w64, b64)
    dt = contracts.dtype_name(hidden.dtype)
    u = UNIT_ROUNDOFF[dt]
    floor = ROUNDING_FLOOR[dt]
    s = logp_grad_sensitivity(x64, t64, temperature, g, ge, d64)
    terms = np.maximum(np.abs(d64), floor / u) + (UNIT_ROUNDOFF["float32"] / u) * s
    if saved is not None:
        terms = terms + (UNIT_ROUNDOFF[contracts.dtype_name(saved)] / u) * saved_logits_sensitivity(
            x64, t64, temperature, g, ge)
    sens = {"d_hidden": terms @ np.abs(w64), "d_weight": terms.T @ np.abs(h64), "d_bias": terms.sum(axis=0)}
    for k, name in enumerate(("d_hidden", "d_weight", "d_bias")):
        if name in outs:
            out[name] = (outs[name].double().cpu().numpy(), refs[0][k], refs[1][k], sens[name])
    return out


def judge_errors(errors: dict, dtype, arch) -> dict:
    """{name: worst error / contract bound} from compare_to_reference's dict (<= 1 passes)."""
    fwd = contracts.judgment("linear_logp", dtype, "forward_accuracy", arch)["outputs"]
    bound = contracts.judgment("linear_logp", dtype, "gradient_accuracy", arch)
    out = {}
    for name, (ours, ref, flushed, scale) in errors.items():
        if name in fwd:
            out[name] = contracts.scaled_abs_ratio(ours, ref, scale, fwd[name])
        else:
            out[name] = contracts.rounding_plus_sensitivity_ratio(ours, ref, scale, bound, flushed)
    return out


def judge_linear_logp(case: LinearCase, device, with_grad=True) -> dict:
    """{output / gradient name: worst error / contract bound} (<= 1 passes)."""
    return judge_errors(linear_errors(case, device, with_grad), case.dtype, arch_of(torch.device(device)))


def linear_logp_row_op(H, V, dtype, device, temperature=0.8, bias=True, scale=3.0, saved="recompute",
                       saved_vocab=None) -> RowOp:
    """linear_logp as a RowOp over tokens (inputs: hidden rows, targets); the weight and bias are
    shared by every batch. Gradients judged: d hidden (rows); d weight is a sum over tokens."""
    from ..logp import linear_logp

    gen0 = torch.Generator().manual_seed(1234)
    _, weight, b = make_linear_inputs(4, H, V, dtype, scale, bias, gen0, device)

    def make_rows(n, gen):
        hidden = torch.randn(n, H, generator=gen).to(device, dtype)
        return hidden, torch.randint(0, V, (n,), generator=gen).to(device)

    def forward(hidden, targets):
        return linear_logp(hidden, weight, targets, bias=b, temperature=temperature, return_entropy=True,
                           saved=saved, saved_vocab=saved_vocab)

    def padding(n, gen):
        return (torch.zeros(n, H, dtype=dtype, device=device),
                torch.full((n,), IGNORE_INDEX, dtype=torch.long, device=device))

    kept = "" if saved_vocab is None else f",saved_vocab={saved_vocab}"
    return RowOp(f"linear_logp[H={H},V={V},{contracts.dtype_name(dtype)},saved={saved}{kept}]", forward, make_rows,
                 grad_inputs=(0,), make_padding=padding)


def linear_logp_harness():
    """How `rlk-triton check` checks linear_logp's claims (rlk_triton/operators.py)."""
    from .harness import Harness

    def cases(on_gpu):
        if on_gpu:
            shapes = [(64, 4096, 32000), (33, 512, 4099)]
        else:
            shapes = [(7, 32, 200)]
        return [LinearCase(n, h, v, dt, t, 3.0, bias, seed=v + i)
                for n, h, v in shapes
                for i, dt in enumerate((torch.bfloat16, torch.float16, torch.float32))
                for t, bias in ((1.0, False), (0.7, True))]

    def judge(case, device, backend="triton"):
        if backend != "triton":
            raise ValueError(f"linear_logp has no backend {backend!r}")
        return judge_linear_logp(case, device)

    def row_ops(device, on_gpu):
        H, V = (4096, 151936) if on_gpu else (32, 200)
        return [linear_logp_row_op(H, V, dt, device) for dt in (torch.bfloat16, torch.float32)]

    def probe(backend, device):
        ratios = judge(LinearCase(4, 32, 130, torch.float32, 0.9, 3.0, True, seed=1), device, backend)
        if max(ratios.values()) > 1.0:
            raise AssertionError(f"probe result outside the contract: error / bound {ratios}")

    return Harness("linear_logp", cases, judge, row_ops, probe)
