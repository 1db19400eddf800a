"""The rms_norm backward's kernels one by one, native against Triton (torch.profiler's device time per
kernel, the mean of ITERS calls), to say which kernel a gap between the two launches is in: the row
kernel (dx, d residual, the dW partial rows) or the dW reduction. Then the public call's fwd+bwd
(`rms_norm(h, w, backend=...)` and autograd.grad) per kernel, to name any device work either backend's
call path adds beyond its kernels.

    python scripts/gpu_native_kernels.py --out kernels.json [--commit SHA]

A diagnostic: the native kernels run without an admission record here (this process makes no claim
about their bits; the gate does that).
"""
import argparse
import json
import time

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from gpu_native import backward_cases
from rlk_triton import native
from rlk_triton.ops import rmsnorm

ITERS = 50


def kernel_times(fn) -> dict:
    """{kernel name: mean device us per call} over ITERS calls (after a warm-up)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(ITERS):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.self_device_time_total > 0:
            out[e.key[:90]] = round(e.self_device_time_total / ITERS, 2)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    ext = native.load("rmsnorm")
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for N, H, fused, a in backward_cases(g):  # gpu_native.py's backward rows
        for backend, fn in (("triton", lambda: rmsnorm.launch_backward(*a)),
                            ("native", lambda: native._rmsnorm_backward(ext, *a))):
            row = {"shape": f"{N} x {H} bf16", "residual": fused, "backend": backend, "kernels_us": kernel_times(fn)}
            rows.append(row)
            print(row, flush=True)
    native.usable = lambda op, device: (True, None)  # see the docstring: timing only, no record needed
    for N in (1024, 16384):
        H = 4096
        h = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
        w = (1 + 0.1 * torch.randn(H, device="cuda", generator=g)).to(torch.bfloat16).requires_grad_()
        gy = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16)
        for backend in ("triton", "cuda_native"):
            fn = lambda b=backend: torch.autograd.grad(rmsnorm.rms_norm(h, w, backend=b), (h, w), gy)
            row = {"shape": f"{N} x {H} bf16", "call": f"rms_norm(backend='{backend}') fwd+bwd",
                   "kernels_us": kernel_times(fn)}
            rows.append(row)
            print(row, flush=True)
    with open(args.out, "w") as f:
        json.dump({"what": "rms_norm backward launches and public fwd+bwd calls, device time per kernel "
                           f"(torch.profiler, mean of {ITERS} calls), native against Triton",
                   "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "commit": args.commit, "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
