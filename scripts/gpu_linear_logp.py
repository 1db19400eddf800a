"""linear_logp fwd+bwd on the GPU against eager torch and the cuBLAS GEMM bound, both saved-state modes,
same run. The rows the linear_logp issue asks for: {shape, mode, rlk_ms, eager_ms, four_gemm_bound_ms,
gemm_bound_ms, extra_gib, eager_extra_gib, bitwise_logp_vs_recompute}.

    python scripts/gpu_linear_logp.py --out ll.json --commit <sha> [--time-box S] [--shapes NxHxV ...]
        [--sweep CHUNK_V:PER_PASS ...] [--tile-sweep fwd|dlogits:BM:BK:WARPS:STAGES:GROUP_M ...] [--profile]
        [--bracket K] [--merge-sweep BLOCK:WARPS:TILES ...]

rlk_ms: CUDA-graph device time; rlk_wall_ms / wall_ms: eager calls from the host (host time included).

The bound is torch.matmul alone on the operator's shapes: the logits, their recompute (saved=
"recompute" only), d hidden = dlogits @ W and d weight = dlogits^T @ hidden; no softmax work. The
JSON is rewritten after every shape.
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
from rlk_triton.bench.cases import eager_linear_logp, linear_logp_gemms
from rlk_triton.bench.timing import bracketed_ratios, kernel_times, peak_extra_mib
from rlk_triton.logp import linear_logp

graph_ms = partial(bench.graph_ms, reps=3)
SHAPES = ((8192, 4096, 151936), (1024, 4096, 151936), (4096, 5120, 151936), (16384, 2048, 128256),
          (8192, 8192, 128256))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--time-box", type=float, default=1e9)
    ap.add_argument("--sweep", nargs="*", default=[], metavar="CHUNK_V:PER_PASS[:BN:BK:STAGES]",
                    help="first shape only: both modes at these linear_logp_dlogits chunk_v / chunks_per_pass "
                         "(another chunk_v is another d hidden order; chunks_per_pass keeps the bits; the locked "
                         "pass_workspace_max caps it), optionally "
                         "with d hidden's tiles (block_n, block_k, stages)")
    ap.add_argument("--sweep-every-shape", action="store_true",
                    help="run --sweep and --profile at every shape, not only the first")
    ap.add_argument("--profile", action="store_true",
                    help="first shape (see --sweep-every-shape): device time per kernel, both modes and the bound's four GEMMs (on sm90 "
                         "d weight and d hidden are both _matmul_desc_kernel: gpu_linear_logp_gemms.py times them apart)")
    ap.add_argument("--saved-vocab", nargs="*", type=float, default=[], metavar="FRACTION",
                    help="also saved='logits' keeping these fractions of the vocab (saved_vocab = FRACTION x V)")
    ap.add_argument("--sweep-workspace-gib", type=float, default=0, metavar="GIB",
                    help="the sweep rows' pass_workspace_max in GiB (default: the locked cap)")
    ap.add_argument("--sweep-bracket", type=int, default=0, metavar="K",
                    help="also each --sweep row's saved='recompute' timed K times between two timings of the locked "
                         "row (bench.timing.bracketed_ratios): locked_ms_over_this_bracketed_median")
    ap.add_argument("--bracket", type=int, default=0, metavar="K",
                    help="also, at every shape, saved='recompute' timed K times, each between two timings of the "
                         "four-GEMM bound (bench.timing.bracketed_ratios): of_bound_bracketed_median / _min / _max")
    ap.add_argument("--tile-sweep", nargs="*", default=[], metavar="fwd|dlogits:BM:BK:WARPS:STAGES:GROUP_M",
                    help="first shape (see --sweep-every-shape): both modes with the forward's or the backward's fused "
                         "kernel on these tiles (block_n stays: it is the merge order; a new block_m is set on the other "
                         "kernel too, as saved='logits' needs); bracketed by --sweep-bracket. "
                         "Tiles of one bit class give the locked bits (bitwise_vs_locked checks logp and gradients)")
    ap.add_argument("--merge-sweep", nargs="*", default=[], metavar="BLOCK:WARPS:TILES",
                    help="first shape (see --sweep-every-shape): the merge kernel alone at these launches (rows per "
                         "program, warps, tiles per unrolled step) on the forward's tile states, timed and compared "
                         "bitwise with the locked launch and with the tile-by-tile loop (128:4:1)")
    ap.add_argument("--shapes", nargs="*", default=None, metavar="NxHxV",
                    help="only these shapes (default: all); --sweep and --profile then run at the first of them")
    args = ap.parse_args()
    shapes = SHAPES if args.shapes is None else [tuple(int(x) for x in sh.split("x")) for sh in args.shapes]
    t0 = time.time()
    rows = []
    report = {"what": "linear_logp fwd+bwd: saved='recompute' and saved='logits' against eager torch and the "
                      "cuBLAS GEMM bound, same run", "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "commit": args.commit,
              "date": time.strftime("%Y-%m-%d"), "rows": rows, "chunk_sweep": [], "merge_sweep": [], "kernels": {}}
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    for N, H, V in shapes:
        if time.time() - t0 > args.time_box:
            break
        h = (torch.randn(N, H, device="cuda", generator=g) * 0.5).to(dt).requires_grad_()
        w = (torch.randn(V, H, device="cuda", generator=g) * 0.02).to(dt).requires_grad_()
        t = torch.randint(0, V, (N,), device="cuda", generator=g)
        up = torch.randn(N, device="cuda", generator=g)
        dl = torch.randn(N, V, device="cuda", generator=g).to(dt)  # a dlogits stand-in for the bound

        def fb(fn):
            return lambda: torch.autograd.grad(fn(h, w, t), (h, w), up)

        gemms = partial(linear_logp_gemms, h, w, dl)  # gemms(4): the four-GEMM bound
        eager_ms = graph_ms(fb(eager_linear_logp))
        eager_gib = peak_extra_mib(fb(eager_linear_logp), "cuda") / 1024
        bound = {"recompute": graph_ms(partial(gemms, 4)), "logits": graph_ms(partial(gemms, 3))}
        ref, base_grads = None, {}
        modes = [("recompute", None), ("logits", None)] + [("logits", int(f * V)) for f in args.saved_vocab]
        for saved, kept in modes:
            fn = partial(linear_logp, validate=False, saved=saved, saved_vocab=kept)
            logp = fn(h, w, t).detach()  # no autograd graph kept alive into the capture
            grads = fb(fn)()
            ms = graph_ms(fb(fn))
            wall = bench.wall_ms(fb(fn))
            gib = peak_extra_mib(fb(fn), "cuda") / 1024
            if kept is None:
                base_grads[saved] = grads
            if ref is None:
                ref = (logp, grads)
            rows.append({"shape": f"{N} x {H} x {V}", "mode": saved if kept is None else f"{saved}, saved_vocab={kept}",
                         "rlk_ms": ms, "rlk_wall_ms": wall,
                         "eager_ms": eager_ms,
                         "vs_eager": eager_ms / ms, "gemm_bound_ms": bound[saved],
                         "four_gemm_bound_ms": bound["recompute"], "of_bound": bound[saved] / ms,
                         "extra_gib": gib, "eager_extra_gib": eager_gib,
                         "logits_buffer_gib": N * (V if kept is None else kept) * 2 / 2**30 if saved == "logits" else 0.0,
                         "bitwise_logp_vs_recompute": torch.equal(logp, ref[0]),
                         "max_abs_dhidden_vs_recompute": (grads[0].float() - ref[1][0].float()).abs().max().item()})
            print(rows[-1], flush=True)
        # the bound again after our rows: a GPU that heats through the run would otherwise favour
        # whichever was timed first (the H200 timed one locked row 63.5 and 67.2 ms in one run)
        after = graph_ms(partial(gemms, 4))
        for r in rows:
            if r["shape"] == f"{N} x {H} x {V}":
                r["four_gemm_bound_after_ms"] = after
                r["of_four_gemm_bound_bracketed"] = (r["four_gemm_bound_ms"] + after) / 2 / r["rlk_ms"]
        print({"shape": f"{N} x {H} x {V}", "four_gemm_bound_ms": bound["recompute"], "after_our_rows_ms": after},
              flush=True)
        if args.bracket:  # the target's ratio with the machine's drift taken out (the H100 at its power limit)
            b = bracketed_ratios(fb(partial(linear_logp, validate=False, saved="recompute")), partial(gemms, 4),
                                 args.bracket, graph_ms)
            for r in rows:
                if r["shape"] == f"{N} x {H} x {V}" and r["mode"] == "recompute":
                    r.update({"of_bound_bracketed_median": b["median"], "of_bound_bracketed_min": b["min"],
                              "of_bound_bracketed_max": b["max"], "bracketed_rlk_ms": b["fn_ms"],
                              "bracketed_bound_ms": b["baseline_ms"]})
            print({"shape": f"{N} x {H} x {V}", "bracketed": b}, flush=True)
        if (N, H, V) == shapes[0] or args.sweep_every_shape:
            key = ("linear_logp_dlogits", configs.table_arch(default_arch(), "linear_logp_dlogits"), "bfloat16", "any")
            locked = configs.LOCKED_CONFIGS[key]
            dh_key = ("linear_logp_dhidden",) + key[1:]
            dh_locked = configs.LOCKED_CONFIGS[dh_key]
            fwd_key = ("linear_logp_fwd",) + key[1:]
            fwd_locked = configs.LOCKED_CONFIGS[fwd_key]
            lockeds = {key: locked, dh_key: dh_locked, fwd_key: fwd_locked}
            sweeps = []  # (what the row changes, the table rows it sets, whether the bits must stay the locked ones)
            for spec in args.sweep:
                c, per, *dh = (int(x) for x in spec.split(":"))
                cap = int(args.sweep_workspace_gib * 2**30) if args.sweep_workspace_gib else locked.pass_workspace_max
                rows_of = {key: dataclasses.replace(locked, chunk_v=c, chunks_per_pass=per, pass_workspace_max=cap),
                           dh_key: (dataclasses.replace(dh_locked, block_n=dh[0], block_k=dh[1], num_stages=dh[2])
                                    if dh else dh_locked)}
                sweeps.append(({"chunk_v": c, "chunks_per_pass": per,
                                "dhidden_tiles": str(rows_of[dh_key])}, rows_of, c == locked.chunk_v))
            for spec in args.tile_sweep:
                kernel, bm, bk, warps, stages, group = spec.split(":")
                k_key = fwd_key if kernel == "fwd" else key
                row = dataclasses.replace(lockeds[k_key], block_m=int(bm), block_k=int(bk), num_warps=int(warps),
                                          num_stages=int(stages), group_m=int(group))
                rows_of = {k_key: row}
                other = key if k_key == fwd_key else fwd_key
                if lockeds[other].block_m != row.block_m:  # saved="logits" needs both kernels' row blocks equal
                    rows_of[other] = dataclasses.replace(lockeds[other], block_m=row.block_m)
                sweeps.append(({"kernel": k_key[0], "tiles": str(row),
                                "other_kernel_block_m": rows_of.get(other, lockeds[other]).block_m}, rows_of, True))
            for what, rows_of, keeps_bits in sweeps:
                if args.sweep_bracket:  # this row against the locked one, alternated: the machine's drift out
                    def step_with(table):
                        def step():
                            configs.LOCKED_CONFIGS.update(table)  # host side: the graph holds the kernels chosen
                            return fb(partial(linear_logp, validate=False))()
                        return step

                    try:
                        b = bracketed_ratios(step_with(rows_of), step_with(lockeds), args.sweep_bracket, graph_ms)
                    finally:
                        configs.LOCKED_CONFIGS.update(lockeds)
                    report["chunk_sweep"].append({"shape": f"{N} x {H} x {V}", "mode": "recompute", **what,
                                                  "locked_ms_over_this_bracketed_median": b["median"], "min": b["min"],
                                                  "max": b["max"], "this_ms": b["fn_ms"], "locked_ms": b["baseline_ms"]})
                    print(report["chunk_sweep"][-1], flush=True)
                configs.LOCKED_CONFIGS.update(rows_of)
                for saved in ("recompute", "logits"):
                    fn = partial(linear_logp, validate=False, saved=saved)
                    logp = fn(h, w, t).detach()
                    grads = fb(fn)()
                    ms = graph_ms(fb(fn))
                    wall = bench.wall_ms(fb(fn))
                    same = (keeps_bits and torch.equal(logp, ref[0])
                            and all(torch.equal(x, y) for x, y in zip(grads, base_grads[saved])))
                    report["chunk_sweep"].append({"shape": f"{N} x {H} x {V}", "mode": saved, **what, "rlk_ms": ms,
                                                  "wall_ms": wall, "vs_eager": eager_ms / ms,
                                                  "of_bound": bound[saved] / ms, "bitwise_vs_locked": same,
                                                  "extra_gib": peak_extra_mib(fb(fn), "cuda") / 1024})
                    print(report["chunk_sweep"][-1], flush=True)
                configs.LOCKED_CONFIGS.update(lockeds)
            if args.merge_sweep:
                merge_sweep(report["merge_sweep"], h, w, t, f"{N} x {H} x {V}", args.merge_sweep)
            for saved in ("recompute", "logits", "four_gemm_bound") if args.profile else ():
                # the bound's own kernels beside ours: which of our passes falls short of its cuBLAS GEMM
                step = (partial(gemms, 4) if saved == "four_gemm_bound"
                        else fb(partial(linear_logp, validate=False, saved=saved)))
                step()
                torch.cuda.synchronize()
                name = saved if (N, H, V) == shapes[0] else f"{saved} @ {N}x{H}x{V}"
                report["kernels"][name] = kernel_times(step)
                print(name, report["kernels"][name][:12], flush=True)
        del h, w, t, up, dl, ref, logp, grads, base_grads
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


def merge_sweep(out: list, h, w, t, shape: str, specs):
    """The merge kernel alone at each launch, on this shape's tile states, with and without entropy
    (the benchmark's step: without): device time and bits against the locked launch and the
    tile-by-tile loop."""
    from rlk_triton.ops import linear_logp as ll

    flush = torch.empty(2**28, dtype=torch.uint8, device="cuda")
    flush_ms = graph_ms(flush.zero_)
    for with_entropy in (False, True):
        with torch.no_grad():
            stats = ll._stats_and_saved(h, w, None, ll.local_targets(t, 0, w.shape[0], -100), 1.0, with_entropy, 0)[0]
        locked = ll.merge(stats, t, -100, with_entropy)
        serial = ll.merge(stats, t, -100, with_entropy, block=128, num_warps=4, tiles=1)
        for spec in specs:
            block, warps, tiles = (int(x) for x in spec.split(":"))
            fn = partial(ll.merge, stats, t, -100, with_entropy, block=block, num_warps=warps, tiles=tiles)
            res = fn()
            out.append({"shape": shape, "with_entropy": with_entropy, "block": block, "num_warps": warps,
                        "tiles": tiles, "tile_states": stats.shape[1], "merge_ms": graph_ms(fn),
                        # the states read from HBM, as in a step (the forward's weight stream evicts them
                        # from L2): each merge after a 256 MiB write, that write's own time taken out
                        "merge_after_l2_flush_ms": graph_ms(lambda: (flush.zero_(), fn())) - flush_ms,
                        "locked": (block, warps, tiles) == (ll.MERGE_BLOCK, ll.MERGE_WARPS, ll.MERGE_TILES[with_entropy]),
                        "bitwise_vs_locked": all(torch.equal(x, y) for x, y in zip(res, locked)),
                        "bitwise_vs_tile_by_tile": all(torch.equal(x, y) for x, y in zip(res, serial))})
            print(out[-1], flush=True)
        del stats


if __name__ == "__main__":
    main()
