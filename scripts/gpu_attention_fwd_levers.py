"""The attention forward's load and schedule options (configs tma_loads, flat, num_stages) on the GPU, each
against the locked row and against the pointer path (tma_loads and flat off), same run (issue 18).

  tma_loads K and V read through TMA descriptors over [N, Hkv * D];
  flat    one query tile per program in a straight line (the grid-stride loop only past the grid);
  heavy_first  the grid's tiles in reverse order (the longest causal rows first);
  maxnreg  ptxas's register cap at head dims <= 64 (two programs per SM where the uncapped kernel fits
          one; locked at 128 on sm90 2-byte rows, "uncapped" times it off).
All move and schedule the same tiles: every variant must give the locked row's bits (torch.equal on
out and lse, reported per row; exit 1 otherwise). An experimental kernel with the reverse order and the
straight-line tile ran 1.19x the locked loop at D=64 (h200-attention-fwd-levers-2026-12-04.json):
heavy_first is here to find out whether the order is what did it. Then the backward with heavy_first
on the dq row (its bits checked too).

The first version of this script (de9d347) timed experimental kernels: warp specialization of the
unmasked loop, an FMA softmax (another rounding), block_n 128 and a reversed tile order gave no
material gain (docs/reports/h200-attention-fwd-levers-2026-12-04.json).

    python scripts/gpu_attention_fwd_levers.py --out levers.json --commit <sha> [--time-box 400]
    python scripts/gpu_attention_fwd_levers.py --smoke   # CPU interpreter, tiny shapes: the plumbing
"""
import argparse
import dataclasses
import json
import os
import sys
import time

if "--smoke" in sys.argv[1:]:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402

from rlk_triton._runtime import arch_of  # noqa: E402
from rlk_triton.ops import attention as ops  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_attention_tiles import rows_set  # noqa: E402

