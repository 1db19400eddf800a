"""What the attention kernels' memory safety costs on the GPU: the kernels before it (index clamps and
grid-stride row loops) against the current ones, same run, same configs, bits compared.

    python scripts/gpu_clamp_cost.py --out clamp.json

Needs the kernels before the change as rlk_triton/ops/_attention_before.py (the launch functions of
that commit's rlk_triton/ops/attention.py without its torch.library section: a copy made for the run,
not part of the package; the 2026-12-04 report used 24638e5's file:
`git show 24638e5:rlk_triton/ops/attention.py`, cut before its torch.library section).
Report: docs/reports/h200-clamp-cost-2026-12-04.json.
"""
import argparse
import json

import torch
import triton

from rlk_triton import configs
from rlk_triton._runtime import default_arch
from rlk_triton.ops import _attention_before as before
from rlk_triton.ops import attention as after

DT = torch.bfloat16


def graph_ms(fn, reps=5):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(11):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / reps)
    return sorted(times)[len(times) // 2]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    D = 128

    def row(kernel, shape, fb, fa, reps=5):
        ob, oa = fb(), fa()
        ms_b, ms_a = graph_ms(fb, reps), graph_ms(fa, reps)
        ms_b2 = graph_ms(fb, reps)  # again: the run-to-run spread beside the difference
        rows.append({"kernel": kernel, "shape": shape, "before_ms": ms_b, "before_again_ms": ms_b2, "after_ms": ms_a,
                     "cost": ms_a / ms_b - 1, "spread": abs(ms_b2 / ms_b - 1), "bitwise": _same(ob, oa)})
        print(rows[-1], flush=True)

    for S, L, Hq, Hkv in ((4, 8192, 32, 8), (64, 1024, 32, 8)):
        N = S * L
        q = torch.randn(N, Hq, D, device="cuda", generator=g).to(DT)
        k = torch.randn(N, Hkv, D, device="cuda", generator=g).to(DT)
        v = torch.randn(N, Hkv, D, device="cuda", generator=g).to(DT)
        cu = torch.arange(0, N + 1, L, device="cuda", dtype=torch.int32)
        sc = D**-0.5
        row("attention forward", f"{S} x {L}, {Hq}/{Hkv} heads, D={D}, causal, bf16",
            lambda: before.launch_forward(q, k, v, cu, L, sc, True), lambda: after.launch_forward(q, k, v, cu, L, sc, True))
        out, lse = after.launch_forward(q, k, v, cu, L, sc, True)
        do = torch.randn_like(out)
        row("attention backward", f"{S} x {L}, {Hq}/{Hkv} heads, D={D}, causal, bf16",
            lambda: before.launch_backward(do, None, q, k, v, out, lse, cu, L, sc, True),
            lambda: after.launch_backward(do, None, q, k, v, out, lse, cu, L, sc, True), reps=2)
        del q, k, v, out, lse, do
    Hq, Hkv = 16, 8
    for B, L in ((64, 4096), (256, 1024)):
        page = 256
        pages = B * L // page
        kc = torch.randn(pages, page, Hkv, D, device="cuda", generator=g).to(DT)
        vc = torch.randn(pages, page, Hkv, D, device="cuda", generator=g).to(DT)
        bt = torch.randperm(pages, device="cuda").reshape(B, L // page).to(torch.int32)
        sl = torch.full((B,), L, device="cuda", dtype=torch.int32)
        q = torch.randn(B, Hq, D, device="cuda", generator=g).to(DT)
        cuq = torch.arange(B + 1, device="cuda", dtype=torch.int32)
        cfg = configs.lookup_decode(default_arch(), DT, D, B * Hkv, Hq // Hkv)
        row("attention_decode", f"{B} x {L} cached, {Hq}/{Hkv} heads, D={D}, bf16",
            lambda: before.launch_decode(q, kc, vc, bt, sl, cuq, 1, D**-0.5, cfg=cfg),
            lambda: after.launch_decode(q, kc, vc, bt, sl, cuq, 1, D**-0.5, cfg=cfg), reps=10)
        del kc, vc
    report = {"what": "attention kernels before / after the bad-input clamps and grid-stride loops (same run)",
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "commit": args.commit, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
