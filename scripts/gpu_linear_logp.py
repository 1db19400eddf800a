"""linear_logp and the batch-invariant matmul on a GPU: config sweep, benchmark, competitors.

  python scripts/gpu_linear_logp.py --out report.json [--sweep] [--commit SHA]

--sweep times candidate tiles of each tl.dot kernel at the benchmark shape (N=8192, H=4096,
V=151936 bf16) and uses the fastest for the rest of the run (the report names them; the locked
table in rlk_triton/configs.py is edited by hand from it). The benchmark runs, in one process:
rlk_triton fwd and fwd+bwd, torch eager (matmul + log_softmax + gather), Liger fused linear cross
entropy and Cut Cross-Entropy (exact and default filtering) when installed, with time, extra peak
memory and the logp error on 64 rows against float64; the matmul against torch.matmul (cuBLAS)
at 8192^3 and LLM shapes on both loading paths, with a bitwise batch-invariance check of its rows;
and fwd+bwd against torch eager at other LM-head shapes (SHAPES).
"""
import argparse
import datetime
import json
import platform
import sys
import time
import traceback

import torch
import triton

from rlk_triton import bench, configs
from rlk_triton.configs import MatmulConfig

torch.backends.cuda.matmul.allow_tf32 = False
N, H, V = 8192, 4096, 151936
DT = torch.bfloat16
report = {"rows": [], "sweep": [], "errors": []}


def log(*a):
    print(*a, flush=True)
    sys.stdout.flush()


def peak(fn):
    return bench.peak_extra_gib(fn)


