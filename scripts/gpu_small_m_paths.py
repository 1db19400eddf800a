"""The small-M matmul's two kernels at decode sizes, same process: the locked config's persistent
TMA-descriptor kernel against the same tiles on pointer loads (`persistent_tma=False`): wall time per
eager call (what a rollout step pays on the host), device time (a CUDA graph: what a captured step
pays), and whether the two give the same bits. The public `matmul` call beside them.

    python scripts/gpu_small_m_paths.py --out small_m.json [--commit SHA]
"""
import argparse
import dataclasses
import json
import statistics
import time

import torch
import triton

from rlk_triton import configs
from rlk_triton._runtime import arch_of
from rlk_triton.bench.timing import graph_ms, wall_ms
from rlk_triton.ops.matmul import matmul, matmul_into


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for N, K in ((4096, 4096), (14336, 4096), (4096, 14336), (151936, 4096)):
        w = (torch.randn(N, K, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        for M in (1, 8, 16, 32, 64):
            a = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
            cfg = configs.lookup_matmul("matmul", arch_of(a.device), a.dtype, rows=M, cols=N)
            calls = {"locked": lambda cfg=cfg: matmul_into(a, w.t(), torch.empty(M, N, device="cuda", dtype=a.dtype), cfg=cfg)}
            if cfg.persistent_tma:
                ptr = dataclasses.replace(cfg, persistent_tma=False)
                calls["pointers"] = lambda ptr=ptr: matmul_into(a, w.t(), torch.empty(M, N, device="cuda", dtype=a.dtype), cfg=ptr)
            calls["public matmul"] = lambda: matmul(a, w.t())
            want = calls["locked"]()
            for name, fn in calls.items():
                got = fn()
                dev = [graph_ms(fn) for _ in range(3)]
                row = {"M": M, "N": N, "K": K, "path": name, "persistent_tma": cfg.persistent_tma,
                       "tiles": [cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages],
                       "wall_us": wall_ms(fn) * 1e3, "device_us": statistics.median(dev) * 1e3,
                       "bitwise_with_locked": bool(torch.equal(got, want))}
                rows.append(row)
                print(row, flush=True)
    with open(args.out, "w") as f:
        json.dump({"what": __doc__.splitlines()[0], "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "commit": args.commit, "date": time.strftime("%Y-%m-%d"),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
