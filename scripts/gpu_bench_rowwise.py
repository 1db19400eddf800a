"""H200 benchmark + quick checks of RMSNorm and SwiGLU, against a copy baseline measured in the same run.

Run on the device: python scripts/gpu_bench_rowwise.py --out $OUT/rowwise.json [--commit SHA] [--no-sweep]
About 1-2 minutes. Every case is guarded: an exception is recorded in its row, never fatal.

Rows (bf16): RMSNorm at [16384 x 4096] and [16384 x 8192], with and without the fused residual;
SwiGLU at [16384 x 14336]. For each: rlk forward, rlk forward + backward, the same in eager torch and
torch.compile; ms, x copy rate (bytes moved / time / copy rate) and extra peak memory. Bytes moved:
  rmsnorm fwd      read x (+ residual), write y (+ residual_out)              2 (4) passes of [N, H]
  rmsnorm bwd      read h, dy (+ d residual_out), write dx (+ d residual)     3 (5) passes
  swiglu fwd       read gate, up, write y                                      3 passes of [N, I]
  swiglu bwd       read dy, gate, up, write d gate, d up                       5 passes
(weights, rstd and dW partials are < 2% and not counted). fwd+bwd counts the sum.
Then a short sweep of RMSNorm backward configs (rows per dW block R, warps, stages) and forward warps,
to pick the locked rows of rlk_triton/configs.py, and quick GPU checks: bitwise batch invariance
(rlk_triton.testing) and parity against the contracts (rlk_triton.testing.rowwise).
"""
import argparse
import datetime
import json
import sys
import time
import traceback

import torch
import triton

from rlk_triton import bench, configs

N = 16384


def _row(rows, name, fn):
    """Run fn() -> dict; record its result or its exception."""
    t0 = time.time()
    try:
        row = {"name": name, **fn()}
    except Exception as ex:  # noqa: BLE001 - recorded, the run goes on
        row = {"name": name, "error": f"{type(ex).__name__}: {ex}", "trace": traceback.format_exc()[-1500:]}
    row["wall_s"] = round(time.time() - t0, 2)
    rows.append(row)
    print(json.dumps({k: v for k, v in row.items() if k != "trace"}), flush=True)
    return row


_SAME_SIZE_COPY = {}


def _timed(fn, nbytes, copy, pass_bytes=None):
    """x_copy_rate: against the 2 GiB copy (the device's streaming peak); with pass_bytes, also
    x_same_size_copy: against a copy of one [N, H] tensor, which pays the same launch and tail."""
    ms = bench.median_ms(fn, rep_ms=100, warmup_ms=25)
    extra = {}
    if pass_bytes:
        if pass_bytes not in _SAME_SIZE_COPY:
            _SAME_SIZE_COPY[pass_bytes] = bench.copy_rate_gbps(pass_bytes)
        extra["x_same_size_copy"] = round(nbytes / ms / 1e6 / _SAME_SIZE_COPY[pass_bytes], 3)
    return {"ms": round(ms, 4), "x_copy_rate": round(nbytes / ms / 1e6 / copy, 3), **extra,
            "peak_extra_gib": round(bench.peak_extra_gib(fn), 3)}


def eager_rmsnorm(x, w, residual=None, eps=1e-6):
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    y = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)
    return y if residual is None else (y, residual)


def eager_swiglu(g, u):
    return torch.nn.functional.silu(g.float()).mul(u.float()).to(g.dtype)


def _fwd_bwd(fn, inputs, grads):
    """One forward + backward step returning the input gradients (no .grad accumulation)."""
    leaves = [t.detach().requires_grad_(True) for t in inputs]

    def step():
        out = fn(*leaves)
        out = out if isinstance(out, tuple) else (out,)
        return torch.autograd.grad(out, leaves, grads[:len(out)])

    return step


