"""linear_logp's GEMM paths on a GPU, in one run: which loading / scheduling path each fused kernel
should lock.

  python scripts/gpu_linear_logp_paths.py --out report.json [--commit SHA] [--bound]

At the benchmark shape (N=8192, H=4096, V=151936 bf16) it times, against the locked table:
  - the forward (tile_stats) on pointer kernels and persistent descriptors;
  - d hidden's chunk GEMM (matmul_into with an fp32 accumulator) on pointers and descriptors;
  - fwd+bwd on descriptors, with the extra peak memory (the issue's budget: 0.25 GiB);
  - a per-kernel breakdown (torch.profiler) of one fwd+bwd on the locked table;
  - with --bound, the lower bound of any exact fused backward here: the four GEMM-sized products
    (logits twice, d hidden, d weight) on cuBLAS (torch.matmul), unfused;
  - then the issue's benchmark (logp, fwd and fwd+bwd) on the fastest bitwise-verified choice
    against torch eager in the same run (the "chosen" rows; lock that choice in configs.py).
Every path must give bitwise the same logp, entropy, d hidden and d weight as the pointer kernels
(the paths change loading and scheduling, never a tile's K order): a row records
`bitwise_vs_pointer`, and a path that differs must not be locked.
"""
import argparse
import dataclasses
import datetime
import json
import platform
import sys
import time
import traceback

import torch
import triton

from rlk_triton import bench, configs
from rlk_triton.logp import linear_logp
from rlk_triton.ops import linear_logp as op
from rlk_triton.ops.matmul import matmul_into

from gpu_linear_logp import inputs  # the benchmark's inputs (scripts/ is on sys.path when run as a script)

N, H, V = 8192, 4096, 151936
DT = torch.bfloat16
FLOPS = 2 * N * H * V  # one GEMM of the op
PATHS = {"pointer": dict(persistent_tma=False), "descriptor": dict(persistent_tma=True)}
report = {"rows": [], "errors": []}


def log(*a):
    print(*a, flush=True)
    sys.stdout.flush()


def key(kernel):
    return (kernel, "sm90", "bfloat16", "any")


LOCKED = {k: configs.LOCKED_CONFIGS[key(k)] for k in ("linear_logp_fwd", "linear_logp_dlogits", "linear_logp_dhidden")}


def use(fwd=None, dlogits=None, dhidden=None, chunk_v=None):
    """Set the three rows to the locked ones with the given paths (and chunk_v) swapped in."""
    for kernel, path in (("linear_logp_fwd", fwd), ("linear_logp_dlogits", dlogits), ("linear_logp_dhidden", dhidden)):
        cfg = LOCKED[kernel]
        if path is not None:
            cfg = dataclasses.replace(cfg, **PATHS[path])
        if kernel == "linear_logp_dlogits" and chunk_v is not None:
            cfg = dataclasses.replace(cfg, chunk_v=chunk_v)
        configs.LOCKED_CONFIGS[key(kernel)] = cfg


def run_row(name, fn, flops, check=None):
    row = {"name": name}
    try:
        row["ms"] = round(bench.median_ms(fn, rep_ms=400), 3)
        row["tflops"] = round(flops / row["ms"] / 1e9, 1)
        row["peak_extra_gib"] = round(bench.peak_extra_gib(fn), 3)
        if check is not None:
            row["bitwise_vs_pointer"] = check()
    except Exception as ex:  # noqa: BLE001 - a path that fails to build is a result
        row["error"] = f"{type(ex).__name__}: {str(ex)[:400]}"
    report["rows"].append(row)
    log(row)
    save()  # after every row: a run stopped by its time limit still leaves its measurements
    return row


def save():
    if report.get("out"):
        with open(report["out"], "w") as f:
            json.dump(report, f, indent=1)


def choose_and_compare(h, w, t, gr, hl, wl):
    """The fastest fwd+bwd row that is bitwise the pointer kernels' and within the memory budget, then
    the issue's benchmark (logp only) on it against torch eager in this same run."""
    ok = [r for r in report["rows"] if r["name"].startswith("fwd+bwd") and r.get("bitwise_vs_pointer")
          and r.get("peak_extra_gib", 1.0) <= 0.25]
    fwd_ok = [r for r in report["rows"] if r["name"].startswith("fwd tile_stats") and r.get("bitwise_vs_pointer")]
    if not ok or not fwd_ok:
        log("no bitwise-verified row to choose from")
        return
    best = min(ok, key=lambda r: r["ms"])
    best_fwd = min(fwd_ok, key=lambda r: r["ms"])
    name = best["name"]
    chunk_v = int(name.split("chunk_v=")[1].split()[0])
    dl = name.split("d logits [")[1].split("]")[0]
    dh = name.split("d hidden [")[1].split("]")[0]
    fwd = best_fwd["name"].split("[")[1].rstrip("]")
    use(fwd=fwd, dlogits=dl, dhidden=dh, chunk_v=chunk_v)
    report["chosen"] = {"fwd": fwd, "dlogits": dl, "dhidden": dh, "chunk_v": chunk_v}
    log("chosen", report["chosen"])

    def zero():
        hl.grad = wl.grad = None

    def ours_fb():
        zero()
        (linear_logp(hl, wl, t, validate=False) * gr).sum().backward()

    def torch_fb():
        zero()
        lp = torch.log_softmax((hl @ wl.T).float(), -1).gather(-1, t[:, None]).squeeze(-1)
        (lp * gr).sum().backward()

    run_row("chosen: rlk_triton linear_logp fwd", lambda: linear_logp(h, w, t, validate=False), FLOPS)
    run_row("chosen: rlk_triton linear_logp fwd+bwd", ours_fb, 4 * FLOPS)
    run_row("torch eager fwd", lambda: torch.log_softmax((h @ w.T).float(), -1).gather(-1, t[:, None]), FLOPS)
    run_row("torch eager fwd+bwd", torch_fb, 3 * FLOPS)


