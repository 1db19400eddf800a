"""What one Triton launch costs on this GPU machine's host, part by part: the JIT launch, the launch
cache's hit, the compiled kernel's launcher with tensors and with their addresses as ints, Triton's C
launcher alone, and the host work around a launch (an output allocation, the stream handle, a host
tensor descriptor, the cache's signature). The kernel is empty, so a launch's wall time is its host
time (the device runs each in about a microsecond). Then matmul's descriptor kernel at M = 8 (the
decode GEMM) with the descriptors re-encoded per launch and remembered (launch.REMEMBER_DESCRIPTORS).

    python scripts/gpu_launch_parts.py --out parts.json [--commit SHA]

Each row: the median over 5 rounds of 2000 calls, microseconds per call, one sync after each round.
"""
import argparse
import json
import statistics
import time

import torch
import triton
import triton.language as tl

from rlk_triton.bench.report import header
from rlk_triton.ops import launch


@triton.jit
def _six_pointers(a, b, c, d, e, f, n, m, x, B: tl.constexpr):
    pass


def per_call_us(fn, n=2000, rounds=5) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    report = header("cuda", "quick", ["launch"]) | {"format": "rlk-triton-launch-parts/1", "commit": args.commit,
                                                     "rows": []}
    dev = torch.cuda.current_device()
    ts = [torch.empty(1024, device="cuda") for _ in range(6)]
    ptrs = [t.data_ptr() for t in ts]
    grid = (1,)
    ck = _six_pointers[grid](*ts, 4096, 17, 0.5, B=128)
    torch.cuda.synchronize()
    cached = launch.CachedLaunch(_six_pointers)
    cached[grid](*ts, 4096, 17, 0.5, B=128)
    tail = (4096, 17, 0.5, 128)
    stream = launch.stream_handle(dev)
    c_launch = ck.run.launch
    run = ck.run

    def c_args(pointers):
        return (1, 1, 1, stream, ck.function, ck.run.launch_cooperative_grid, ck.run.launch_pdl, None, None,
                ck.packed_metadata, None, None, None, *pointers, *tail)

    with_tensors, with_ints = c_args(ts), c_args(ptrs)

    def tensors_hit():
        launch.POINTERS_AS_INTS = False
        cached[grid](*ts, 4096, 17, 0.5, B=128)
        launch.POINTERS_AS_INTS = True
    from triton.tools.tensor_descriptor import TensorDescriptor

    w = torch.empty(4096, 4096, device="cuda", dtype=torch.bfloat16)
    a = torch.empty(8, 4096, device="cuda", dtype=torch.bfloat16)
    desc = TensorDescriptor.from_tensor(w, [32, 512])
    rows = {
        "jit launch (kernel[grid](...))": lambda: _six_pointers[grid](*ts, 4096, 17, 0.5, B=128),
        "launch cache hit (addresses as ints)": lambda: cached[grid](*ts, 4096, 17, 0.5, B=128),
        "launch cache hit, tensors to the launcher": lambda: tensors_hit(),
        "compiled kernel's run, tensors": lambda: run(1, 1, 1, stream, ck.function, ck.packed_metadata, None, None,
                                                      None, *ts, *tail),
        "compiled kernel's run, addresses as ints": lambda: run(1, 1, 1, stream, ck.function, ck.packed_metadata,
                                                                None, None, None, *ptrs, *tail),
        "C launcher, tensors": lambda: c_launch(*with_tensors),
        "C launcher, addresses as ints": lambda: c_launch(*with_ints),
        "six data_ptr() calls": lambda: [t.data_ptr() for t in ts],
        "launch.signature of the six tensors and three scalars": lambda: launch.signature((*ts, 4096, 17, 0.5)),
        "launch.stream_handle": lambda: launch.stream_handle(dev),
        "torch.cuda.current_device": torch.cuda.current_device,
        "torch.empty [4096 x 4096] bf16 cuda": lambda: torch.empty((4096, 4096), dtype=torch.bfloat16, device=w.device),
        "torch.empty [0] bf16 cuda": lambda: torch.empty((0,), dtype=torch.bfloat16, device=w.device),
        "torch.empty [4096] fp32 cuda": lambda: torch.empty(4096, dtype=torch.float32, device=w.device),
        "TensorDescriptor.from_tensor": lambda: TensorDescriptor.from_tensor(w, [32, 512]),
        "launch.signature of one descriptor": lambda: launch.signature((desc,)),
    }
    from rlk_triton.ops.matmul import matmul

    a1 = a[:1].clone()  # one row: sm90's M = 1 config takes the descriptor kernel (2-16 rows: pointers)
    for remember in (False, True):
        def call(remember=remember):
            launch.REMEMBER_DESCRIPTORS = remember
            return matmul(a1, w.t())
        rows[f"matmul [1 x 4096] @ w.t(), descriptors {'remembered' if remember else 're-encoded'}"] = call
    import dataclasses

    from rlk_triton import configs
    from rlk_triton.ops.matmul import matmul_into

    tma_cfg = configs.lookup_matmul("matmul", "sm90", torch.bfloat16, rows=8, cols=4096)
    out = torch.empty(8, 4096, device="cuda", dtype=torch.bfloat16)
    for tma in (True, False):
        cfg = dataclasses.replace(tma_cfg, persistent_tma=tma)
        rows[f"matmul_into [8 x 4096] @ w.t(), out preallocated, {'descriptor' if tma else 'pointer'} kernel"] = (
            lambda cfg=cfg: matmul_into(a, w.t(), out, cfg=cfg))
    for name, fn in rows.items():
        us = per_call_us(fn)
        report["rows"].append({"part": name, "us_per_call": us})
        print(f"{name:60s} {us:8.2f} us", flush=True)
    launch.REMEMBER_DESCRIPTORS = True
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()  # where the public decode matmul's host time goes (own time per function)
    prof.enable()
    for _ in range(2000):
        matmul(a, w.t())
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
    report["matmul_profile"] = text.getvalue()[-4000:]
    print(report["matmul_profile"])
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
