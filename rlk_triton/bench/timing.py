"""How the suite times a call, and the physical ceilings of the run.

Device time: `reps` calls captured in one CUDA graph, median of the replays (CUDA events) / reps:
the GPU work alone, without the host's Python and launch overhead. A call that cannot be captured
(a host sync inside it) is timed with events around eager calls instead, which includes the host's
gaps when the host is the bottleneck; the report says which (`time`).
Wall time: n calls from the host and one sync at the end: what an eager caller pays per call.
Without CUDA (the Triton interpreter) every figure is a host clock: a CPU figure, never a GPU one.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch

DEVICE_TIME = "device"  # CUDA graph replays
EVENT_TIME = "device events"  # CUDA events around eager calls (the host's gaps included)
CPU_TIME = "cpu"  # host clock under the Triton interpreter: not a GPU figure

_REPLAYS = 15
_GRAPH_MS = 2.0  # a graph's length to aim for: long enough for the events' resolution
_WALL_MS = 50.0  # a host loop's length to aim for: long enough to average the host's jitter


def on_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def _sync(device) -> None:
    if on_cuda(device):
        torch.cuda.synchronize()


def _warm(fn, device, n: int = 2) -> float:
    """Call fn n times (compile, autotune, allocator) and return the last call's host ms."""
    ms = 0.0
    for _ in range(n):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        ms = (time.perf_counter() - t0) * 1e3
    return ms


def _reps(estimate_ms: float, most: int, target_ms: float = _GRAPH_MS) -> int:
    return max(1, min(most, int(target_ms / max(estimate_ms, 1e-3))))


def capture(fn: Callable, reps: Optional[int] = None) -> tuple:
    """(graph, reps): fn warmed up, then `reps` calls (default: about _GRAPH_MS of them) captured in
    one CUDA graph, replayed once. Raises when fn cannot be captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream: allocations and compiles stay out of it
        estimate = _warm(fn, "cuda", 3)
    torch.cuda.current_stream().wait_stream(side)
    reps = reps or _reps(estimate, 20)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph, reps


def replay_ms(graph) -> float:
    """Device ms of one replay of a captured graph (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def graph_ms(fn: Callable, reps: Optional[int] = None) -> float:
    """Device ms per call: `reps` calls in one CUDA graph, median of replays / reps. Raises when fn
    cannot be captured."""
    graph, reps = capture(fn, reps)
    return statistics.median(replay_ms(graph) / reps for _ in range(_REPLAYS))


def kernel_times(fn: Callable, top: Optional[int] = None) -> list[dict]:
    """[{kernel, calls, ms}] of one call of fn under torch.profiler, by device time, longest first
    (names cut at 80 characters; `top` keeps the first so many)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    per: dict = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            n, us = per.get(e.name[:80], (0, 0.0))
            per[e.name[:80]] = (n + 1, us + e.device_time_total)
    rows = sorted(({"kernel": k, "calls": n, "ms": us / 1e3} for k, (n, us) in per.items()), key=lambda r: -r["ms"])
    return rows[:top] if top else rows


def events_ms(fn: Callable) -> float:
    """Device ms per call from CUDA events around single eager calls (median)."""
    estimate = _warm(fn, "cuda")
    times = []
    for _ in range(_reps(estimate, 50) + 4):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def cpu_ms(fn: Callable, n: int = 3) -> float:
    """Host ms per call, median of n single calls (the interpreter: one call can take seconds)."""
    _warm(fn, "cpu", 1)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def wall_ms(fn: Callable, n: Optional[int] = None, warmup: int = 3, device="cuda", loops: int = 1) -> float:
    """Wall-clock ms per call: n calls from the host, one sync at the end (what an eager caller pays
    per call, host work and launches included). n defaults to about _WALL_MS of calls. With loops > 1,
    the median over that many such loops: a loop that the machine interrupted (another process, a
    collection) is set aside instead of raising the figure."""
    if loops < 1:
        raise ValueError(f"loops: need at least one, got {loops}")
    estimate = _warm(fn, device, warmup)
    n = n or _reps(estimate, 200, _WALL_MS)
    per_call = []
    for _ in range(loops):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        _sync(device)
        per_call.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(per_call)


def bracketed_ratios(fn: Callable, baseline: Callable, k: int, timer: Callable) -> dict:
    """baseline's time / fn's time, k times, with each timing of fn bracketed by timings of baseline
    before and after it (shared with the neighbouring brackets: k + 1 of them). A drift of the
    machine's state through the run (clocks at the power limit, heat) that is slow against one
    bracket cancels in each ratio; the median of the k then sets aside a bracket hit by a jump.
    timer: fn -> ms (graph_ms on the GPU). {"ratios", "median", "min", "max", "fn_ms", "baseline_ms"}."""
    if k < 1:
        raise ValueError(f"k: need at least one bracket, got {k}")
    base = [timer(baseline)]
    ours = []
    for _ in range(k):
        ours.append(timer(fn))
        base.append(timer(baseline))
    ratios = [(base[i] + base[i + 1]) / 2 / ours[i] for i in range(k)]
    return {"ratios": ratios, "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "fn_ms": ours, "baseline_ms": base}


def peak_extra_mib(fn: Callable, device) -> Optional[float]:
    """Peak device memory one call of fn allocates beyond what is live before it, in MiB (CUDA only:
    None elsewhere)."""
    if not on_cuda(device):
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def copy_rate_gbps(nbytes: int = 2 * 2**30, device="cuda") -> float:
    """The memory ceiling of the run: a device-to-device copy, bytes read + written per second (GB/s).
    A kernel that moves B bytes cannot take less than B / this."""
    if not on_cuda(device):
        nbytes = min(nbytes, 64 * 2**20)  # a host copy: big enough to leave the caches
    a = torch.empty(nbytes // 2, device=device, dtype=torch.bfloat16).fill_(1.0)
    b = torch.empty_like(a)
    ms = graph_ms(lambda: b.copy_(a)) if on_cuda(device) else cpu_ms(lambda: b.copy_(a), 5)
    return 2 * nbytes / ms / 1e6


def matmul_tflops(dtype: torch.dtype, device="cuda") -> float:
    """The compute ceiling of the run: torch.matmul (cuBLAS on CUDA) on a large square, TFLOP/s.
    fp32 is IEEE (TF32 off), as the library's fp32 matmul."""
    n = 8192 if on_cuda(device) else 256
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=g).to(dtype)
    b = torch.randn(n, n, device=device, generator=g).to(dtype)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ms = graph_ms(lambda: torch.matmul(a, b)) if on_cuda(device) else cpu_ms(lambda: torch.matmul(a, b), 5)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return 2 * n**3 / ms / 1e9