def kernel_breakdown(name, fn):
    """ms per kernel name (summed over launches) in one call of fn, from torch.profiler's CUDA trace."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    per = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us and e.count:
            per[e.key[:80]] = {"ms": round(us / 1e3, 3), "launches": e.count}
    per = dict(sorted(per.items(), key=lambda kv: -kv[1]["ms"])[:12])
    row = {"name": name, "kernels": per}
    report.setdefault("breakdown", []).append(row)
    log(row)
    save()


def cublas_bound(h, w):
    """The four GEMM-sized products of an exact backward that keeps no logits, on cuBLAS, unfused:
    logits (forward and its recomputation), d hidden = d_logits @ W, d weight = d_logits^T @ hidden."""
    d = (torch.randn(N, V, device="cuda") * 1e-4).to(DT)  # 2.3 GiB: a bound, not a fused kernel
    rows = {"logits h @ W^T": lambda: h @ w.T, "d hidden d @ W": lambda: d @ w, "d weight d^T @ h": lambda: d.T @ h}
    total = 0.0
    for name, fn in rows.items():
        r = run_row(f"cuBLAS {name}", fn, FLOPS)
        total += r.get("ms", float("nan")) * (2 if name.startswith("logits") else 1)
    report["cublas_four_gemm_ms"] = round(total, 3)
    log("cuBLAS four-GEMM bound", total)
    del d
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--bound", action="store_true", help="also time the cuBLAS four-GEMM bound")
    args = ap.parse_args()
    report.update(out=args.out, device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  python=platform.python_version(), commit=args.commit, date=datetime.date.today().isoformat(),
                  shape={"N": N, "H": H, "V": V, "dtype": "bfloat16"},
                  locked={k: dataclasses.asdict(v) for k, v in LOCKED.items()})
    t0 = time.time()
    h, w, t, gr = inputs()
    hl, wl = h.detach().requires_grad_(), w.detach().requires_grad_()
    tl_local = op.local_targets(t, 0, V, -100)

    def fwd_bwd():
        hl.grad = wl.grad = None
        lp, ent = linear_logp(hl, wl, t, validate=False, return_entropy=True)
        (lp * gr + ent * gr).sum().backward()
        return lp, ent, hl.grad, wl.grad

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(a, b))

    try:
        # forward alone, on each path
        use(fwd="pointer")
        ref_stats = op.tile_stats(h, w, None, tl_local, 1.0, True).clone()
        for path in ("pointer", "descriptor"):
            use(fwd=path)
            run_row(f"fwd tile_stats [{path}]", lambda: op.tile_stats(h, w, None, tl_local, 1.0, True), FLOPS,
                    lambda: torch.equal(op.tile_stats(h, w, None, tl_local, 1.0, True), ref_stats))
        use()
        del ref_stats
        # d hidden's chunk GEMM alone: [N, 4096] @ W[:4096] into an fp32 accumulator
        C = 4096
        d = (torch.randn(N, C, device="cuda") * 1e-3).to(DT)
        acc0 = torch.randn(N, H, device="cuda")
        ref = matmul_into(d, w[:C], torch.empty_like(acc0), c_in=acc0,
                          cfg=dataclasses.replace(LOCKED["linear_logp_dhidden"], **PATHS["pointer"]))
        for path in PATHS:
            cfg = dataclasses.replace(LOCKED["linear_logp_dhidden"], **PATHS[path])
            out = torch.empty_like(acc0)
            run_row(f"d hidden chunk GEMM [{path}]", lambda: matmul_into(d, w[:C], out, c_in=acc0, cfg=cfg),
                    2 * N * H * C, lambda: torch.equal(matmul_into(d, w[:C], out, c_in=acc0, cfg=cfg), ref))
        del d, acc0, ref, out
        torch.cuda.empty_cache()
        # fwd+bwd on descriptors against the pointer kernels
        chunk_v = LOCKED["linear_logp_dlogits"].chunk_v
        use(fwd="pointer", dlogits="pointer", dhidden="pointer", chunk_v=chunk_v)
        ref_out = [x.clone() for x in fwd_bwd()]
        use(dlogits="descriptor", dhidden="descriptor", chunk_v=chunk_v)
        run_row(f"fwd+bwd (+entropy) chunk_v={chunk_v} fwd [locked] d logits [descriptor] d hidden [descriptor]",
                fwd_bwd, 4 * FLOPS, lambda: same(fwd_bwd(), ref_out))
        del ref_out
        torch.cuda.empty_cache()
        use()
        kernel_breakdown("locked", fwd_bwd)
        if args.bound:
            cublas_bound(h, w)
        choose_and_compare(h, w, t, gr, hl, wl)
        use()
    except Exception:  # noqa: BLE001
        report["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
    report["seconds"] = round(time.time() - t0, 1)
    save()


if __name__ == "__main__":
    main()
