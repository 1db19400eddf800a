"""Measure RMSNorm's and SwiGLU's error against float64 to set contracts/rmsnorm.yaml, swiglu.yaml.

For each op, dtype and output it prints the smallest bounds the sweep needs, with the scales and
sensitivities of rlk_triton.testing.rowwise (one definition, shared with the tests):
  forward   rtol_needed     = max (err - atol) / scale                 (scaled_abs)
            excess_needed   = max (err - u * |ref| - atol) / scale, u = the unit roundoff of the
                              output dtype: what is left beyond the output's one rounding
            atol = half the smallest subnormal of the output dtype (as below)
  gradient  row_rtol_needed = max (err - u * |ref| - atol) / sensitivity
The contracts take these times a stated margin. Run: python scripts/measure_rowwise.py [--out F] [--big]
(on CPU it needs TRITON_INTERPRET=1, set here; on a GPU it measures the compiled kernels).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from rlk_triton.testing.rowwise import (GluCase, NormCase, rmsnorm_measurements,  # noqa: E402
                                        swiglu_measurements)

ON_GPU = torch.cuda.is_available()
# unit roundoff of an output's dtype (round to nearest even); the interpreter truncates bf16 stores,
# a whole bf16 ulp (contracts: arch_overrides.interpreter)
ROUNDING = {torch.bfloat16: 2.0**-8 if ON_GPU else 2.0**-7, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
# half the smallest subnormal of the dtype; bf16 under the interpreter: its smallest normal
SUBNORMAL = {torch.bfloat16: 2.0**-133 if ON_GPU else 2.0**-126, torch.float16: 2.0**-25, torch.float32: 2.0**-149}


def measure(measured, dtype):
    u, sub = ROUNDING[dtype], SUBNORMAL[dtype]
    out = {}
    for name, (ours, ref, scale, kind) in measured.items():
        if np.isnan(ours).any():
            out[f"{name}_nan"] = float("inf")
            continue
        err = np.abs(ours - ref)
        with np.errstate(invalid="ignore", divide="ignore"):
            if kind == "forward":
                beyond = np.maximum(err - sub, 0.0)
                out[f"{name}_rtol"] = float(np.max(np.where(beyond > 0, beyond / scale, 0.0), initial=0.0))
                excess = np.maximum(err - u * np.abs(ref) - sub, 0.0)
                out[f"{name}_excess"] = float(np.max(np.where(excess > 0, excess / scale, 0.0), initial=0.0))
            else:
                excess = np.maximum(err - u * np.abs(ref) - sub, 0.0)
                out[f"{name}_row_rtol"] = float(np.max(np.where(excess > 0, excess / scale, 0.0), initial=0.0))
    return out


def norm_sweep(big):
    rows = 64 if big else 8
    Hs = (1, 7, 64, 1000, 4096, 9000) + ((8192, 16384, 20000) if big else ())
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for H in Hs:
            for scale in (1e-3, 1.0, 100.0):
                for residual, offset, layout in ((False, 0.0, "contiguous"), (True, 1.0, "row_stride"),
                                                 (True, 0.0, "contiguous")):
                    yield NormCase(rows, H, dtype, residual, offset, scale, layout,
                                   seed=H + int(scale * 1000) + 7 * residual + int(offset))


def glu_sweep(big):
    rows = 64 if big else 4
    Is = (1, 33, 300, 5000) + ((14336,) if big else ())
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for I in Is:
            for scale in (0.1, 1.0, 3.0, 10.0, 30.0):
                for layout in ("separate", "fused"):
                    yield GluCase(rows, I, dtype, scale, layout, seed=I + int(scale * 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--big", action="store_true", help="more rows and the GPU hidden sizes")
    args = ap.parse_args()
    device = "cuda" if ON_GPU else "cpu"
    worst = {}
    n_cases = {}
    for op, sweep, fn in (("rmsnorm", norm_sweep, rmsnorm_measurements), ("swiglu", glu_sweep, swiglu_measurements)):
        for case in sweep(args.big):
            m = measure(fn(case, device), case.dtype)
            key = f"{op}/{str(case.dtype).removeprefix('torch.')}"
            n_cases[key] = n_cases.get(key, 0) + 1
            w = worst.setdefault(key, {})
            for k, v in m.items():
                if v > w.get(k, (-1, ""))[0]:
                    w[k] = (v, case.label())
    for key, w in worst.items():
        print(f"{key}  ({n_cases[key]} cases)")
        for k, (v, where) in sorted(w.items()):
            print(f"  {k:22s} {v:.3e}   at {where}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device, "cases": n_cases, "worst": worst}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