def bench_rmsnorm(rows, copy, H, residual):
    from rlk_triton.ops.rmsnorm import rms_norm

    g = torch.Generator(device="cuda").manual_seed(H)
    x = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16)
    r = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(H, device="cuda", generator=g)).to(torch.bfloat16)
    dy = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16)
    dres = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16)
    pass_bytes = N * H * 2
    fwd_b, bwd_b = (4, 5) if residual else (2, 3)
    tag = f"[{N} x {H}] bf16{' +residual' if residual else ''}"
    ins = (x, w, r) if residual else (x, w)
    ours = (lambda x, w, r: rms_norm(x, w, residual=r)) if residual else (lambda x, w: rms_norm(x, w))
    eager = (lambda x, w, r: eager_rmsnorm(x, w, r)) if residual else (lambda x, w: eager_rmsnorm(x, w))
    compiled = torch.compile(eager)
    for impl, fn in (("rlk", ours), ("torch eager", eager), ("torch.compile", compiled)):
        _row(rows, f"{impl} rmsnorm forward {tag}",
             lambda: _timed(lambda: fn(*ins), fwd_b * pass_bytes, copy, pass_bytes))
        _row(rows, f"{impl} rmsnorm forward+backward {tag}",
             lambda: _timed(_fwd_bwd(fn, ins, (dy, dres)), (fwd_b + bwd_b) * pass_bytes, copy))

    def bwd_only():  # the backward launcher alone, as autograd calls it
        from rlk_triton.ops.rmsnorm import launch_backward, launch_forward

        y, ro, rstd = launch_forward(x, w, r if residual else None, 1e-6, 0.0)
        h = ro if residual else x
        return _timed(lambda: launch_backward(dy, dres if residual else None, h, w, rstd, 0.0, True, residual),
                      bwd_b * pass_bytes, copy, pass_bytes)

    _row(rows, f"rlk rmsnorm backward alone {tag}", bwd_only)

    def fwd_only():  # the forward launcher alone (no custom-op / autograd host overhead)
        from rlk_triton.ops.rmsnorm import launch_forward

        return _timed(lambda: launch_forward(x, w, r if residual else None, 1e-6, 0.0), fwd_b * pass_bytes, copy,
                      pass_bytes)

    _row(rows, f"rlk rmsnorm forward alone {tag}", fwd_only)


def bench_swiglu(rows, copy, I=14336):
    from rlk_triton.ops.swiglu import swiglu

    g = torch.Generator(device="cuda").manual_seed(I)
    gate = (torch.randn(N, I, device="cuda", generator=g) * 2).to(torch.bfloat16)
    up = torch.randn(N, I, device="cuda", generator=g).to(torch.bfloat16)
    dy = torch.randn(N, I, device="cuda", generator=g).to(torch.bfloat16)
    pass_bytes = N * I * 2
    tag = f"[{N} x {I}] bf16"
    compiled = torch.compile(eager_swiglu)
    for impl, fn in (("rlk", swiglu), ("torch eager", eager_swiglu), ("torch.compile", compiled)):
        _row(rows, f"{impl} swiglu forward {tag}", lambda: _timed(lambda: fn(gate, up), 3 * pass_bytes, copy))
        _row(rows, f"{impl} swiglu forward+backward {tag}",
             lambda: _timed(_fwd_bwd(fn, (gate, up), (dy,)), 8 * pass_bytes, copy))


