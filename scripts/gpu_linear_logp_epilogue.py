"""What linear_logp's fused epilogues cost: its two logits-GEMM kernels against cuBLAS's logits GEMM,
with the locked epilogue and with a stripped one, each bracketed by cuBLAS in the same process.

    python scripts/gpu_linear_logp_epilogue.py --out epi.json --commit <sha> [--shapes NxHxV ...] [--bracket K]

Kernels timed (CUDA-graph device time, whole vocab in one launch):
- fwd: `_tile_stats_kernel` (logits tile + online softmax state, no entropy: the benchmark's step);
- dlogits: `_dlogits_kernel` over the whole vocab as one chunk (logits tile + d logits, stored in bf16);
- cublas: torch.matmul(hidden, weight.T, out=[N, V] bf16), the bound's logits GEMM.
Variants, each in its own process (the kernels resolve their helpers when first compiled):
- locked: the library's kernels as they are;
- bm64 / bm64x2: the locked epilogue on 64 x 256 tiles of one warpgroup with 2 stages (254 registers,
  82-90 KB of shared memory: two programs fit an SM), one or two persistent programs an SM. The tiles'
  rows do not change a logit's bits (gpu_linear_logp.py --tile-sweep checks that in the operator);
  two programs an SM let the warp scheduler run one program's epilogue beside the other's MMAs.
- stripped: `online_softmax_rows` keeps only the row max (no exp2, no sums) and `_dlogits_piece` stores
  z itself (a plain GEMM epilogue, as cuBLAS's). The GEMM, its tiles, loads and the persistent loop are
  unchanged, so locked - stripped is the time the softmax epilogue adds to each kernel.
The stripped kernels compute nothing the library uses; they exist only in that child process.
"""
import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from functools import partial

import torch
import triton
import triton.language as tl

SHAPES = ("16384x2048x128256", "8192x4096x151936", "1024x4096x151936")


@triton.jit
def _max_only(x, m, s, t, WITH_ENTROPY: tl.constexpr):
    """online_softmax_rows stripped to the row max."""
    return tl.maximum(m, tl.max(x, 1)), s, t


@triton.jit
def _store_z(z, rm, local, c0, row_max, row_logsum, g, target, ge, ent, inv_t, N, chunk_width,
             d_ptr, stride_dn, dbias_part_ptr, stride_pb, pid_m,
             HAS_BIAS: tl.constexpr, WITH_ENTROPY_GRAD: tl.constexpr):
    """_dlogits_piece stripped to a GEMM's epilogue: the logits stored."""
    ok = (rm < N)[:, None] & (local < chunk_width)[None, :]
    tl.store(d_ptr + rm.to(tl.int64)[:, None] * stride_dn + local[None, :], z.to(d_ptr.dtype.element_ty), mask=ok)


