"""Benchmark helpers shared by asv_bench/ and scripts/gpu_report.py. GPU only.

Every figure is reported as a ratio against a baseline measured in the same process: the
device-to-device copy rate (bytes read + bytes written per second) for memory-bound kernels.
"""
from __future__ import annotations

import torch


def median_ms(fn, rep_ms: int = 200, warmup_ms: int = 50) -> float:
    """Median time of fn in ms, with device events (triton.testing.do_bench)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def wall_ms(fn, n: int = 200, warmup: int = 10) -> float:
    """Wall-clock ms per call of fn: n calls from the host, one sync at the end (what an eager caller
    pays per call, host work and launches included)."""
    import time

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def graph_ms(fn, rep_ms: int = 200, warmup_ms: int = 50) -> float:
    """Median device time of fn replayed from a CUDA graph: the GPU work alone, without the host's
    Python and launch overhead (which median_ms includes when the host is the bottleneck)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, allocate) off the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return median_ms(graph.replay, rep_ms=rep_ms, warmup_ms=warmup_ms)


def copy_rate_gbps(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy rate, counting the bytes read plus the bytes written."""
    a = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a))
    return 2 * nbytes / ms / 1e6


def peak_extra_gib(fn) -> float:
    """Peak device memory fn allocates beyond what is live before it, in GiB."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def logp_inputs(rows: int = 16384, V: int = 151936, dtype=torch.bfloat16, seed: int = 0):
    """LM-like logits [rows, V], targets, and an upstream gradient, on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(rows, V, device="cuda", generator=g) * 2).to(dtype)
    targets = torch.randint(0, V, (rows,), device="cuda", generator=g)
    grad = torch.randn(rows, device="cuda", generator=g)
    return logits, targets, grad


def logp_fwd_bwd(fn, logits, targets, grad):
    """A forward + backward step of a logp function, without accumulating into .grad."""
    leaf = logits.detach().requires_grad_(True)

    def step():
        lp = fn(leaf, targets)
        return torch.autograd.grad(lp, leaf, grad)[0]

    return step
