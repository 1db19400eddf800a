"""Measure the matmul's errors against float64 (the numbers contracts/matmul.yaml is set from):
forward worst |ours - ref| / S and gradients worst (|ours - ref| - rounding) / sensitivity
(rlk_triton/testing/matmul_parity.py). CUDA if present, else the Triton interpreter. --out: JSON."""
import argparse
import json
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402

from rlk_triton.testing.linear_parity import UNIT_ROUNDOFF  # noqa: E402
from rlk_triton.testing.matmul_parity import MatmulCase, matmul_errors  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = [(256, 1024, 4096), (64, 4096, 1000), (33, 300, 14336)] if dev == "cuda" else \
        [(37, 70, 50), (16, 64, 300), (9, 33, 1000)]
    worst = {}
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        name_dt = str(dt).removeprefix("torch.")
        u = UNIT_ROUNDOFF[name_dt]
        for i, (m, n, k) in enumerate(shapes):
            for scale in (1.0, 30.0):
                case = MatmulCase(m, n, k, dt, bias=True, scale=scale, seed=i)
                for name, (ours, ref, sens) in matmul_errors(case, dev).items():
                    err = np.abs(ours - ref)
                    if name == "out":
                        val = float(np.max(err / sens))
                    else:
                        val = float(np.max(np.maximum(err - u * np.abs(ref), 0) / sens))
                    key = f"{name_dt}/{name}"
                    if val >= worst.get(key, (-1.0, ""))[0]:
                        worst[key] = (val, case.label())
    for k, (v, c) in sorted(worst.items()):
        print(f"{k:18s} {v:.3e}  ({c})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": dev, "worst": {k: {"value": v, "case": c} for k, (v, c) in worst.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
