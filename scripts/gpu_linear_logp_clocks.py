"""Is linear_logp's timed gap to the four-GEMM bound the clocks? (GPU only.)

Under torch.profiler, one step after a warm-up, the "recompute" fwd+bwd kernels summed 55.5 ms at
8192 x 4096 x 151936 on an H100 against 58.9 ms for the bound's four cuBLAS GEMMs, yet graph timing
over many steps gave 62.2 against 58.5 ms (docs/reports/h100-linear-logp-2026-12-05-first-range.json).
This times each step (ours in both modes, the bound, eager torch) two ways from one captured graph
of one step: `after_idle` (a replay after 2 s idle, median of 3) and `sustained` (replays back to back
for a few seconds, median of the second half), with nvidia-smi sampling the SM clock, power and
temperature during each window, and a per-kernel profile of one replay in each state (empty if this
torch's profiler does not see kernels inside graph replays). If ours is at the bound's time after idle
and falls behind only when sustained, at a lower clock than the bound's, the gap is power, not schedule.

  python3 scripts/gpu_linear_logp_clocks.py --out clocks.json --commit SHA [--shapes 8192x4096x151936]
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import threading
import time
from functools import partial

import torch
import triton

from rlk_triton.bench import timing
from rlk_triton.bench.cases import eager_linear_logp, linear_logp_gemms
from rlk_triton.logp import linear_logp


class Sampler:
    """nvidia-smi sampling SM clock (MHz), power (W) and temperature (C) every 20 ms; keeps the samples
    that arrive between entering and leaving the block."""

    def __enter__(self):
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits",
             "-lms", "20"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.lines: list = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        time.sleep(0.3)  # nvidia-smi's own start
        self.t0 = time.time()
        return self

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.time(), line))

    def __exit__(self, *exc):
        t1 = time.time()
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.reader.join(timeout=10)
        self.samples = []
        for arrived, line in self.lines:
            stamp, *values = line.split(",")
            try:  # nvidia-smi's own time of the sample (a piped stdout may arrive in bursts)
                t = datetime.datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            except ValueError:
                t = arrived
            if self.t0 <= t <= t1:
                try:
                    self.samples.append(tuple(float(x) for x in values))
                except ValueError:
                    continue

    def summary(self) -> dict:
        if not self.samples:
            return {"samples": 0}
        clk, pw, temp = zip(*self.samples)
        return {"samples": len(clk), "sm_mhz_mean": statistics.fmean(clk), "sm_mhz_min": min(clk),
                "power_w_mean": statistics.fmean(pw), "power_w_max": max(pw), "temp_c_max": max(temp)}


def measure(graph, seconds: float) -> dict:
    idle = []
    with Sampler() as s_idle:
        for _ in range(3):
            time.sleep(2.0)
            idle.append(timing.replay_ms(graph))
    time.sleep(2.0)
    cold_kernels = timing.kernel_times(graph.replay, top=8)
    times = []
    with Sampler() as s_hot:
        t0 = time.time()
        while time.time() - t0 < seconds:
            times.append(timing.replay_ms(graph))
        hot_kernels = timing.kernel_times(graph.replay, top=8)
    half = times[len(times) // 2:]
    return {"after_idle_ms": statistics.median(idle), "after_idle_each_ms": idle, "after_idle_clocks": s_idle.summary(),
            "sustained_ms": statistics.median(half), "sustained_first_ms": times[0], "sustained_steps": len(times),
            "sustained_clocks": s_hot.summary(), "kernels_after_idle": cold_kernels,
            "kernels_sustained": hot_kernels}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--shapes", nargs="*", default=["8192x4096x151936"], metavar="NxHxV")
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each sustained window")
    ap.add_argument("--time-box", type=float, default=1e9)
    args = ap.parse_args()
    t0 = time.time()
    rows = []
    report = {"what": "linear_logp fwd+bwd, the four-GEMM bound and eager torch, each one captured step timed after "
                      "2 s idle and sustained, with the SM clock and power sampled (nvidia-smi) in each window",
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "commit": args.commit, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    for shape in args.shapes:
        N, H, V = (int(x) for x in shape.split("x"))
        h = (torch.randn(N, H, device="cuda", generator=g) * 0.5).to(dt).requires_grad_()
        w = (torch.randn(V, H, device="cuda", generator=g) * 0.02).to(dt).requires_grad_()
        t = torch.randint(0, V, (N,), device="cuda", generator=g)
        up = torch.randn(N, device="cuda", generator=g)
        dl = torch.randn(N, V, device="cuda", generator=g).to(dt)  # the bound's d logits stand-in

        def fb(fn):
            return lambda: torch.autograd.grad(fn(h, w, t), (h, w), up)

        steps = {"recompute": fb(partial(linear_logp, validate=False, saved="recompute")),
                 "logits": fb(partial(linear_logp, validate=False, saved="logits")),
                 "four_gemm_bound": partial(linear_logp_gemms, h, w, dl, 4), "eager": fb(eager_linear_logp)}
        # ours and the bound twice, interleaved, so neither always runs on a GPU the other warmed
        for name in ("recompute", "four_gemm_bound", "logits", "eager", "recompute", "four_gemm_bound"):
            if time.time() - t0 > args.time_box:
                break
            graph, _ = timing.capture(steps[name], reps=1)
            rows.append({"shape": shape, "step": name, **measure(graph, args.seconds)})
            del graph
            torch.cuda.empty_cache()
            r = rows[-1]
            print({k: r[k] for k in ("shape", "step", "after_idle_ms", "sustained_ms")},
                  {k: round(v, 1) for k, v in r["sustained_clocks"].items()}, flush=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
