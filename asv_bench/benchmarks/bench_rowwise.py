"""asv benchmarks of RMSNorm and SwiGLU (rlk_triton.ops.rmsnorm / swiglu). GPU only: skipped (n/a)
without CUDA. Setup as asv_bench/benchmarks/bench_logp.py. The ratios are bytes moved / time against
the device-to-device copy rate measured in the same process (byte counts: scripts/gpu_bench_rowwise.py).
"""
import torch


def _need_gpu():
    if not torch.cuda.is_available():
        raise NotImplementedError("rowwise benchmarks need a CUDA GPU")


def _fwd_bwd(fn, leaves, grads):
    def step():
        out = fn(*leaves)
        out = out if isinstance(out, tuple) else (out,)
        return torch.autograd.grad(out, leaves, grads[:len(out)])
    return step


class RMSNorm:
    params = ([4096, 8192], [False, True])
    param_names = ["H", "residual"]
    rows = 16384
    timeout = 300

    def setup(self, H, residual):
        _need_gpu()
        from rlk_triton import bench
        from rlk_triton.ops.rmsnorm import rms_norm

        self.bench = bench
        self.copy = bench.copy_rate_gbps()
        g = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda: torch.randn(self.rows, H, device="cuda", generator=g).to(torch.bfloat16)  # noqa: E731
        x, r, dy, dr = mk(), mk(), mk(), mk()
        w = torch.ones(H, device="cuda", dtype=torch.bfloat16)
        leaves = [t.requires_grad_(True) for t in ((x, w, r) if residual else (x, w))]
        fn = (lambda x, w, r: rms_norm(x, w, residual=r)) if residual else (lambda x, w: rms_norm(x, w))
        self.fwd = lambda: fn(*leaves)
        self.fwd_bwd = _fwd_bwd(fn, leaves, (dy, dr))
        self.pass_bytes = self.rows * H * 2
        self.passes = (4, 9) if residual else (2, 5)  # forward, forward + backward

    def track_fwd_ms(self, *_):
        return self.bench.median_ms(self.fwd)

    def track_fwd_bwd_ms(self, *_):
        return self.bench.median_ms(self.fwd_bwd)

    def track_fwd_ratio_vs_copy(self, *_):
        return self.passes[0] * self.pass_bytes / self.bench.median_ms(self.fwd) / 1e6 / self.copy

    def track_fwd_bwd_ratio_vs_copy(self, *_):
        return self.passes[1] * self.pass_bytes / self.bench.median_ms(self.fwd_bwd) / 1e6 / self.copy

    track_fwd_ms.unit = "ms"
    track_fwd_bwd_ms.unit = "ms"
    track_fwd_ratio_vs_copy.unit = "x copy rate"
    track_fwd_bwd_ratio_vs_copy.unit = "x copy rate"


class SwiGLU:
    params = ([14336],)
    param_names = ["I"]
    rows = 16384
    timeout = 300

    def setup(self, I):
        _need_gpu()
        from rlk_triton import bench
        from rlk_triton.ops.swiglu import swiglu

        self.bench = bench
        self.copy = bench.copy_rate_gbps()
        g = torch.Generator(device="cuda").manual_seed(0)
        gate, up, dy = (torch.randn(self.rows, I, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
        leaves = [gate.requires_grad_(True), up.requires_grad_(True)]
        self.fwd = lambda: swiglu(*leaves)
        self.fwd_bwd = _fwd_bwd(swiglu, leaves, (dy,))
        self.pass_bytes = self.rows * I * 2

    def track_fwd_ms(self, *_):
        return self.bench.median_ms(self.fwd)

    def track_fwd_bwd_ms(self, *_):
        return self.bench.median_ms(self.fwd_bwd)

    def track_fwd_ratio_vs_copy(self, *_):
        return 3 * self.pass_bytes / self.bench.median_ms(self.fwd) / 1e6 / self.copy

    def track_fwd_bwd_ratio_vs_copy(self, *_):
        return 8 * self.pass_bytes / self.bench.median_ms(self.fwd_bwd) / 1e6 / self.copy

    track_fwd_ms.unit = "ms"
    track_fwd_bwd_ms.unit = "ms"
    track_fwd_ratio_vs_copy.unit = "x copy rate"
    track_fwd_bwd_ratio_vs_copy.unit = "x copy rate"
