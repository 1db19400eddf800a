"""Measure RoPE's and embedding's error against float64 to set contracts/rope.yaml and embedding.yaml.

For each dtype it prints the smallest bounds that the sweep needs (u = the unit roundoff of the
output's dtype: 2^-8 bf16, 2^-11 fp16, 2^-24 fp32; the interpreter truncates bf16 stores, 2^-7):
  rope forward     rtol_needed = max err / scale, and the part of it past the output rounding,
                   fp32_part = max (err - u |ref| - subnormal) / scale, scale = |x1 c| + |x2 s|
  rope gradient    row_rtol_needed = max (err - u |ref| - subnormal) / sensitivity, the same scale
                   of the upstream gradient
  rope tables      max |fp32 table - float64| / ulp_fp32 (0.5 = correctly rounded)
  embedding        forward max |err| (0 = bitwise copy); dW row_rtol_needed as rope's, with
                   sensitivity = sum of |partial sums| in ascending token order
The contracts take these with a stated margin. Run: python scripts/measure_positional.py [--out F]
(on CPU it sets TRITON_INTERPRET=1; on a GPU it measures the compiled kernels). --big: GPU sizes.
"""
import argparse
import itertools
import json
import os
import sys

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from rlk_triton.ops.embedding import embedding  # noqa: E402
from rlk_triton.ops.rope import apply_rope, rope_tables  # noqa: E402
from rlk_triton.reference.rope_embedding import (embedding_grad_reference, rope_grad_reference,  # noqa: E402
                                                 rope_inv_freq_reference, rope_reference, rope_scale,
                                                 rope_tables_reference)
from rlk_triton.testing.positional import (SCALINGS, EmbeddingCase, RopeCase, build_embedding_case,  # noqa: E402
                                           build_rope_case, table_rows)

