"""linear_logp's two gradient GEMMs alone on the GPU, at one backward pass's shapes, against cuBLAS,
same run (issue 19: at 1024 tokens they are where the recompute path's gap to the bound is):

  d weight  = d_logits^T @ hidden   [P, N] @ [N, H]: the pointer kernel (A = d_logits.t() read through
              pointers, the path before A_T) and the descriptor kernel (A^T read through a TMA
              descriptor over d_logits, matmul A_T), the "matmul" row's tiles both;
  d hidden  = d_logits @ W_chunk    [N, P] @ [P, H]: the locked descriptor kernel with the pass's
              vocab chunks folded (FOLD_K), one K range (no fold), W's chunk as a K-major B (a
              transposed copy: is W's N-major layout the cost?), and the product transposed
              (d hidden^T = W_chunk^T @ d_logits^T: W through A_T, its N-major side moved from B to A).

P is the pass's vocab width (chunk_v x chunks per pass at N). Every variant of a GEMM must give the
first's bits (torch.equal, reported), but for one K range (another sum). Then linear_logp fwd + bwd
with d weight on each path (the "matmul" rows' persistent_tma off / as locked), bits compared; then
the two GEMMs inside the operator (in_operator: CUDA events around each call of an eager step, and
pass 0's calls replayed alone on the operator's operands and on random ones).

    python scripts/gpu_linear_logp_gemms.py --out gemms.json --commit <sha> [--shapes 1024x4096x151936 ...]
"""
import argparse
import dataclasses
import json
import time
from functools import partial

import torch
import triton

from rlk_triton import bench, configs
from rlk_triton._runtime import default_arch
from rlk_triton.bench.timing import bracketed_ratios
from rlk_triton.logp import linear_logp
from rlk_triton.ops.linear_logp import pass_chunks
from rlk_triton.ops.matmul import matmul_into

graph_ms = partial(bench.graph_ms, reps=3)
ANOTHER_ORDER = {"descriptor kernel, one K range"}  # one K range instead of the chunks' fold: another sum


