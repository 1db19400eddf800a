"""Where an eager call's host time goes, on the GPU machine: floors (an empty Triton kernel, a torch op,
a trivial autograd.grad on CUDA and on CPU tensors) beside the library's calls, and a cProfile of each
library call (the functions with the most own time).

    python scripts/gpu_host_profile.py --json profile.json

Wall times are per call: n calls from the host, one sync at the end (rlk_triton.bench.wall_ms).
"launch probe" rows: for each Triton launch a call makes (recorded once), the JIT launch
(kernel[grid](...): argument binding, specialization, cache key) against the same compiled kernel's
launcher called directly with the bound arguments (the floor) and against rlk_triton.ops.launch's
cached launch, outputs preallocated. "sync probe" rows: whether a fwd+bwd call waits for the device
(a sleep kernel queued first; see sync_probe).
"""
import argparse
import cProfile
import io
import json
import pstats
import time

import torch
import triton
import triton.language as tl

from rlk_triton import bench
from rlk_triton.ops import launch
from rlk_triton.logp import selected_logp
from rlk_triton.ops.rmsnorm import rms_norm
from rlk_triton.bench import cases


@triton.jit
def _empty(x_ptr, n, B: tl.constexpr):
    pass


def record_launches(fn):
    """[(jit function, grid, args, kwargs, compiled kernel)] of the Triton launches one call of fn makes."""
    from triton.runtime.jit import JITFunction

    seen, run = [], JITFunction.run

    def spy(self, *args, grid, warmup, **kwargs):
        ck = run(self, *args, grid=grid, warmup=warmup, **kwargs)
        seen.append((self, grid, args, dict(kwargs), ck))
        return ck

    JITFunction.run, launch.ENABLED = spy, False  # every launch through the JIT, where the spy sees it
    try:
        fn()
    finally:
        JITFunction.run, launch.ENABLED = run, True
    return seen


def direct_launcher(jit_fn, grid, args, kwargs, ck):
    """A closure launching the compiled kernel `ck` with jit_fn's bound arguments (every parameter in
    order, constexprs and defaults included), as JITFunction.run does after its cache lookup."""
    from triton import knobs

    bound = [args[i] if i < len(args) else kwargs.get(p.name, p.default) for i, p in enumerate(jit_fn.params)]
    grid = tuple(grid) + (1,) * (3 - len(grid))
    device = torch.cuda.current_device()
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook

    def direct():
        ck.run(grid[0], grid[1], grid[2], launch.stream_handle(device), ck.function, ck.packed_metadata, None,
               enter, leave, *bound)
    return direct


def launch_probe(name, fn):
    rows = []
    for i, (jit_fn, grid, args, kwargs, ck) in enumerate(record_launches(fn)):
        jit = lambda: jit_fn[grid](*args, **kwargs)  # noqa: E731
        direct = direct_launcher(jit_fn, grid, args, kwargs, ck)
        k = launch.CachedLaunch(jit_fn)
        cached = lambda: k[grid](*args, **kwargs)  # noqa: E731
        rows.append({"call": f"launch probe: {name}, launch {i} ({jit_fn.fn.__name__}, {len(jit_fn.params)} params)",
                     "wall_ms_jit": bench.wall_ms(jit), "wall_ms_direct": bench.wall_ms(direct),
                     "wall_ms_cached_launch": bench.wall_ms(cached), "device_ms": bench.graph_ms(jit)})
    return rows


