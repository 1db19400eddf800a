"""Measure selected_logp's error against float64 to set contracts/selected_logp.yaml.

For each dtype it prints the smallest bounds that the sweep needs:
  forward   rtol_needed = max err / row_scale               (scaled_abs with atol = 0)
  gradient  row_rtol_needed = max (err - u*|ref| - subnormal) / sensitivity, u = the unit
            roundoff of the gradient's dtype (testing.parity.logp_grad_sensitivity)
The contract takes these times a stated margin. Run: python scripts/measure_errors.py [--out F]
(on CPU it needs TRITON_INTERPRET=1; on a GPU it measures the compiled kernels).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from rlk_triton.logp import selected_logp  # noqa: E402
from rlk_triton.reference import selected_logp_grad_reference, selected_logp_reference  # noqa: E402
from rlk_triton.testing.parity import FP32_MIN_NORMAL, IGNORE_INDEX, LogpCase, build_case, logp_grad_sensitivity, row_scale  # noqa: E402

# unit roundoff of the gradient's dtype (round to nearest even); the interpreter truncates bf16
# stores, so there the bf16 row is 2^-7 (contracts/selected_logp.yaml, arch_overrides)
ROUNDING = {torch.bfloat16: 2.0**-7 if not torch.cuda.is_available() else 2.0**-8,
            torch.float16: 2.0**-11, torch.float32: 2.0**-24}
# absolute floor: half the smallest subnormal of the gradient's dtype, a whole one for bf16 under the
# interpreter, which truncates bf16 stores (flushing of fp32
# intermediates is judged by the flushed reference instead)
SUBNORMAL = {torch.bfloat16: 2.0**-133 if torch.cuda.is_available() else 2.0**-132, torch.float16: 2.0**-25, torch.float32: 2.0**-149}


def measure(case, device, rounding):
    logits, tgt, t_arg, x64, tgt64, t64 = build_case(case, device)
    leaf = logits.detach().requires_grad_(True)
    logp, ent = selected_logp(leaf, tgt, temperature=t_arg, return_entropy=True)
    rl, re = selected_logp_reference(x64, tgt64, t64, IGNORE_INDEX)
    sc = row_scale(x64, t64)
    g = torch.randn(case.rows, generator=torch.Generator().manual_seed(case.seed + 1))
    h = torch.randn(case.rows, generator=torch.Generator().manual_seed(case.seed + 2))
    ((logp.reshape(-1) * g.to(device)).sum() + (ent.reshape(-1) * h.to(device)).sum()).backward()
    rg, rf = (selected_logp_grad_reference(x64, tgt64, g.double().numpy(), h.double().numpy(), t64,
                                           IGNORE_INDEX, flush_below=f) for f in (None, FP32_MIN_NORMAL))
    ours = leaf.grad.reshape(case.rows, case.V).double().cpu().numpy()
    e_lp = np.abs(logp.detach().reshape(-1).double().cpu().numpy() - rl)
    e_en = np.abs(ent.detach().reshape(-1).double().cpu().numpy() - re)
    e_g = np.minimum(np.abs(ours - rg), np.abs(ours - rf))  # as the contract judges it
    sens = logp_grad_sensitivity(x64, tgt64, t64, g.double().numpy(), h.double().numpy(), rg)
    excess = np.maximum(e_g - rounding * np.abs(rg) - SUBNORMAL[case.dtype], 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rr = np.where(excess > 0, excess / sens, 0.0)
    return {
        "logp_rtol": float((e_lp / sc).max()), "logp_abs": float(e_lp.max()),
        "entropy_rtol": float((e_en / sc).max()), "entropy_abs": float(e_en.max()),
        "grad_row_rtol": float(np.nanmax(rr)) if np.isfinite(rr).all() else float("inf"), "grad_rel_max": float(np.max(e_g / np.maximum(np.abs(rg), 1e-30))),
        "grad_abs_where_ref_tiny": float(np.max(np.where(np.abs(rg) < 1e-30, e_g, 0.0))),
    }


def sweep(device, big):
    Vs = [1, 3, 1000, 32000, 50257] + ([151936, 262144] if big else [151936])
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for V in Vs:
            rows = 8 if V <= 50257 or big else 2
            for scale in (0.01, 1.0, 3.0, 30.0, 1e4):
                for temp in (1.0, 0.7, "rows"):
                    yield LogpCase(rows, V, dtype, temp, scale, "contiguous", seed=V + int(scale * 100) + (0 if temp == "rows" else int(temp * 10)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--big", action="store_true", help="more rows and V up to 262144")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    worst = {}
    for case in sweep(device, args.big):
        m = measure(case, device, ROUNDING[case.dtype])
        w = worst.setdefault(str(case.dtype).removeprefix("torch."), {})
        for k, v in m.items():
            if v > w.get(k, (-1, ""))[0]:
                w[k] = (v, case.label())
    for dt, w in worst.items():
        print(dt)
        for k, (v, where) in sorted(w.items()):
            print(f"  {k:26s} {v:.3e}   at {where}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device, "worst": worst}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
