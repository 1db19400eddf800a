"""asv benchmarks of RoPE (rlk_triton.ops.rope.apply_rope) and embedding (rlk_triton.ops.embedding).
GPU only: skipped (n/a) without CUDA. Same setup as bench_logp.py: the track_* figures are medians
from device events; the ratios are against the device-to-device copy rate measured in the same
process, counting the bytes each op must read and write.
"""
import torch


def _need_gpu():
    if not torch.cuda.is_available():
        raise NotImplementedError("RoPE / embedding benchmarks need a CUDA GPU")


class Rope:
    params = (["bfloat16", "float32"], [False, True])
    param_names = ["dtype", "interleaved"]
    tokens, heads, kv_heads, head_dim = 16384, 32, 8, 128
    timeout = 300

    def setup(self, dtype, interleaved):
        _need_gpu()
        from rlk_triton import bench
        from rlk_triton.ops.rope import apply_rope, rope_tables

        self.bench = bench
        self.copy = bench.copy_rate_gbps()
        dt = getattr(torch, dtype)
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(self.tokens, self.heads, self.head_dim, device="cuda", generator=g, dtype=dt)
        k = torch.randn(self.tokens, self.kv_heads, self.head_dim, device="cuda", generator=g, dtype=dt)
        pos = torch.randint(0, 8192, (self.tokens,), device="cuda", generator=g)
        cos, sin = rope_tables(8192, self.head_dim, base=500000.0, device="cuda")
        self.nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        self.fwd = lambda: apply_rope(q, k, cos, sin, pos, interleaved=interleaved, validate=False)
        ql, kl = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        gq, gk = torch.randn_like(q), torch.randn_like(k)

        def fwd_bwd():
            qr, kr = apply_rope(ql, kl, cos, sin, pos, interleaved=interleaved, validate=False)
            return torch.autograd.grad((qr, kr), (ql, kl), (gq, gk))

        self.fwd_bwd = fwd_bwd

    def track_fwd_ms(self, *_):
        return self.bench.median_ms(self.fwd)

    def track_fwd_bwd_ms(self, *_):
        return self.bench.median_ms(self.fwd_bwd)

    def track_fwd_ratio_vs_copy(self, *_):
        return self.nbytes / self.bench.median_ms(self.fwd) / 1e6 / self.copy

    def track_fwd_bwd_ratio_vs_copy(self, *_):
        return 2 * self.nbytes / self.bench.median_ms(self.fwd_bwd) / 1e6 / self.copy

    track_fwd_ms.unit = "ms"
    track_fwd_bwd_ms.unit = "ms"
    track_fwd_ratio_vs_copy.unit = "x copy rate"
    track_fwd_bwd_ratio_vs_copy.unit = "x copy rate"


class Embedding:
    params = (["bfloat16", "float32"], [32000, 151936])
    param_names = ["dtype", "V"]
    tokens, hidden = 16384, 4096
    timeout = 300

    def setup(self, dtype, V):
        _need_gpu()
        from rlk_triton import bench
        from rlk_triton.ops.embedding import embedding

        self.bench = bench
        self.copy = bench.copy_rate_gbps()
        g = torch.Generator(device="cuda").manual_seed(0)
        w = torch.randn(V, self.hidden, device="cuda", generator=g, dtype=getattr(torch, dtype))
        ids = torch.randint(0, V, (self.tokens,), device="cuda", generator=g)
        grad = torch.randn(self.tokens, self.hidden, device="cuda", generator=g, dtype=w.dtype)
        rows = self.tokens * self.hidden * w.element_size()
        self.fwd_bytes = 2 * rows
        self.fwd_bwd_bytes = 3 * rows + w.numel() * w.element_size()  # + read dOut, write all of dW
        self.fwd = lambda: embedding(ids, w, validate=False)
        leaf = w.detach().requires_grad_(True)
        self.fwd_bwd = lambda: torch.autograd.grad(embedding(ids, leaf, validate=False), leaf, grad)

    def track_fwd_ms(self, *_):
        return self.bench.median_ms(self.fwd)

    def track_fwd_bwd_ms(self, *_):
        return self.bench.median_ms(self.fwd_bwd)

    def track_fwd_ratio_vs_copy(self, *_):
        return self.fwd_bytes / self.bench.median_ms(self.fwd) / 1e6 / self.copy

    def track_fwd_bwd_ratio_vs_copy(self, *_):
        return self.fwd_bwd_bytes / self.bench.median_ms(self.fwd_bwd) / 1e6 / self.copy

    def track_fwd_bwd_peak_extra_gib(self, *_):
        return self.bench.peak_extra_gib(self.fwd_bwd)

    track_fwd_ms.unit = "ms"
    track_fwd_bwd_ms.unit = "ms"
    track_fwd_ratio_vs_copy.unit = "x copy rate"
    track_fwd_bwd_ratio_vs_copy.unit = "x copy rate"
    track_fwd_bwd_peak_extra_gib.unit = "GiB"