def sweep_rmsnorm(rows, copy, budget_s=60.0):
    """Config alternatives, timed with the launchers (overrides): data for the locked table.
    Forward: rows per program x warps. Backward: rows per dW block R x reduce lanes B x warps."""
    from rlk_triton.ops.rmsnorm import launch_backward, launch_forward

    t_end = time.time() + budget_s
    for H in (4096, 8192):
        g = torch.Generator(device="cuda").manual_seed(H)
        x = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16)
        w = torch.ones(H, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16)
        pass_bytes = N * H * 2
        base_f = configs.lookup("rmsnorm_fwd", "sm90", torch.bfloat16, H)
        for rf in (1, 2, 4):  # rows per forward program (> 1: the [rows, H] tile kernel)
            for warps in (4, 8, 16):
                if time.time() > t_end:
                    return
                cfg = configs.LaunchConfig(base_f.block_v, warps, 1)
                _row(rows, f"sweep rmsnorm forward H={H} rows={rf} warps={warps}",
                     lambda: {"config": [cfg.block_v, warps, 1], "rows_per_program": rf,
                              **_timed(lambda: launch_forward(x, w, None, 1e-6, 0.0, cfg=cfg, rows_per_program=rf),
                                       2 * pass_bytes, copy, pass_bytes)})
        _, _, rstd = launch_forward(x, w, None, 1e-6, 0.0)
        base_b = configs.lookup("rmsnorm_bwd", "sm90", torch.bfloat16, H)
        for R in (16, 32, 64, 128):
            for B in (16, 64, 128):
                for warps in (8, 16):
                    if time.time() > t_end:
                        return
                    cfg = configs.LaunchConfig(base_b.block_v, warps, 1)
                    _row(rows, f"sweep rmsnorm backward H={H} R={R} B={B} warps={warps}",
                         lambda: {"config": [cfg.block_v, warps, 1], "rows_per_block": R, "reduce_lanes": B,
                                  **_timed(lambda: launch_backward(dy, None, x, w, rstd, 0.0, True, False, cfg=cfg,
                                                                   rows_per_block=R, reduce_block=B),
                                           3 * pass_bytes, copy)})


def checks(rows, deadline):
    from rlk_triton.testing import check_batch_invariance
    from rlk_triton.testing.rowwise import (GluCase, NormCase, judge_rmsnorm, judge_swiglu, rmsnorm_row_op,
                                            swiglu_row_op)

    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for H in (4096, 8192, 20000):
            for res in (False, True):
                if time.time() > deadline:
                    rows.append({"name": "remaining checks", "error": "skipped: past the time budget"})
                    return
                op = rmsnorm_row_op(H, dt, "cuda", residual=res, weight_offset=1.0 if res else 0.0)
                if H != 8192:
                    _row(rows, f"invariance {op.name}", lambda: _inv(check_batch_invariance(
                        op, probe_rows=4, batch_sizes=(5, 64, 257))))
                case = NormCase(128, H, dt, res, 1.0 if res else 0.0, 1.0, "row_stride" if res else "contiguous",
                                seed=H)
                _row(rows, f"parity rmsnorm {case.label()}", lambda: _par(judge_rmsnorm(case, "cuda")))
        for layout in ("separate", "fused"):
            op = swiglu_row_op(14336, dt, "cuda", layout)
            _row(rows, f"invariance {op.name}", lambda: _inv(check_batch_invariance(op, probe_rows=4,
                                                                                   batch_sizes=(5, 64, 257))))
            for scale in (1.0, 30.0):
                case = GluCase(128, 14336, dt, scale, layout, seed=7)
                _row(rows, f"parity swiglu {case.label()}", lambda: _par(judge_swiglu(case, "cuda")))


def _inv(report):
    bad = report.failures()
    return {"passed": not bad, "axes": sorted({r.axis for r in report.results}),
            "failures": [f"{r.axis}/{r.variant}/{r.what}: {r.max_abs_diff:.3g}" for r in bad]}


def _par(ratios):
    return {"passed": max(ratios.values()) <= 1.0, "ratios": {k: float(f"{v:.4g}") for k, v in ratios.items()}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args()
    rows = []
    t0 = time.time()
    copy = bench.copy_rate_gbps()
    rows.append({"name": "device-to-device copy rate (read + write)", "gbps": round(copy, 1)})
    for H in (4096, 8192):
        for res in (False, True):
            bench_rmsnorm(rows, copy, H, res)
    bench_swiglu(rows, copy)
    if not args.no_sweep:
        sweep_rmsnorm(rows, copy)
    checks(rows, deadline=t0 + 110.0)
    failed = [r["name"] for r in rows if "error" in r or r.get("passed") is False]
    report = {"date": datetime.date.today().isoformat(), "commit": args.commit,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "config_fingerprint": configs.fingerprint("sm90"), "wall_s": round(time.time() - t0, 1),
              "failed": failed, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"{len(rows)} rows, {len(failed)} failed or errored, {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