def sync_probe(name, fn, n=20, sleep_cycles=60_000_000):
    """Does one call of fn wait for the device? A long sleep kernel goes first on the stream, then n calls
    from the host: a call that synchronizes (a copy to the host, an allocator free, an engine wait) cannot
    return before the sleep ends, so the first call alone takes most of the sleep; otherwise the calls
    take n x the host time alone (which may outlast the sleep: the flag reads the first call). Also lists
    the synchronizing torch calls that torch's sync debug mode sees."""
    import warnings

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(sleep_cycles)
    torch.cuda.synchronize()
    sleep_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda._sleep(sleep_cycles)
    t0 = time.perf_counter()
    fn()
    first_ms = (time.perf_counter() - t0) * 1e3
    for _ in range(n - 1):
        fn()
    host_ms = (time.perf_counter() - t0) * 1e3
    still_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return {"call": f"sync probe: {name}", "sleep_ms": sleep_ms, "calls": n, "host_ms_per_call": host_ms / n,
            "device_still_busy_after_calls": still_busy, "first_call_ms": first_ms, "waited_for_device": first_ms >= 0.5 * sleep_ms,
            "sync_debug_warnings": sorted({str(w.message)[:200] for w in seen})}


def profile_top(fn, n=300, lines=22) -> str:
    """A cProfile of n calls of fn on this thread (after 20 warm-up calls): the `lines` functions with
    the most own time."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(lines)
    return s.getvalue()


def runtime_calls(fn, n=5):
    """The CUDA runtime calls n calls of fn make on the host (torch.profiler): count and host ms of each,
    most time first. A cudaMalloc / cudaFree / synchronize here is a wait an eager caller pays."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    rows = [{"name": e.key, "calls": e.count, "host_ms": e.cpu_time_total / 1e3}
            for e in prof.key_averages() if e.key.startswith(("cuda", "cu"))]
    return sorted(rows, key=lambda r: -r["host_ms"])[:14]


