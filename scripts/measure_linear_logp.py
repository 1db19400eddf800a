"""Measure linear_logp's errors against float64: the numbers contracts/linear_logp.yaml is set from.

  forward:  worst |ours - ref| / row_scale                         -> forward rtol (x margin)
  gradient: worst (|ours - ref| - rounding to the dtype) / sensitivity -> row_rtol (x margin)
(testing/linear_parity.py defines row_scale and sensitivity.) Runs on CUDA if present, else under
the Triton interpreter with small shapes. --out writes JSON.
"""
import argparse
import json
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402

from rlk_triton.testing.linear_parity import UNIT_ROUNDOFF, LinearCase, linear_errors  # noqa: E402


def cases(on_gpu):
    if on_gpu:
        shapes = [(64, 4096, 32000), (33, 512, 4099)]
    else:
        shapes = [(19, 48, 300), (8, 96, 1000), (33, 32, 130)]
    out = []
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for i, (n, h, v) in enumerate(shapes):
            for scale in (1.0, 5.0, 20.0):
                for t, bias in ((1.0, False), (0.7, True)):
                    if dt == torch.float16 and scale > 10:
                        continue  # fp16 hidden @ weight would not be representable anyway at the extremes
                    out.append(LinearCase(n, h, v, dt, t, scale, bias, seed=i * 100 + int(scale)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    worst = {}
    for case in cases(device == "cuda"):
        dt = str(case.dtype).removeprefix("torch.")
        u = UNIT_ROUNDOFF[dt]
        sub = {"bfloat16": 2.0**-134, "float16": 2.0**-25, "float32": 2.0**-150}[dt]
        for name, (ours, ref, flushed, scale) in linear_errors(case, device).items():
            err = np.abs(ours - ref)
            if flushed is not None:
                err = np.minimum(err, np.abs(ours - flushed))
            if name in ("logp", "entropy"):
                val = float(np.max(err / scale)) if err.size else 0.0
            else:
                excess = np.maximum(err - sub - u * np.abs(ref), 0.0)
                val = float(np.max(np.where(excess > 0, excess / scale, 0.0))) if err.size else 0.0
            key = f"{dt}/{name}"
            if val >= worst.get(key, (-1, ""))[0]:
                worst[key] = (val, case.label())
        print(case.label(), "done", file=sys.stderr)
        if args.out:  # progressively: a time limit keeps what was measured
            _write(args.out, device, worst)
    for k, (v, label) in sorted(worst.items()):
        print(f"{k:22s} {v:.3e}   ({label})")
    if args.out:
        _write(args.out, device, worst)


def _write(path, device, worst):
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if device == "cuda" else "interpreter",
                   "worst": {k: {"value": v, "case": c} for k, (v, c) in sorted(worst.items())}}, f, indent=1)


if __name__ == "__main__":
    main()
