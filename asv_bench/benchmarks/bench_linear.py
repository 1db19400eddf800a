"""asv benchmarks of rlk_triton.logp.linear_logp and the batch-invariant matmul. GPU only: skipped
(n/a) without CUDA. See bench_logp.py for how to run asv here. Ratios are against torch measured in
the same process: eager matmul + log_softmax + gather for linear_logp, torch.matmul (cuBLAS) for the
matmul."""
import torch


def _need_gpu():
    if not torch.cuda.is_available():
        raise NotImplementedError("linear_logp benchmarks need a CUDA GPU")


class LinearLogp:
    params = ([2048, 8192],)
    param_names = ["tokens"]
    H, V = 4096, 151936
    timeout = 600

    def setup(self, tokens):
        _need_gpu()
        from rlk_triton import bench
        from rlk_triton.logp import linear_logp

        self.bench = bench
        g = torch.Generator(device="cuda").manual_seed(0)
        self.h = (torch.randn(tokens, self.H, device="cuda", generator=g) * 0.5).to(torch.bfloat16).requires_grad_()
        self.w = (torch.randn(self.V, self.H, device="cuda", generator=g) * 0.02).to(torch.bfloat16).requires_grad_()
        self.t = torch.randint(0, self.V, (tokens,), device="cuda", generator=g)
        self.g = torch.randn(tokens, device="cuda", generator=g)

        def ours():
            lp = linear_logp(self.h, self.w, self.t, validate=False)
            return torch.autograd.grad(lp, (self.h, self.w), self.g)

        def eager():
            lp = torch.log_softmax((self.h @ self.w.T).float(), -1).gather(-1, self.t[:, None]).squeeze(-1)
            return torch.autograd.grad(lp, (self.h, self.w), self.g)

        self.ours, self.eager = ours, eager
        self.fwd = lambda: linear_logp(self.h.detach(), self.w.detach(), self.t, validate=False)

    def track_fwd_ms(self, *_):
        return self.bench.median_ms(self.fwd)

    def track_fwd_bwd_ms(self, *_):
        return self.bench.median_ms(self.ours)

    def track_fwd_bwd_speed_vs_eager(self, *_):
        return self.bench.median_ms(self.eager) / self.bench.median_ms(self.ours)

    def track_fwd_bwd_extra_gib(self, *_):
        return self.bench.peak_extra_gib(self.ours)

    track_fwd_ms.unit = track_fwd_bwd_ms.unit = "ms"
    track_fwd_bwd_speed_vs_eager.unit = "x eager"
    track_fwd_bwd_extra_gib.unit = "GiB"


class Matmul:
    params = (["8192x8192x8192", "16384x4096x4096", "16384x14336x4096", "8192x151936x4096"],)
    param_names = ["MxNxK"]
    timeout = 300

    def setup(self, shape):
        _need_gpu()
        from rlk_triton import bench
        from rlk_triton.ops.matmul import matmul_into

        self.bench = bench
        m, n, k = (int(x) for x in shape.split("x"))
        self.flops = 2 * m * n * k
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        self.ours = lambda: matmul_into(a, b, out)
        self.cublas = lambda: torch.matmul(a, b)

    def track_tflops(self, *_):
        return self.flops / self.bench.median_ms(self.ours) / 1e9

    def track_speed_vs_cublas(self, *_):
        return self.bench.median_ms(self.cublas) / self.bench.median_ms(self.ours)

    track_tflops.unit = "TFLOP/s"
    track_speed_vs_cublas.unit = "x cuBLAS"