def linear_logp_host(path):
    """--linear-logp: where the 1024-token linear_logp fwd+bwd's wall time beyond its device time goes,
    both modes: wall (three times, and after torch.cuda.empty_cache), device (CUDA graph), the sync
    probe, the runtime calls, a cProfile."""
    from functools import partial

    from rlk_triton.logp import linear_logp

    g = torch.Generator(device="cuda").manual_seed(0)
    N, H, V = 1024, 4096, 151936
    h = (torch.randn(N, H, device="cuda", generator=g) * 0.5).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(V, H, device="cuda", generator=g) * 0.02).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    up = torch.randn(N, device="cuda", generator=g)
    rows = []
    for saved in ("recompute", "logits"):
        fn = partial(linear_logp, validate=False, saved=saved)
        step = lambda fn=fn: torch.autograd.grad(fn(h, w, t), (h, w), up)  # noqa: E731
        name = f"linear_logp fwd+bwd {N} x {H} x {V} saved={saved}"
        row = {"call": name, "device_ms": bench.graph_ms(step), "wall_ms": [bench.wall_ms(step) for _ in range(3)]}
        torch.cuda.empty_cache()
        row["wall_ms_after_empty_cache"] = bench.wall_ms(step)
        row["sync_probe"] = sync_probe(name, step, n=5, sleep_cycles=60_000_000)
        row["runtime_calls_per_5"] = runtime_calls(step)
        row["profile"] = profile_top(step, n=50)
        rows.append(row)
        print({k: v for k, v in row.items() if k != "profile"}, flush=True)
        print(row["profile"], flush=True)
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--sync-only", action="store_true",
                    help="only the sync probes, at 20 and 300 calls, each beside the call's wall time")
    ap.add_argument("--linear-logp", action="store_true",
                    help="only linear_logp fwd+bwd at 1024 x 4096 x 151936, both modes (linear_logp_host)")
    args = ap.parse_args()
    if args.linear_logp:
        return linear_logp_host(args.json)
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    x = torch.randn(4096, 4096, device="cuda", generator=g).to(bf)
    w = torch.ones(4096, device="cuda", dtype=bf)
    xs = x[:1].clone()
    logits = torch.randn(1, 151936, device="cuda", generator=g).to(bf)
    tgt = torch.zeros(1, dtype=torch.long, device="cuda")
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    up = torch.randn_like(x)
    xg4 = torch.randn(16384, 4096, device="cuda", generator=g).to(bf).requires_grad_()
    up4 = torch.randn_like(xg4)
    xk, wk = x.detach().requires_grad_(), w.detach().requires_grad_()  # leaves of their own: a graph
    kept = rms_norm(xk, wk)  # kept alive across calls, apart from the captured calls' leaves
    ppo = cases._policy_loss(256, 4096, torch.float32, "cuda", True).rlk  # the PPO case

    def torch_rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    calls = {
        "empty triton kernel launch": lambda: _empty[(1,)](x, 1, B=16),
        "torch add (1 op)": lambda: x.add(1),
        "autograd.grad of t * 2 (cuda, 16 elements)": cases.autograd_floor("cuda"),
        "autograd.grad of t * 2 (cpu, 16 elements)": cases.autograd_floor("cpu"),
        "selected_logp fwd 1 x 151936": lambda: selected_logp(logits, tgt, validate=False),
        "rms_norm fwd 1 x 4096": lambda: rms_norm(xs, w),
        "rms_norm fwd 4096 x 4096": lambda: rms_norm(x, w),
        "rms_norm fwd+bwd 4096 x 4096": lambda: torch.autograd.grad(rms_norm(xg, wg), (xg, wg), up),
        "rms_norm fwd+bwd 16384 x 4096": lambda: torch.autograd.grad(rms_norm(xg4, wg), (xg4, wg), up4),
        "rms_norm backward alone (autograd.grad, graph kept) 4096 x 4096":
            lambda: torch.autograd.grad(kept, (xk, wk), up, retain_graph=True),
        "torch eager rmsnorm fwd+bwd 4096 x 4096": lambda: torch.autograd.grad(torch_rms(xg, wg), (xg, wg), up),
        "policy_loss fwd+bwd 256 x 4096 (PPO dual clip, k3 KL, TIS)": ppo,
    }
    for c in cases.select(["matmul", "rope", "swiglu"], "quick"):  # the suite's quick cases of these families
        if c.case == "fwd":
            calls[f"{c.op} {c.case} {c.shape}"] = c.build("cuda", True).rlk
    rows = []
    for name in ("selected_logp fwd 1 x 151936", "rms_norm fwd 4096 x 4096"):
        try:
            rows += launch_probe(name, calls[name])
        except Exception as ex:  # noqa: BLE001 - reported
            rows.append({"call": f"launch probe: {name}", "error": repr(ex)[:400]})
        print(rows[-1], flush=True)
    for c in cases.select(["matmul", "attention"], "quick"):
        if c.case.startswith(("fwd", "decode")) and ("M=8 " in c.shape or "decode" in c.case):
            try:
                rows += launch_probe(f"{c.op} {c.case} {c.shape}", c.build("cuda", True).rlk)
            except Exception as ex:  # noqa: BLE001 - reported
                rows.append({"call": f"launch probe: {c.op} {c.shape}", "error": repr(ex)[:400]})
            print(rows[-1], flush=True)
    for name in [k for k in calls if "fwd+bwd" in k or "backward" in k or k.startswith("autograd")]:
        for n in (20, 300) if args.sync_only else (20,):
            try:
                # 300 calls of ~0.4 ms under a ~0.15 s sleep: the host's steady state, the device idle
                rows.append(sync_probe(name, calls[name], n=n, sleep_cycles=60_000_000 if n == 20 else 300_000_000))
                if args.sync_only and n == 300:
                    rows[-1]["wall_ms"] = bench.wall_ms(calls[name])
            except Exception as ex:  # noqa: BLE001 - reported
                rows.append({"call": f"sync probe: {name}", "error": repr(ex)[:400]})
            print(rows[-1], flush=True)
    if args.sync_only:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, f, indent=1)
        return
    for name, fn in calls.items():
        try:
            row = {"call": name, "wall_ms": bench.wall_ms(fn), "device_ms": bench.graph_ms(fn) if "cpu" not in name else None}
            if not name.startswith(("empty", "torch add", "autograd")):
                row["profile"] = profile_top(fn)
        except Exception as ex:  # noqa: BLE001 - reported
            row = {"call": name, "error": repr(ex)[:400]}
        rows.append(row)
        print({k: v for k, v in row.items() if k != "profile"}, flush=True)
        if "profile" in row:
            print(row["profile"], flush=True)
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
