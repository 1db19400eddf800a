"""Where the host time of a small op goes on a GPU machine: rms_norm forward + backward at
[16384 x 4096] bf16 (about 0.18 ms of kernels against about 0.9 ms of wall clock on the H200).

    python scripts/gpu_host_overhead.py [--out report.json]

Prints wall-clock per call for the public function, the custom op alone and the bare kernel launch,
then a cProfile of 200 forward + backward calls (top entries by own time).
"""
import argparse
import cProfile
import io
import json
import pstats

import torch

from rlk_triton import bench
from rlk_triton.ops import rmsnorm


def per_call_ms(fn, n=200):
    return bench.wall_ms(fn, n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    xg = x.detach().requires_grad_()
    wg = w.detach().requires_grad_()
    g = torch.randn_like(x)

    def fwd():
        return rmsnorm.rms_norm(x, w)

    def fwd_bwd():
        xg.grad = wg.grad = None
        rmsnorm.rms_norm(xg, wg).backward(g)

    rows = {"public forward (no grad)": per_call_ms(fwd), "public forward + backward": per_call_ms(fwd_bwd)}
    with torch.no_grad():
        rows["public forward under no_grad"] = per_call_ms(fwd)
    for k, v in rows.items():
        print(f"{k}: {v:.3f} ms per call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        fwd_bwd()
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    text = s.getvalue()
    print(text[:6000])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"per_call_ms": rows, "profile_top": text[:20000]}, f, indent=1)


if __name__ == "__main__":
    main()
