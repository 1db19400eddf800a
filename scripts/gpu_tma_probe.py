"""Probe: a persistent, TMA-descriptor version of the matmul kernel against rlk_triton's pointer kernel
(rlk_triton/ops/matmul.py) on linear_logp's backward GEMM shapes. Two questions, one run:
  1. bitwise: same tiles, same ascending K steps, same tl.dot: is every output bit equal?
  2. speed: ms and TFLOP/s of each, cuBLAS in the same run.
Only a result of this probe decides whether the descriptor kernel enters the package.

    python scripts/gpu_tma_probe.py --out $OUT/tma_probe.json     (CUDA; --small runs anywhere)
"""
import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from rlk_triton import bench, configs  # noqa: E402
from rlk_triton.ops.matmul import grouped_tile, matmul_into, operand_flags  # noqa: E402


@triton.jit
def _tma_matmul_kernel(a_desc, b_desc, c_in_ptr, out_ptr, stride_om, M, N, K,
                       A_T: tl.constexpr, B_T: tl.constexpr, ACCUMULATE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, N_PROGS: tl.constexpr, UPCAST: tl.constexpr):
    # A_T: a_desc is over A^T [K, M] (blocks [BLOCK_K, BLOCK_M]); B_T: b_desc over B^T [N, K].
    n_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), n_tiles, N_PROGS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):  # ascending K steps, as dot_tile
            if A_T:
                a = a_desc.load([k * BLOCK_K, m0]).T
            else:
                a = a_desc.load([m0, k * BLOCK_K])
            if B_T:
                b = b_desc.load([n0, k * BLOCK_K]).T
            else:
                b = b_desc.load([k * BLOCK_K, n0])
            if UPCAST:  # the interpreter's bf16 tl.dot is wrong; fp32 operands are exact
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc)
        om = m0 + tl.arange(0, BLOCK_M)
        on = n0 + tl.arange(0, BLOCK_N)
        mask = (om < M)[:, None] & (on < N)[None, :]
        offs = om.to(tl.int64)[:, None] * stride_om + on[None, :]
        if ACCUMULATE:
            acc = tl.load(c_in_ptr + offs, mask=mask, other=0.0) + acc
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def tma_matmul(a, b, out, c_in=None, cfg=None, a_t_src=None, b_t_src=None, n_progs=None):
    """out = a @ b (+ c_in). a_t_src: a contiguous tensor whose transpose is a (A^T storage);
    b_t_src likewise for b."""
    M, K = a.shape
    N = b.shape[1]
    cfg = cfg or configs.lookup_matmul("matmul", "sm90", a.dtype)
    BM, BN, BK = cfg.block_m, cfg.block_n, cfg.block_k
    if a_t_src is not None:
        a_desc = TensorDescriptor.from_tensor(a_t_src, [BK, BM])
    else:
        a_desc = TensorDescriptor.from_tensor(a, [BM, BK])
    if b_t_src is not None:
        b_desc = TensorDescriptor.from_tensor(b_t_src, [BN, BK])
    else:
        b_desc = TensorDescriptor.from_tensor(b, [BK, BN])
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    n_progs = n_progs or min(tiles, torch.cuda.get_device_properties(0).multi_processor_count
                             if torch.cuda.is_available() else 4)
    _tma_matmul_kernel[(n_progs,)](
        a_desc, b_desc, c_in if c_in is not None else out, out, out.stride(0), M, N, K,
        A_T=a_t_src is not None, B_T=b_t_src is not None, ACCUMULATE=c_in is not None,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=cfg.group_m, N_PROGS=n_progs, UPCAST=operand_flags(a.dtype)[0],
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    small = args.small or dev == "cpu"
    N, H, C = (256, 128, 256) if small else (8192, 4096, 4096)
    dt = torch.bfloat16
    cfg = configs.lookup_matmul("matmul", "sm90" if dev == "cuda" else "interpreter", dt)
    if small:
        cfg = configs.MatmulConfig(64, 64, 32, cfg.group_m, 4, 2) if dev == "cuda" else \
            configs.lookup_matmul("matmul", "interpreter", dt)
    g = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(N, H, device=dev, generator=g).to(dt)
    w = (0.02 * torch.randn(C, H, device=dev, generator=g)).to(dt)
    d = (1e-4 * torch.randn(N, C, device=dev, generator=g)).to(dt)
    acc0 = torch.randn(N, H, device=dev, generator=g)
    rows = []

    def record(name, fn_ref, fn_tma, fn_blas, flops):
        t0 = time.time()
        row = {"name": name}
        try:
            ref, ours = fn_ref(), fn_tma()
            row["bitwise"] = bool(torch.equal(ref, ours))
            row["max_abs_diff"] = float((ref.float() - ours.float()).abs().max())
            if dev == "cuda" and not small:
                for label, fn in (("pointer", fn_ref), ("tma_persistent", fn_tma), ("cublas", fn_blas)):
                    ms = bench.median_ms(fn, rep_ms=200, warmup_ms=50)
                    row[f"{label}_ms"] = round(ms, 4)
                    row[f"{label}_tflops"] = round(flops / ms / 1e9, 1)
        except Exception as ex:  # noqa: BLE001 - recorded, the probe goes on
            row["error"] = f"{type(ex).__name__}: {ex}"
            row["trace"] = traceback.format_exc()[-1500:]
        row["wall_s"] = round(time.time() - t0, 2)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "trace"}), flush=True)

    out_h = torch.empty(N, H, device=dev)
    out_h2 = torch.empty(N, H, device=dev)
    # dH step: acc + d @ W_chunk   (A row-major, B row-major, fp32 accumulator in / out)
    record("dH: acc + d[N,C] @ W[C,H]",
           lambda: matmul_into(d, w, out_h, c_in=acc0, cfg=cfg),
           lambda: tma_matmul(d, w, out_h2, c_in=acc0, cfg=cfg),
           lambda: torch.addmm(acc0, d.float(), w.float()) if small else torch.mm(d, w),
           2.0 * N * H * C)
    gw1 = torch.empty(C, H, device=dev, dtype=dt)
    gw2 = torch.empty(C, H, device=dev, dtype=dt)
    # dW chunk: d^T @ h   (A = d^T: descriptor over d, transposed tiles)
    record("dW: d[N,C]^T @ h[N,H]",
           lambda: matmul_into(d.t(), h, gw1, cfg=cfg),
           lambda: tma_matmul(d.t(), h, gw2, cfg=cfg, a_t_src=d),
           lambda: torch.mm(d.t(), h),
           2.0 * N * H * C)
    lg1 = torch.empty(N, C, device=dev, dtype=dt)
    lg2 = torch.empty(N, C, device=dev, dtype=dt)
    # logits chunk: h @ W^T   (B = W^T: descriptor over W, transposed tiles)
    record("logits: h[N,H] @ W[C,H]^T",
           lambda: matmul_into(h, w.t(), lg1, cfg=cfg),
           lambda: tma_matmul(h, w.t(), lg2, cfg=cfg, b_t_src=w),
           lambda: torch.mm(h, w.t()),
           2.0 * N * H * C)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu (interpreter)",
                       "torch": torch.__version__, "triton": triton.__version__, "shape": [N, H, C],
                       "config": dataclasses.astuple(cfg), "rows": rows}, f, indent=1)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