def inputs(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = (torch.randn(N, H, device="cuda", generator=g) * 0.5).to(DT)
    w = (torch.randn(V, H, device="cuda", generator=g) * 0.02).to(DT)
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    gr = torch.randn(N, device="cuda", generator=g)
    return h, w, t, gr


def set_cfg(kernel, cfg):
    configs.LOCKED_CONFIGS[(kernel, "sm90", "bfloat16", "any")] = cfg


def sweep(h, w, t, gr):
    from rlk_triton.ops import linear_logp as op
    from rlk_triton.ops.matmul import matmul_into

    cands = [MatmulConfig(128, 256, 64, 8, 8, 3), MatmulConfig(128, 128, 64, 8, 4, 4),
             MatmulConfig(128, 128, 64, 8, 8, 3), MatmulConfig(256, 128, 64, 8, 8, 3),
             MatmulConfig(128, 256, 64, 8, 8, 4), MatmulConfig(128, 256, 64, 16, 8, 3),
             MatmulConfig(128, 128, 128, 8, 8, 3)]
    best = {}
    tl_local = op.local_targets(t, 0, V, -100)
    # forward chunk states
    for c in cands:
        cfg = c
        set_cfg("linear_logp_fwd", cfg)
        try:
            ms = bench.median_ms(lambda: op.tile_stats(h, w, None, tl_local, 1.0, False))
            ms_e = bench.median_ms(lambda: op.tile_stats(h, w, None, tl_local, 1.0, True))
            tflops = 2 * N * H * V / ms / 1e9
            row = {"kernel": "linear_logp_fwd", "cfg": cfg.__dict__, "ms": ms, "ms_entropy": ms_e, "tflops": tflops}
        except Exception as ex:  # noqa: BLE001
            row = {"kernel": "linear_logp_fwd", "cfg": cfg.__dict__, "error": str(ex)[:300]}
        report["sweep"].append(row)
        log(row)
        if "ms" in row and row["ms"] < best.get("linear_logp_fwd", (1e9, None))[0]:
            best["linear_logp_fwd"] = (row["ms"], cfg)
    set_cfg("linear_logp_fwd", best["linear_logp_fwd"][1])
    # backward pieces on one chunk: d logits, d weight, d hidden
    logp, ent, m, ls = op.merge(op.tile_stats(h, w, None, tl_local, 1.0, True), t, -100, True)
    C = 4096
    d = torch.empty(N, C, dtype=DT, device="cuda")
    upcast, ieee = False, False
    for c in cands[:2]:  # the first session's sweep: 128 x 256 x 64, 8 warps led by 10-25%
        cfg = MatmulConfig(c.block_m, c.block_n, c.block_k, c.group_m, c.num_warps, c.num_stages, chunk_v=C)
        try:
            def dl():
                grid = triton.cdiv(N, cfg.block_m) * triton.cdiv(C, cfg.block_n)
                op._dlogits_kernel[(grid,)](  # the pointer path: one program per tile
                    h, h.stride(0), w, w.stride(0), h, w, w, tl_local, m, ls, ent, gr, gr, d, d.stride(0), m, 0,
                    N, H, V, 0, C, 1.0, grid, HAS_BIAS=False, WITH_ENTROPY_GRAD=True, UPCAST=upcast, IEEE=ieee,
                    EVEN_K=True, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                    GROUP_M=cfg.group_m, DESC=False, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
            ms = bench.median_ms(dl)
            row = {"kernel": "linear_logp_dlogits", "cfg": cfg.__dict__, "ms_per_chunk": ms,
                   "tflops": 2 * N * H * C / ms / 1e9}
        except Exception as ex:  # noqa: BLE001
            row = {"kernel": "linear_logp_dlogits", "cfg": cfg.__dict__, "error": str(ex)[:300]}
        report["sweep"].append(row)
        log(row)
        if "ms_per_chunk" in row and row["ms_per_chunk"] < best.get("linear_logp_dlogits", (1e9, None))[0]:
            best["linear_logp_dlogits"] = (row["ms_per_chunk"], cfg)
    set_cfg("linear_logp_dlogits", best["linear_logp_dlogits"][1])
    dw = torch.empty(C, H, dtype=DT, device="cuda")
    acc = torch.zeros(N, H, dtype=torch.float32, device="cuda")
    for c in cands[:2]:
        try:
            ms_w = bench.median_ms(lambda: matmul_into(d.t(), h, dw, cfg=c))
            ms_h = bench.median_ms(lambda: matmul_into(d, w[:C], acc, c_in=acc, cfg=c))
            a = torch.randn(8192, 8192, device="cuda", dtype=DT)
            b = torch.randn(8192, 8192, device="cuda", dtype=DT)
            o = torch.empty(8192, 8192, device="cuda", dtype=DT)
            ms_sq = bench.median_ms(lambda: matmul_into(a, b, o, cfg=c))
            row = {"kernel": "matmul", "cfg": c.__dict__, "ms_dw_chunk": ms_w, "ms_dh_chunk": ms_h,
                   "tflops_dw": 2 * N * H * C / ms_w / 1e9, "tflops_dh": 2 * N * H * C / ms_h / 1e9,
                   "tflops_8192": 2 * 8192**3 / ms_sq / 1e9}
            del a, b, o
        except Exception as ex:  # noqa: BLE001
            row = {"kernel": "matmul", "cfg": c.__dict__, "error": str(ex)[:300]}
        report["sweep"].append(row)
        log(row)
        if "ms_dw_chunk" in row:
            tot = row["ms_dw_chunk"] + row["ms_dh_chunk"]
            if tot < best.get("matmul", (1e9, None))[0]:
                best["matmul"] = (tot, c)
    set_cfg("matmul", best["matmul"][1])
    report["chosen"] = {k: v[1].__dict__ for k, v in best.items()}
    log("chosen", report["chosen"])


def record(name, fn, flops=None, error_fn=None):
    try:
        ms = bench.median_ms(fn, rep_ms=500)
        gib = peak(fn)
        row = {"name": name, "ms": round(ms, 3), "peak_extra_gib": round(gib, 3)}
        if flops:
            row["tflops"] = round(flops / ms / 1e9, 1)
        if error_fn:
            row["max_abs_err_logp_vs_fp64"] = error_fn()
    except Exception as ex:  # noqa: BLE001
        row = {"name": name, "error": f"{type(ex).__name__}: {str(ex)[:300]}"}
    report["rows"].append(row)
    log(row)
    return row


def benchmark(h, w, t, gr, competitors=True):
    from rlk_triton.logp import linear_logp

    hl = h.detach().requires_grad_()
    wl = w.detach().requires_grad_()
    rows64 = torch.arange(0, N, N // 64, device="cuda")
    logits64 = h[rows64].double() @ w.double().T
    ref = torch.log_softmax(logits64, -1).gather(-1, t[rows64, None]).squeeze(-1)

    def err(lp):
        return float((lp[rows64].double() - ref).abs().max())

    def zero():
        hl.grad = None
        wl.grad = None

    def ours_fwd():
        return linear_logp(h, w, t, validate=False)

    def ours_fb(entropy=False):
        zero()
        if entropy:
            lp, ent = linear_logp(hl, wl, t, validate=False, return_entropy=True)
            (lp * gr + ent * gr).sum().backward()
        else:
            lp = linear_logp(hl, wl, t, validate=False)
            (lp * gr).sum().backward()

    fwd_flops = 2 * N * H * V
    record("rlk_triton linear_logp fwd", ours_fwd, fwd_flops, lambda: err(ours_fwd()))
    record("rlk_triton linear_logp fwd+bwd", ours_fb, 4 * fwd_flops)
    record("rlk_triton linear_logp fwd+bwd (+entropy)", lambda: ours_fb(True), 4 * fwd_flops)
    record("rlk_triton linear_logp fwd (validate=True)", lambda: linear_logp(h, w, t), fwd_flops)
    # the same op with every fused GEMM on the pointer kernels, then on the descriptor kernels
    # (persistent_tma off / on for all three; the locked table may mix): each path's gain, same run
    import dataclasses
    keys = [(kernel, "sm90", "bfloat16", "any")
            for kernel in ("linear_logp_fwd", "linear_logp_dlogits", "linear_logp_dhidden")]
    saved = {key: configs.LOCKED_CONFIGS[key] for key in keys}
    for flag, label in ((False, "pointer kernels"), (True, "descriptor kernels")):
        for key in keys:
            configs.LOCKED_CONFIGS[key] = dataclasses.replace(saved[key], persistent_tma=flag)
        record(f"rlk_triton linear_logp fwd ({label})", ours_fwd, fwd_flops)
        record(f"rlk_triton linear_logp fwd+bwd ({label})", ours_fb, 4 * fwd_flops)
    configs.LOCKED_CONFIGS.update(saved)

    def torch_fwd():
        return torch.log_softmax((h @ w.T).float(), -1).gather(-1, t[:, None]).squeeze(-1)

    def torch_fb():
        zero()
        lp = torch.log_softmax((hl @ wl.T).float(), -1).gather(-1, t[:, None]).squeeze(-1)
        (lp * gr).sum().backward()

    record("torch eager fwd", torch_fwd, fwd_flops, lambda: err(torch_fwd()))
    record("torch eager fwd+bwd", torch_fb, 3 * fwd_flops)
    if not competitors:
        return
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        flce = LigerFusedLinearCrossEntropyLoss(reduction="none")

        def liger_fb():
            zero()
            (-flce(wl, hl, t) * gr).sum().backward()

        record("liger FLCE none fwd+bwd", liger_fb, 3 * fwd_flops)
    except Exception as ex:  # noqa: BLE001
        report["rows"].append({"name": "liger FLCE", "error": str(ex)[:300]})
    try:
        from cut_cross_entropy import linear_cross_entropy

        for eps in (None, "high"):
            def cce_fb(eps=eps):
                zero()
                (-linear_cross_entropy(hl, wl, t, reduction="none", filter_eps=eps) * gr).sum().backward()

            record(f"CCE none fwd+bwd filter_eps={eps}", cce_fb, 4 * fwd_flops)
        record("CCE fwd", lambda: -linear_cross_entropy(h, w, t, reduction="none"), fwd_flops,
               lambda: err(-linear_cross_entropy(h, w, t, reduction="none")))
    except Exception as ex:  # noqa: BLE001
        report["rows"].append({"name": "CCE", "error": str(ex)[:300]})


def matmul_bench():
    """The matmul against torch.matmul (cuBLAS), on the locked path and on the other one (pointer /
    persistent descriptors), with the two paths' outputs compared bitwise; b as a row-major [K, N]
    and as a linear layer's weight.t()."""
    import dataclasses

    from rlk_triton.ops.matmul import matmul_into

    locked = configs.lookup_matmul("matmul", "sm90", DT)
    other = dataclasses.replace(locked, persistent_tma=not locked.persistent_tma)
    other_name = "descriptor" if other.persistent_tma else "pointer"
    out = []
    for (m, n, k) in ((8192, 8192, 8192), (16384, 4096, 4096), (16384, 14336, 4096), (16384, 4096, 14336),
                      (8192, 151936, 4096)):
        for layout in ("b [K, N]", "b = weight.t()"):
            try:
                a = torch.randn(m, k, device="cuda", dtype=DT)
                b = torch.randn(k, n, device="cuda", dtype=DT)
                if layout != "b [K, N]":
                    b = b.t().contiguous().t()
                o = torch.empty(m, n, device="cuda", dtype=DT)
                o2 = torch.empty_like(o)
                ms_ours = bench.median_ms(lambda: matmul_into(a, b, o))
                ms_other = bench.median_ms(lambda: matmul_into(a, b, o2, cfg=other))
                ms_cublas = bench.median_ms(lambda: torch.matmul(a, b))
                # rows of a 7-row batch equal the same rows in the full batch, bitwise
                small = torch.empty(7, n, device="cuda", dtype=DT)
                matmul_into(a[100:107], b, small)
                matmul_into(a, b, o)
                matmul_into(a, b, o2, cfg=other)
                inv = bool(torch.equal(small, o[100:107]))
                row = {"shape": [m, n, k], "layout": layout, "ms": ms_ours, "ms_cublas": ms_cublas,
                       "ratio_vs_cublas": ms_cublas / ms_ours, "tflops": 2 * m * n * k / ms_ours / 1e9,
                       "row_invariant_7_vs_full": inv, f"ms_{other_name}": ms_other,
                       f"ratio_vs_cublas_{other_name}": ms_cublas / ms_other,
                       f"{other_name}_bitwise_equal": bool(torch.equal(o, o2))}
                del a, b, o, o2
            except Exception as ex:  # noqa: BLE001
                row = {"shape": [m, n, k], "layout": layout, "error": str(ex)[:300]}
            out.append(row)
            log(row)
            torch.cuda.empty_cache()
    report["matmul"] = out


# Other LM-head shapes an RL trainer runs (tokens, hidden, vocab): fwd+bwd against torch eager, and
# from a CUDA graph (the GPU work alone: a small micro-batch may be bound by the host's launches).
SHAPES = ((1024, 4096, 151936), (4096, 4096, 151936), (16384, 4096, 151936), (8192, 8192, 128256),
          (8192, 2048, 32000))


def shapes_bench():
    from rlk_triton.logp import linear_logp

    out = []
    for n, hd, v in SHAPES:
        try:
            g = torch.Generator(device="cuda").manual_seed(1)
            hl = (torch.randn(n, hd, device="cuda", generator=g) * 0.5).to(DT).requires_grad_()
            wl = (torch.randn(v, hd, device="cuda", generator=g) * 0.02).to(DT).requires_grad_()
            t = torch.randint(0, v, (n,), device="cuda", generator=g)
            gr = torch.randn(n, device="cuda", generator=g)

            def ours():
                hl.grad = wl.grad = None
                (linear_logp(hl, wl, t, validate=False) * gr).sum().backward()

            def eager():
                hl.grad = wl.grad = None
                lp = torch.log_softmax((hl @ wl.T).float(), -1).gather(-1, t[:, None]).squeeze(-1)
                (lp * gr).sum().backward()

            ms, ms_e = bench.median_ms(ours, rep_ms=300), bench.median_ms(eager, rep_ms=300)
            row = {"N": n, "H": hd, "V": v, "ms": round(ms, 3), "ms_eager": round(ms_e, 3),
                   "speed_vs_eager": round(ms_e / ms, 3), "tflops": round(8 * n * hd * v / ms / 1e9, 1),
                   "peak_extra_gib": round(peak(ours), 3), "peak_extra_gib_eager": round(peak(eager), 3)}
            try:
                row["graph_ms"] = round(bench.graph_ms(ours, rep_ms=300), 3)
            except Exception as ex:  # noqa: BLE001 - a capture failure is recorded, not fatal
                row["graph_error"] = str(ex)[:200]
            del hl, wl
        except Exception as ex:  # noqa: BLE001
            row = {"N": n, "H": hd, "V": v, "error": str(ex)[:300]}
        out.append(row)
        log(row)
        torch.cuda.empty_cache()
    report["shapes_fwd_bwd"] = out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--quick", action="store_true", help="ours and torch eager only (no Liger / CCE / matmul)")
    ap.add_argument("--matmul-only", action="store_true", help="only the matmul against cuBLAS")
    args = ap.parse_args()
    report.update(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  python=platform.python_version(), commit=args.commit,
                  date=datetime.date.today().isoformat(), shape={"N": N, "H": H, "V": V, "dtype": "bfloat16"})
    t0 = time.time()
    h, w, t, gr = inputs()
    try:
        if args.sweep:
            sweep(h, w, t, gr)
        report["configs_used"] = {k: configs.lookup_matmul(k, "sm90", DT).__dict__
                                  for k in ("linear_logp_fwd", "linear_logp_dlogits", "linear_logp_dhidden", "matmul")}
        if args.matmul_only:
            del h, w
            torch.cuda.empty_cache()
            matmul_bench()
        else:
            benchmark(h, w, t, gr, competitors=not args.quick)
            torch.cuda.empty_cache()
        if not args.quick and not args.matmul_only:
            matmul_bench()
            shapes_bench()
    except Exception:  # noqa: BLE001
        report["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
    report["seconds"] = round(time.time() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