def child(variant: str, shape: str, k: int) -> dict:
    from rlk_triton import bench
    from rlk_triton.bench.timing import bracketed_ratios, cpu_ms
    from rlk_triton.ops import linear_logp as ll
    from rlk_triton.ops.matmul import operand_flags

    if variant == "stripped":  # before the first launch: the kernels resolve these when compiled
        ll.online_softmax_rows, ll._dlogits_piece = _max_only, _store_z
    if variant.startswith("bm64"):  # one warpgroup on 64 x 256 tiles, 2 stages: 82-90 KB of shared memory
        locked_config, locked_programs = ll.tile_config, ll._programs
        ll.tile_config = lambda kernel, hidden: dataclasses.replace(
            locked_config(kernel, hidden), block_m=64, num_warps=4, num_stages=2)
        if variant == "bm64x2":  # and two programs an SM: one's epilogue beside the other's MMAs
            ll._programs = lambda desc, device, n: min(n, 2 * locked_programs(desc, device, 1 << 30))
    N, H, V = (int(x) for x in shape.split("x"))
    dev, dt = torch.device("cuda" if torch.cuda.is_available() else "cpu"), torch.bfloat16  # cpu: a smoke run
    g = torch.Generator(device=dev).manual_seed(0)
    hidden = torch.randn(N, H, device=dev, generator=g).to(dt)
    weight = (torch.randn(V, H, device=dev, generator=g) * H ** -0.5).to(dt)
    target = torch.randint(0, V, (N,), device=dev, generator=g, dtype=torch.int32)  # as local_targets gives
    out = torch.empty(N, V, device=dev, dtype=dt)
    stats = ll.tile_stats(hidden, weight, None, target, 1.0, False)
    row_max, row_logsum = stats[0].amax(0), torch.full((N,), 12.0, device=dev)
    grad = torch.ones(N, device=dev)
    cfg = ll.tile_config("linear_logp_dlogits", hidden)
    upcast, ieee = operand_flags(dt)
    x_desc, w_desc, desc = ll._operands(cfg, hidden, weight)
    n_progs = ll._programs(desc, dev, ll.cdiv(N, cfg.block_m) * ll.cdiv(V, cfg.block_n))

    def dlogits():
        ll._dlogits_kernel[(n_progs,)](
            hidden, hidden.stride(0), weight, weight.stride(0), x_desc, w_desc, weight, target, row_max, row_logsum,
            row_max, grad, grad, out, out.stride(0), row_max, 0, N, H, V, 0, V, 1.0, n_progs,
            HAS_BIAS=False, WITH_ENTROPY_GRAD=False, UPCAST=upcast, IEEE=ieee, EVEN_K=H % cfg.block_k == 0,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, DESC=desc,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    cublas = partial(torch.matmul, hidden, weight.t(), out=out)
    timer = partial(bench.graph_ms, reps=3) if dev.type == "cuda" else partial(cpu_ms, n=1)
    kernels = {"fwd": lambda: ll.tile_stats(hidden, weight, None, target, 1.0, False), "dlogits": dlogits}
    row = {"variant": variant, "shape": shape, "desc": desc}
    dlogits()  # stripped: the logits themselves, so a small difference from cuBLAS's shows the swap took
    ref = torch.matmul(hidden, weight.t())
    row["dlogits_out_max_abs_vs_cublas_logits"] = (out - ref).abs().max().item()
    # the bits of both kernels' outputs, to compare across the variants' processes (bm64* = locked)
    def bits(t):
        return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()[:16]
    row["sha256"] = {"fwd": bits(kernels["fwd"]()), "dlogits": bits(out.view(torch.int16))}
    del ref
    for name, fn in kernels.items():
        r = bracketed_ratios(fn, cublas, k, timer)
        row[name] = {"cublas_over_ours_median": r["median"], "min": r["min"], "max": r["max"],
                     "ours_ms": r["fn_ms"], "cublas_ms": r["baseline_ms"]}
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--bracket", type=int, default=3)
    ap.add_argument("--variants", nargs="*", default=["locked", "stripped"],
                    choices=["locked", "stripped", "bm64", "bm64x2"])
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "SHAPE"))
    args = ap.parse_args()
    if args.child:
        print("ROW " + json.dumps(child(args.child[0], args.child[1], args.bracket)), flush=True)
        return
    report = {"what": "linear_logp's fused logits-GEMM kernels with the locked epilogue and a stripped one "
                      "(row max only / a plain store), each bracketed by cuBLAS's logits GEMM in its process",
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "triton": triton.__version__,
              "commit": args.commit, "date": time.strftime("%Y-%m-%d"), "script": "scripts/gpu_linear_logp_epilogue.py",
              "rows": []}
    for shape in args.shapes:
        for variant in args.variants:
            p = subprocess.run([sys.executable, __file__, "--child", variant, shape, "--bracket", str(args.bracket)],
                               capture_output=True, text=True, env=os.environ)
            rows = [json.loads(line[4:]) for line in p.stdout.splitlines() if line.startswith("ROW ")]
            if not rows:
                print(f"{variant} {shape}: no row (exit {p.returncode})\n{p.stderr[-2000:]}", flush=True)
                continue
            row = rows[0]
            report["rows"].append(row)
            print(shape, variant, {k: round(row[k]["cublas_over_ours_median"], 4) for k in ("fwd", "dlogits")},
                  {k: round(min(row[k]["ours_ms"]), 3) for k in ("fwd", "dlogits")},
                  "cublas", round(min(row["fwd"]["cublas_ms"]), 3), row["sha256"], flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
