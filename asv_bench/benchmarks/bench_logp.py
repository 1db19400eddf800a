"""asv benchmarks of rlk_triton.logp.selected_logp. GPU only: skipped (n/a) without CUDA.

Install the package first (`pip install -e .`); asv runs in that environment
("environment_type": "existing"). From asv_bench/: `asv machine --yes && asv run --quick
--set-commit-hash HEAD`. The track_* figures are medians from device events; the ratios are
against the device-to-device copy rate measured in the same process.
"""
import torch


def _need_gpu():
    if not torch.cuda.is_available():
        raise NotImplementedError("selected_logp benchmarks need a CUDA GPU")


class SelectedLogp:
    params = (["bfloat16", "float32"], [32000, 151936], [False, True])
    param_names = ["dtype", "V", "entropy"]
    rows = 16384
    timeout = 300

    def setup(self, dtype, V, entropy):
        _need_gpu()
        from rlk_triton import bench
        from rlk_triton.logp import selected_logp

        self.bench = bench
        self.copy = bench.copy_rate_gbps()
        self.logits, self.targets, self.grad = bench.logp_inputs(self.rows, V, getattr(torch, dtype))
        self.nbytes = self.logits.numel() * self.logits.element_size()

        def fn(x, t):
            out = selected_logp(x, t, return_entropy=entropy, validate=False)
            return sum(out) if entropy else out

        self.fwd = lambda: fn(self.logits, self.targets)
        self.fwd_bwd = bench.logp_fwd_bwd(fn, self.logits, self.targets, self.grad)

    def track_fwd_ms(self, *_):
        return self.bench.median_ms(self.fwd)

    def track_fwd_bwd_ms(self, *_):
        return self.bench.median_ms(self.fwd_bwd)

    def track_fwd_ratio_vs_copy(self, *_):
        return self.nbytes / self.bench.median_ms(self.fwd) / 1e6 / self.copy

    def track_fwd_bwd_ratio_vs_copy(self, *_):
        return 3 * self.nbytes / self.bench.median_ms(self.fwd_bwd) / 1e6 / self.copy

    def track_fwd_bwd_peak_extra_gib(self, *_):
        return self.bench.peak_extra_gib(self.fwd_bwd)

    track_fwd_ms.unit = "ms"
    track_fwd_bwd_ms.unit = "ms"
    track_fwd_ratio_vs_copy.unit = "x copy rate"
    track_fwd_bwd_ratio_vs_copy.unit = "x copy rate"
    track_fwd_bwd_peak_extra_gib.unit = "GiB"