ON_GPU = torch.cuda.is_available()
ROUNDING = {torch.bfloat16: 2.0**-8 if ON_GPU else 2.0**-7, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
SUBNORMAL = {torch.bfloat16: 2.0**-133 if ON_GPU else 2.0**-126, torch.float16: 2.0**-25, torch.float32: 2.0**-149}


def _excess(err, ref, dtype, scale):
    ex = np.maximum(err - ROUNDING[dtype] * np.abs(ref) - SUBNORMAL[dtype], 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.max(np.where(ex > 0, ex / scale, 0.0), initial=0.0))


def measure_rope(case, device):
    q_arg, k_arg, cos, sin, pos_arg, q, k = build_rope_case(case, device)
    ql, kl = q_arg.detach().requires_grad_(True), k_arg.detach().requires_grad_(True)
    qr, kr = apply_rope(ql, kl, cos, sin, pos_arg, interleaved=case.interleaved)
    gen = torch.Generator().manual_seed(case.seed + 1)
    gq = (torch.randn(qr.shape, generator=gen) * case.scale).to(device=device, dtype=case.dtype)
    gk = (torch.randn(kr.shape, generator=gen) * case.scale).to(device=device, dtype=case.dtype)
    ((qr * gq).sum() + (kr * gk).sum()).backward()
    c64, s64 = table_rows(cos, sin, pos_arg)
    p = np.arange(case.tokens)
    T, D, il = case.tokens, case.head_dim, case.interleaved
    m = {"fwd_rtol": 0.0, "fwd_fp32_part": 0.0, "grad_row_rtol": 0.0}
    for x, y, g, leaf in ((q, qr, gq, ql), (k, kr, gk, kl)):
        x64 = x.double().cpu().numpy()
        ref = rope_reference(x64, c64, s64, p, il)
        sc = rope_scale(x64, c64, s64, p, il)
        err = np.abs(y.detach().reshape(T, -1, D).double().cpu().numpy() - ref)
        with np.errstate(invalid="ignore", divide="ignore"):
            m["fwd_rtol"] = max(m["fwd_rtol"], float(np.max(np.where(err > 0, err / sc, 0.0), initial=0.0)))
        m["fwd_fp32_part"] = max(m["fwd_fp32_part"], _excess(err, ref, case.dtype, sc))
        g64 = g.reshape(T, -1, D).double().cpu().numpy()
        rg = rope_grad_reference(g64, c64, s64, p, il)
        eg = np.abs(leaf.grad.reshape(T, -1, D).double().cpu().numpy() - rg)
        m["grad_row_rtol"] = max(m["grad_row_rtol"], _excess(eg, rg, case.dtype, rope_scale(g64, c64, s64, p, il)))
    return m


def measure_tables(max_positions):
    """Per scaling: (max err / ulp_fp32 where the angle's rounding is negligible, max of the rest
    of the error over the angle): correctly rounded values up to the float64 angle's rounding."""
    worst = {}
    for name, scaling in SCALINGS.items():
        for base, R in ((10000.0, 128), (500000.0, 128), (10000.0, 64), (1e6, 96)):
            cos, sin = rope_tables(max_positions, R, base=base, scaling=scaling)
            rc, rs = rope_tables_reference(max_positions, R, base, scaling)
            angle = np.arange(max_positions, dtype=np.float64)[:, None] * rope_inv_freq_reference(R, base, scaling)
            for ours, ref in ((cos, rc), (sin, rs)):
                err = np.abs(ours.double().numpy() - ref)
                half_ulp = 0.5 * np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
                past = np.maximum(err - half_ulp, 0.0)
                with np.errstate(invalid="ignore", divide="ignore"):
                    per_angle = float(np.max(np.where(past > 0, past / angle, 0.0)))
                w = worst.setdefault(name, [0.0, 0.0])
                w[0] = max(w[0], float(np.max(np.where(half_ulp > 1e-12, err / (2 * half_ulp), 0.0))))
                w[1] = max(w[1], per_angle)
    return worst


def measure_embedding(case, device):
    ids, weight, grad = build_embedding_case(case, device)
    leaf = weight.detach().requires_grad_(True)
    out = embedding(ids, leaf, padding_idx=case.padding_idx)
    out.backward(grad)
    ref = weight.double().cpu().numpy()[ids.cpu().numpy()]
    rg, sens = embedding_grad_reference(grad.double().cpu().numpy(), ids.cpu().numpy(), case.V, case.padding_idx)
    eg = np.abs(leaf.grad.double().cpu().numpy() - rg)
    return {"fwd_abs": float(np.max(np.abs(out.detach().double().cpu().numpy() - ref), initial=0.0)),
            "grad_row_rtol": _excess(eg, rg, case.dtype, sens)}


def rope_sweep(big):
    T, P = (1024, 131072) if big else (48, 131072)
    shapes = ((8, 2, 128, None), (4, 1, 64, 32), (3, 3, 80, None))
    # tables outermost: consecutive cases share them (testing.positional caches a few)
    for i, (scaling, (H, Hk, D, R), dtype, il, scale) in enumerate(itertools.product(
            SCALINGS, shapes, (torch.bfloat16, torch.float16, torch.float32), (False, True), (1e-3, 1.0, 100.0))):
        base = 500000.0 if scaling == "llama3" else 10000.0
        layout = ("contiguous", "fused_qkv", "bthd")[i % 3]
        yield RopeCase(T, H, Hk, D, dtype, il, R, P, base, scaling, scale, layout, seed=i)


def embedding_sweep(big):
    sizes = ((4096, 151936, 512), (16384, 1000, 256)) if big else ((64, 50, 40), (256, 7, 24), (200, 300, 16))
    for i, (dtype, (N, V, H), dup, pad, scale) in enumerate(itertools.product(
            (torch.bfloat16, torch.float16, torch.float32), sizes, ("uniform", "heavy"), (None, 0),
            (1e-3, 1.0, 100.0))):
        yield EmbeddingCase(N, V, H, dtype, pad, dup, ("contiguous", "row_stride")[i % 2], scale, seed=i)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--big", action="store_true", help="GPU sizes")
    args = ap.parse_args()
    device = "cuda" if ON_GPU else "cpu"
    worst = {}

    def fold(op, case, m):
        w = worst.setdefault(op, {}).setdefault(str(case.dtype).removeprefix("torch."), {})
        for k, v in m.items():
            if v > w.get(k, (-1.0, ""))[0]:
                w[k] = (v, case.label())

    n = 0
    for case in rope_sweep(args.big):
        fold("rope", case, measure_rope(case, device))
        n += 1
    for case in embedding_sweep(args.big):
        fold("embedding", case, measure_embedding(case, device))
        n += 1
    tables = measure_tables(131072)
    for op, per_dtype in worst.items():
        for dt, w in per_dtype.items():
            print(f"{op} {dt}")
            for k, (v, where) in sorted(w.items()):
                print(f"  {k:16s} {v:.3e}   at {where}")
    print("rope tables [max err / ulp_fp32 where ulp > 2e-12, max (err - ulp/2) / angle]:", tables)
    print(f"{n} cases on {device}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device, "cases": n, "worst": worst, "tables_ulp": tables}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
