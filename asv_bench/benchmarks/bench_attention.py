"""asv benchmarks of rlk_triton.attention. GPU only: skipped (n/a) without CUDA. See bench_logp.py for
how to run asv here. Ratios are against torch SDPA's flash backend measured in the same process."""
import torch


def _need_gpu():
    if not torch.cuda.is_available():
        raise NotImplementedError("attention benchmarks need a CUDA GPU")


class Attention:
    params = ([2048, 8192],)
    param_names = ["seqlen"]
    B, H, HKV, D = 4, 32, 8, 128
    timeout = 600

    def setup(self, seqlen):
        _need_gpu()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from rlk_triton import bench
        from rlk_triton.attention import attention

        self.bench = bench
        B, H, HKV, D, T = self.B, self.H, self.HKV, self.D, seqlen
        g = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda h: torch.randn(B * T, h, D, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()  # noqa: E731
        q, k, v = mk(H), mk(HKV), mk(HKV)
        cu = torch.arange(B + 1, device="cuda", dtype=torch.int32) * T
        grad = torch.randn(B * T, H, D, device="cuda", generator=g).to(torch.bfloat16)
        self.flops = 2 * 2 * B * H * T * T * D / 2
        self.fwd = lambda: attention(q.detach(), k.detach(), v.detach(), cu, max_seqlen=T, validate=False)

        def ours():
            out, _ = attention(q, k, v, cu, max_seqlen=T, validate=False)
            return torch.autograd.grad(out, (q, k, v), grad)

        qs, ks, vs = (x.detach().view(B, T, -1, D).transpose(1, 2).requires_grad_() for x in (q, k, v))
        gs = grad.view(B, T, H, D).transpose(1, 2)

        def flash():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
            return torch.autograd.grad(out, (qs, ks, vs), gs)

        self.ours, self.flash = ours, flash

    def track_fwd_tflops(self, *_):
        return self.flops / self.bench.median_ms(self.fwd) / 1e9

    def track_fwd_bwd_tflops(self, *_):
        return 3.5 * self.flops / self.bench.median_ms(self.ours) / 1e9

    def track_fwd_bwd_speed_vs_flash(self, *_):
        return self.bench.median_ms(self.flash) / self.bench.median_ms(self.ours)

    track_fwd_tflops.unit = track_fwd_bwd_tflops.unit = "TFLOP/s"
    track_fwd_bwd_speed_vs_flash.unit = "x SDPA flash"