def in_operator(h, W, t, up, shape, rows):
    """The gradient GEMMs inside one eager linear_logp fwd+bwd: each matmul_into call timed with CUDA
    events on the stream (device time, in the operator's context: after its d logits pass, d hidden
    in place on its accumulator, the real gradients), then pass 0's two calls replayed alone in a
    CUDA graph on the same operands, and on random operands of the same shapes and scale: whether the
    operator's GEMMs run slower than the same GEMMs alone, and if so whether the data or the context
    does it."""
    import rlk_triton.ops.linear_logp as ll_ops

    real = ll_ops.matmul_into
    calls, kept = [], {}

    def timed(a, b, out, c_in=None, cfg=None, bias=None, fold_k=0):
        kind = "d hidden" if fold_k else "d weight"
        if not timing and kind not in kept:  # pass 0's operands, copied in the untimed step only (the
            # d logits buffer is reused by later passes; the recompute gives the same values each step)
            kept[kind] = (a.clone(), b, None if c_in is None else c_in.clone(), out.dtype, cfg, fold_k)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        r = real(a, b, out, c_in=c_in, cfg=cfg, bias=bias, fold_k=fold_k)
        end.record()
        calls.append((kind, start, end))
        return r

    ll_ops.matmul_into = timed
    try:
        for timing in (False, True):  # the first step compiles and keeps pass 0's operands; the second is timed
            calls.clear()
            torch.autograd.grad(linear_logp(h, W, t, validate=False), (h, W), up)
            torch.cuda.synchronize()
    finally:
        ll_ops.matmul_into = real
    for kind in ("d weight", "d hidden"):
        mine = [c for c in calls if c[0] == kind]
        total = sum(s.elapsed_time(e) for _, s, e in mine)
        a, b, c_in, odt, cfg, fold_k = kept[kind]
        out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=odt)
        alone = graph_ms(lambda: real(a, b, out, c_in=c_in, cfg=cfg, fold_k=fold_k))
        ra = (torch.randn(a.shape, device=a.device) * a.float().std()).to(a.dtype)
        alone_random = graph_ms(lambda: real(ra if a.stride(1) == 1 else ra.t().contiguous().t(), b, out,
                                             c_in=c_in, cfg=cfg, fold_k=fold_k))
        r = {"shape": shape, "gemm": f"{kind}, in the operator", "calls": len(mine), "in_op_total_ms": total,
             "in_op_pass0_ms": mine[0][1].elapsed_time(mine[0][2]), "pass0_alone_ms": alone,
             "pass0_alone_random_operand_ms": alone_random}
        rows.append(r)
        print(r, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--shapes", nargs="*", default=["1024x4096x151936", "8192x4096x151936"], metavar="NxHxV")
    ap.add_argument("--time-box", type=float, default=1e9)
    ap.add_argument("--bracket", type=int, default=0, metavar="K",
                    help="also fwd+bwd with d weight on pointers timed K times, each between two timings with "
                         "the locked descriptors (bench.timing.bracketed_ratios)")
    args = ap.parse_args()
    t0 = time.time()
    arch = default_arch()
    dt = torch.bfloat16
    rows = []
    report = {"what": "linear_logp's gradient GEMMs (one backward pass) on our kernels against cuBLAS, and "
                      "linear_logp fwd+bwd with d weight on the pointer / descriptor path, same run",
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "commit": args.commit, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    mm_keys = [k for k in configs.LOCKED_CONFIGS if k[0] == "matmul" and k[1] == configs.table_arch(arch, "matmul")
               and k[2] == "bfloat16"]
    dl_cfg = configs.lookup_matmul("linear_logp_dlogits", arch, dt)
    dh_cfg = configs.lookup_matmul("linear_logp_dhidden", arch, dt)
    mm_cfg = configs.lookup_matmul("matmul", arch, dt)
    g = torch.Generator(device="cuda").manual_seed(0)
    for spec in args.shapes:
        if time.time() - t0 > args.time_box:
            break
        N, H, V = (int(x) for x in spec.split("x"))
        C = dl_cfg.chunk_v
        P = C * pass_chunks(dl_cfg, N, dt.itemsize)
        hidden = (torch.randn(N, H, device="cuda", generator=g) * 0.5).to(dt)
        w = (torch.randn(P, H, device="cuda", generator=g) * 0.02).to(dt)
        d = (torch.randn(N, P, device="cuda", generator=g) * 1e-3).to(dt)
        shape = f"{N} x {H} x {V} (pass width {P})"
        flops = 2 * N * H * P

        def row(gemm, variants):
            first = None
            for name, fn in variants:
                ms = graph_ms(fn)
                out = fn().clone()
                first = first if first is not None else out
                r = {"shape": shape, "gemm": gemm, "variant": name, "ms": ms, "tflops": flops / ms / 1e9,
                     "bitwise_vs_first": None if name == variants[0][0] or name.startswith("cuBLAS")
                     else torch.equal(out, first)}
                if name in ANOTHER_ORDER:
                    r["another_order"] = True  # its bits may differ: not a failure
                rows.append(r)
                print(r, flush=True)

        gw = torch.empty(P, H, device="cuda", dtype=dt)
        pointer = dataclasses.replace(mm_cfg, persistent_tma=False)
        row("d weight = d_logits^T @ hidden", [
            ("pointer kernel", lambda: matmul_into(d.t(), hidden, gw, cfg=pointer)),
            ("descriptor kernel (A_T)", lambda: matmul_into(d.t(), hidden, gw, cfg=mm_cfg)),
            ("cuBLAS", lambda: d.t() @ hidden)])
        acc = torch.randn(N, H, device="cuda", generator=g)
        dh = torch.empty(N, H, device="cuda")
        w_t = w.t().contiguous()  # [H, P]: W_chunk^T in rows, a copy for timing only
        acc_t = acc.t().contiguous()
        dh_t = torch.empty(H, N, device="cuda")
        row("d hidden = d_logits @ W_chunk (+ fp32 accumulator)", [
            ("descriptor kernel, chunks folded (locked)", lambda: matmul_into(d, w, dh, c_in=acc, cfg=dh_cfg, fold_k=C)),
            ("descriptor kernel, one K range", lambda: matmul_into(d, w, dh, c_in=acc, cfg=dh_cfg)),
            # the operand layouts: W's chunk as a K-major B (a transposed copy, B_T), and the product
            # transposed, d hidden^T = W_chunk^T @ d_logits^T (W through A_T, d_logits through B_T)
            ("K-major B (W chunk copied transposed), chunks folded",
             lambda: matmul_into(d, w_t.t(), dh, c_in=acc, cfg=dh_cfg, fold_k=C)),
            ("transposed product (A_T, B_T), chunks folded",
             lambda: matmul_into(w.t(), d.t(), dh_t, c_in=acc_t, cfg=dh_cfg, fold_k=C).t()),
            ("cuBLAS (bf16 product, added to the fp32 accumulator)", lambda: torch.add(acc, d @ w))])
        # the whole op with d weight on each path
        h = (torch.randn(N, H, device="cuda", generator=g) * 0.5).to(dt).requires_grad_()
        W = (torch.randn(V, H, device="cuda", generator=g) * 0.02).to(dt).requires_grad_()
        t = torch.randint(0, V, (N,), device="cuda", generator=g)
        up = torch.randn(N, device="cuda", generator=g)
        saved = {k: configs.LOCKED_CONFIGS[k] for k in mm_keys}
        grads = {}
        for name, tma in (("d weight on pointers", False), ("d weight through descriptors (locked)", True)):
            for k in mm_keys:
                configs.LOCKED_CONFIGS[k] = dataclasses.replace(saved[k], persistent_tma=tma)
            step = lambda: torch.autograd.grad(linear_logp(h, W, t, validate=False), (h, W), up)  # noqa: E731
            grads[name] = step()
            ms = graph_ms(step)
            first = next(iter(grads.values()))
            r = {"shape": f"{N} x {H} x {V}", "gemm": "linear_logp fwd+bwd, recompute", "variant": name, "ms": ms,
                 "bitwise_vs_first": all(torch.equal(x, y) for x, y in zip(grads[name], first))}
            rows.append(r)
            print(r, flush=True)
        configs.LOCKED_CONFIGS.update(saved)
        if args.bracket:  # each step on pointers timed between two on descriptors: the machine's drift out
            def step_with(tma):
                def step():
                    for k in mm_keys:  # host-side choice: the captured graph holds the chosen kernels
                        configs.LOCKED_CONFIGS[k] = dataclasses.replace(saved[k], persistent_tma=tma)
                    return torch.autograd.grad(linear_logp(h, W, t, validate=False), (h, W), up)
                return step

            try:
                b = bracketed_ratios(step_with(False), step_with(True), args.bracket, graph_ms)
            finally:
                configs.LOCKED_CONFIGS.update(saved)
            r = {"shape": f"{N} x {H} x {V}", "gemm": "linear_logp fwd+bwd, recompute",
                 "variant": "d weight on pointers, each timing between two of the locked descriptors",
                 "locked_ms_over_pointers_ms_median": b["median"], "min": b["min"], "max": b["max"],
                 "pointers_ms": b["fn_ms"], "locked_ms": b["baseline_ms"]}
            rows.append(r)
            print(r, flush=True)
        in_operator(h, W, t, up, shape, rows)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    bad = [r for r in rows if r.get("bitwise_vs_first") is False and not r.get("another_order")]
    print("bits differ:", bad) if bad else print("every variant gave the first's bits")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