VARIANTS = {  # name: fields replaced in the locked row
    "pointer": dict(tma_loads=False, flat=False),
    "tma_loads": dict(tma_loads=True, flat=False),
    "flat": dict(tma_loads=False, flat=True),
    "tma_loads flat": dict(tma_loads=True, flat=True),
    "tma_loads s4": dict(tma_loads=True, flat=False, num_stages=4),
    "tma_loads flat s4": dict(tma_loads=True, flat=True, num_stages=4),
    "heavy_first": dict(tma_loads=False, flat=False, heavy_first=True),
    "flat heavy_first": dict(tma_loads=False, flat=True, heavy_first=True),
    "tma_loads flat heavy_first": dict(tma_loads=True, flat=True, heavy_first=True),
    "tma_loads heavy_first": dict(tma_loads=True, flat=False, heavy_first=True),
    # the locked row's loads with and without ptxas's register cap (configs maxnreg_d64, applied at
    # head dims <= 64 only): two 8-warp programs per SM at D 64 (161 registers uncapped)
    "maxnreg 128": dict(maxnreg_d64=128),
    "uncapped": dict(maxnreg_d64=0),
    "heavy_first maxnreg 128": dict(heavy_first=True, maxnreg_d64=128),
    # 64-row tiles, one warpgroup, 2 stages: two programs per SM at D 128 by both registers (254) and
    # shared memory (83 KB; ptxas, triton 3.6). The sweep's 64-row rows had 3-4 stages (one program
    # per SM: 0.60-0.67x, h200-attention-2026-12-04.json). The same block_n, so the same reduction
    # order; a new locked block_m would move decode's rows with it (configs._decode_row).
    "m64 w4 s2": dict(block_m=64, num_warps=4, num_stages=2),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="levers.json")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--time-box", type=float, default=1e9)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS),
                    help="names of VARIANTS; '+' stands for a space (maxnreg+128), for callers that pass the "
                         "arguments through one shell variable (scripts/gpu_session.sh LEVERS_ARGS)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    args.variants = [v.replace("+", " ") for v in args.variants]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    t0 = time.time()
    dev = "cpu" if args.smoke else "cuda"
    if args.smoke:
        from rlk_triton.bench.timing import cpu_ms as timer

        shapes = [("2 x 40", [40, 24], 4, 2, 32)]
    else:
        from functools import partial

        from rlk_triton.bench.timing import graph_ms

        timer = partial(graph_ms, reps=3)
        shapes = [("4 x 8192", [8192] * 4, 32, 8, 128), ("16 x 2048", [2048] * 16, 32, 8, 128),
                  ("4 x 8192 D=64", [8192] * 4, 32, 8, 64), ("2 x 8192 D=256", [8192] * 2, 16, 8, 256),
                  ("64 mixed 64..4096", [int(x) for x in torch.randint(
                      64, 4097, (64,), generator=torch.Generator().manual_seed(1))], 32, 8, 128)]
    dt = torch.bfloat16
    report = {"what": "attention forward: tma_loads / flat / stages against the locked row (scripts/gpu_attention_fwd_levers.py)",
              "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)",
              "torch": torch.__version__, "triton": triton.__version__, "commit": args.commit,
              "date": time.strftime("%Y-%m-%d"), "rows": []}
    g = torch.Generator(device=dev).manual_seed(0)
    for label, lens, hq, hkv, d in shapes:
        N, L = sum(lens), max(lens)
        cu = torch.tensor([0] + lens, device=dev).cumsum(0).to(torch.int32)
        q, k, v = (torch.randn(N, h, d, device=dev, generator=g).to(dt) for h in (hq, hkv, hkv))
        sc = d ** -0.5
        locked = ops._cfg("attention_fwd", q)
        ref = ops.launch_forward(q, k, v, cu, L, sc, True)
        base_ms = timer(lambda: ops.launch_forward(q, k, v, cu, L, sc, True))
        shape = f"{label}, {hq}/{hkv} heads, D={d}, causal, bf16"
        flops = sum(2 * 2 * n * (n + 1) / 2 * d * hq for n in lens)
        row0 = {"shape": shape, "variant": "locked",
                "config": [locked.block_m, locked.block_n, locked.num_warps, locked.num_stages, locked.tma_loads,
                           locked.flat, locked.heavy_first, locked.maxnreg_d64],
                "ms": base_ms, "tflops": flops / base_ms / 1e9}
        report["rows"].append(row0)
        print(row0, flush=True)
        for name in args.variants:
            if time.time() - t0 > args.time_box:
                report.setdefault("not_run", []).append(f"{shape}: {name}")
                continue
            cfg = dataclasses.replace(locked, **VARIANTS[name])
            row = {"shape": shape, "variant": name,
                   "config": [cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, cfg.tma_loads, cfg.flat,
                              cfg.heavy_first, cfg.maxnreg_d64]}
            try:
                o, s = ops.launch_forward(q, k, v, cu, L, sc, True, cfg=cfg)
                ms = timer(lambda: ops.launch_forward(q, k, v, cu, L, sc, True, cfg=cfg))
                row |= {"ms": ms, "vs_locked": base_ms / ms, "tflops": flops / ms / 1e9,
                        "bitwise_vs_locked": bool(torch.equal(o, ref[0]) and torch.equal(s, ref[1]))}
            except Exception as ex:  # noqa: BLE001 - reported
                row["error"] = repr(ex)[:400]
            report["rows"].append(row)
            print(row, flush=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
        # the backward with dq's tiles in reverse order (heavy_first on the dq row) and, at D <= 64, dq's
        # register cap, against the locked rows
        out, lse = ref
        do = torch.randn(out.shape, device=dev, generator=g).to(dt)
        grads, bwd_ms = None, None
        dq_locked = ops._cfg("attention_bwd_dq", q)
        bwd_variants = [("locked", {}), ("dq heavy_first", {"dq": dataclasses.replace(dq_locked, heavy_first=True)})]
        if d <= 64:  # configs maxnreg_d64 on the dq row: two programs per SM (ptxas: 170 -> 128 registers)
            other = 0 if dq_locked.maxnreg_d64 else 128  # the locked row's cap against the other choice
            bwd_variants.append((f"dq maxnreg {other or 'off'}", {"dq": dataclasses.replace(dq_locked, maxnreg_d64=other)}))
        for name, rows in bwd_variants:
            if time.time() - t0 > args.time_box:
                report.setdefault("not_run", []).append(f"{shape}: backward {name}")
                continue
            row = {"shape": shape, "pass": "backward", "variant": name}
            with rows_set(rows, arch_of(q.device), dt, d):
                got = ops.launch_backward(do, None, q, k, v, out, lse, cu, L, sc, True)
                ms = timer(lambda: ops.launch_backward(do, None, q, k, v, out, lse, cu, L, sc, True))
            row["ms"] = ms
            if grads is None:
                grads, bwd_ms = got, ms
            else:
                row |= {"vs_locked": bwd_ms / ms, "bitwise_vs_locked": all(torch.equal(a, b) for a, b in zip(grads, got))}
            report["rows"].append(row)
            print(row, flush=True)
        del q, k, v, ref, out, lse, do, grads
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    bad = [r for r in report["rows"] if r["variant"] != "locked" and not r.get("bitwise_vs_locked")]
    print("bit mismatches where none may be:", len(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
