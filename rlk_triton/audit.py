"""dlogp audit: does the trainer's logp of each sampled token agree with the rollout engine's?

RL frameworks compute a sampled token's log-probability twice, in the rollout engine and in the
trainer; the policy ratio exp(train - rollout) should be 1 before the first update. The audit
measures dlogp = train - rollout over the active tokens of a step and judges it against the op's
contract (contracts/<op>.yaml), so that "aligned" means what the contract says, never a default.

LogpAudit accumulates micro-batches on their device with no host synchronization until report(),
which moves everything to the host in one transfer; compare_logp is one add() and report().

Reports merge across micro-batches and ranks: counts, float64 sums, the max (with its token) and a
fixed histogram of |dlogp| add exactly. Percentiles of one batch are exact; merged ones are read
from the histogram, within a factor PERCENTILE_MERGE_FACTOR of the exact ones (docs/audit.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from . import contracts
from .errors import ContractError, DeviceError, DTypeError, InputError, ShapeError, TemperatureError

PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "not_applicable"
QUANTILES = (0.5, 0.9, 0.99)  # reported as abs_p50, abs_p90, abs_p99

# The |dlogp| histogram: bin 0 holds exact zeros, bin 1 (0, 1e-12), then BINS_PER_DECADE log-spaced
# bins per decade up to 1e3, then [1e3, inf). Fixed, so that histograms of any reports add.
HIST_LOW_EXP, HIST_HIGH_EXP, BINS_PER_DECADE = -12, 3, 50
HIST_EDGES = 10.0 ** (HIST_LOW_EXP + np.arange((HIST_HIGH_EXP - HIST_LOW_EXP) * BINS_PER_DECADE + 1)
                      / BINS_PER_DECADE)
HIST_BINS = len(HIST_EDGES) + 2
HIST_SPEC = (HIST_LOW_EXP, HIST_HIGH_EXP, BINS_PER_DECADE)
_MIDPOINTS = np.sqrt(HIST_EDGES[:-1] * HIST_EDGES[1:])  # what a log bin's values are read as
# A merged percentile whose order statistics lie in [1e-12, 1e3) or are 0 is within this factor of the
# exact one: about 10 ** (1 / (2 * BINS_PER_DECADE)) = 1.0233, half a bin in log space.
PERCENTILE_MERGE_FACTOR = float(np.max(np.maximum(_MIDPOINTS / HIST_EDGES[:-1], HIST_EDGES[1:] / _MIDPOINTS)))

# verl clamps a log ratio to [-20, 20] before exp in its chi-squared metrics (SAFETY_BOUND).
VERL_LOG_RATIO_BOUND = 20.0
# TRL's vllm_importance_sampling_mode values; only the sequence ones are rebuilt from a report.
TRL_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


class ReportMismatchError(InputError):
    """Reports judged by different laws (op, dtype, arch, judgment, contract id, clip range) or
    binned differently cannot be merged: their pass/fail and clip fractions mean different things."""


@dataclass(frozen=True)
class TokenRecord:
    """One token of the batch: where it is, both logps, and the caller's metadata there."""
    sample: int
    position: int
    train: float
    rollout: float
    metadata: dict = field(default_factory=dict)

    @property
    def dlogp(self) -> float:
        return 0.0 if self.train == self.rollout else self.train - self.rollout

    def to_dict(self) -> dict:
        return {"sample": self.sample, "position": self.position, "train": _json_float(self.train),
                "rollout": _json_float(self.rollout), "dlogp": _json_float(self.dlogp),
                "metadata": {k: _plain(v) for k, v in self.metadata.items()}}


@dataclass(frozen=True)
class SampleStats:
    """Metrics of one sample (leading dim) over its finite active tokens; None where it has none."""
    active: int
    nonfinite: int
    dlogp_sum: float | None  # the log of the sequence's importance ratio over its finite active tokens
    dlogp_mean: float | None
    abs_mean: float | None
    abs_max: float | None
    ratio0: float | None
    approx_kl0: float | None
    clipfrac0: float | None

    def to_dict(self) -> dict:
        return {k: _json_float(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class LogpAuditReport:
    """dlogp = train - rollout over the active tokens of one batch (or of merged batches).

    Holds what merges exactly (counts, float64 sums, the max and its token, the histogram, the
    per-sample list); means, percentiles and the status are derived from it. Tokens whose dlogp is
    not finite (a NaN on either side, an infinity on one side only) are counted in `nonfinite`, fail
    the report, and are left out of every other metric, so that no metric is ever NaN.
    Active tokens with a non-finite train or rollout logp are counted in `nonfinite_inputs`, always
    reported; equal infinities on both sides give dlogp 0, which is no failure by itself.
    """
    op: str
    dtype: str
    arch: str | None
    judgment: str
    kind: str
    contract_id: str
    bound: dict | None  # forward_accuracy's {atol, rtol} of output logp; None when bitwise
    clip_range: tuple  # (eps_low, eps_high)
    samples: int
    tokens: int
    active: int
    nonfinite: int
    nonfinite_inputs: int  # active tokens whose train or rollout logp is not finite
    exact: int  # active tokens with dlogp exactly 0
    clipped: int
    sum_dlogp: float
    sum_abs: float
    sum_ratio: float
    sum_kl: float
    sum_pdiff: float  # sum of |exp(train) - exp(rollout)| over the finite active tokens
    sum_pdiff_sq: float  # sum of its squares
    sum_chi2_token: float  # sum of exp(2 * clamp(dlogp, +-20)) - 1: verl's chi2_token terms
    pdiff_max: float | None
    abs_max: float | None
    worst: TokenRecord | None  # the token of abs_max (the first one on ties)
    first_nonfinite: TokenRecord | None
    first_nonfinite_input: TokenRecord | None  # the first active token counted in nonfinite_inputs
    worst_ratio: float | None  # forward_accuracy: max |dlogp| / allowed; None when bitwise
    histogram: tuple
    exact_percentiles: tuple | None  # from the values; None once merged from several batches
    per_sample: tuple
    reports: dict | None = None  # merged: how many constituents passed, failed, were not applicable
    hist_spec: tuple = HIST_SPEC

    # ---- derived metrics ----
    @property
    def finite(self) -> int:
        return self.active - self.nonfinite

    @property
    def coverage(self) -> float | None:
        return self.active / self.tokens if self.tokens else None

    def _mean(self, total):
        return total / self.finite if self.finite else None

    @property
    def dlogp_mean(self) -> float | None:
        return self._mean(self.sum_dlogp)

    @property
    def abs_mean(self) -> float | None:
        return self._mean(self.sum_abs)

    @property
    def ratio0(self) -> float | None:
        return self._mean(self.sum_ratio)

    @property
    def approx_kl0(self) -> float | None:
        return self._mean(self.sum_kl)

    @property
    def clipfrac0(self) -> float | None:
        return self._mean(self.clipped)

    def framework_metrics(self, *, trl_is_mode: str = "sequence_mask", trl_is_clip_min: float | None = None,
                          trl_is_clip_max: float | None = 3.0) -> dict:
        """These numbers under the names RL frameworks log, to cross-check them (docs/audit.md).

        All float64, over the finite active tokens, or for the per-sequence ones over the samples that
        have one, with m_i and s_i the mean and the sum of sample i's dlogp. None where there is no
        finite active token, never NaN.
        verl: |exp(train) - exp(rollout)|'s mean, max and std (torch.std's n - 1 denominator; None for
        fewer than 2 tokens); rollout_corr/kl = -mean dlogp, k3_kl = mean exp(d) - 1 - d, log_ppl_diff
        (and its abs mean, max, min) over samples of -m_i, ppl_ratio = mean exp(-m_i), chi2_token =
        mean exp(2 clamp(d, +-20)) - 1, chi2_seq = mean over samples of exp(2 clamp(s_i, +-20)) - 1.
        slime: mean |dlogp|. NeMo-RL: gen_kl_error = mean exp(d) - 1 - d (its default kl_type k3).
        TRL: mean and max |dlogp|; min, mean and max of the sequence ratios exp(s_i), truncated to or
        masked to 0 outside [trl_is_clip_min, trl_is_clip_max] as trl_is_mode says (GRPOConfig's
        vllm_importance_sampling_mode, _clip_min, _clip_max; the defaults are TRL's). The token modes
        raise InputError: their clamp or mask acts on each token, which the report's sums cannot undo.
        """
        ratio_of = _trl_sequence_ratio(trl_is_mode, trl_is_clip_min, trl_is_clip_max)
        n = self.finite
        std = None
        if n >= 2:
            s1, s2 = self.sum_pdiff, self.sum_pdiff_sq
            var = (s2 - s1 * (s1 / n)) / (n - 1)  # rounding can make it a hair below 0
            std = None if math.isnan(var) else math.sqrt(max(var, 0.0))  # NaN: the sums overflowed
        # Per sequence, from the per-sample list (concatenated by merge, so these merge exactly): verl's
        # mean_rollout - mean_train is -m_i; 0.0 - x rather than -x, so that no -0.0 is reported.
        seq_sums = [s.dlogp_sum for s in self.per_sample if s.dlogp_sum is not None]
        log_ppl_diffs = [0.0 - s.dlogp_mean for s in self.per_sample if s.dlogp_mean is not None]
        k = len(seq_sums)

        def over_samples(values):
            return _add(values) / k if k else None

        bound = VERL_LOG_RATIO_BOUND
        trl_ratios = [ratio_of(s) for s in seq_sums]
        return {
            "training/rollout_probs_diff_mean": self.sum_pdiff / n if n else None,
            "training/rollout_probs_diff_max": self.pdiff_max,
            "training/rollout_probs_diff_std": std,
            "rollout_corr/kl": (0.0 - self.sum_dlogp) / n if n else None,
            "rollout_corr/k3_kl": self.approx_kl0,
            "rollout_corr/log_ppl_diff": over_samples(log_ppl_diffs),
            "rollout_corr/log_ppl_abs_diff": over_samples(abs(x) for x in log_ppl_diffs),
            "rollout_corr/log_ppl_diff_max": max(log_ppl_diffs) if k else None,
            "rollout_corr/log_ppl_diff_min": min(log_ppl_diffs) if k else None,
            "rollout_corr/ppl_ratio": over_samples(_exp(x) for x in log_ppl_diffs),
            "rollout_corr/chi2_token": self.sum_chi2_token / n if n else None,
            "rollout_corr/chi2_seq": over_samples(math.expm1(2.0 * min(max(s, -bound), bound)) for s in seq_sums),
            "train_rollout_logprob_abs_diff": self.abs_mean,
            "sampling/sampling_logp_difference/mean": self.abs_mean,
            "sampling/sampling_logp_difference/max": self.abs_max,
            "sampling/importance_sampling_ratio/min": min(trl_ratios) if k else None,
            "sampling/importance_sampling_ratio/mean": over_samples(trl_ratios),
            "sampling/importance_sampling_ratio/max": max(trl_ratios) if k else None,
            "gen_kl_error": self.approx_kl0,
        }

    @property
    def percentiles_exact(self) -> bool:
        return self.exact_percentiles is not None

    @property
    def percentiles(self) -> dict | None:
        """{q: |dlogp| quantile} (linear interpolation, numpy's default): exact from the values for
        one batch, else from the merged histogram within PERCENTILE_MERGE_FACTOR."""
        if not self.finite:
            return None
        if self.exact_percentiles is not None:
            return dict(zip(QUANTILES, self.exact_percentiles))
        return dict(zip(QUANTILES, _histogram_quantiles(self.histogram, self.finite, self.abs_max)))

    @property
    def status(self) -> str:
        if not self.active:
            return NOT_APPLICABLE
        if self.nonfinite:
            return FAIL
        if self.kind == "bitwise":
            return PASS if self.exact == self.active else FAIL
        return PASS if self.worst_ratio <= 1.0 else FAIL

    @property
    def passed(self) -> bool | None:
        return None if self.status == NOT_APPLICABLE else self.status == PASS

    @property
    def report_counts(self) -> dict:
        """{status: how many constituent reports had it}; a single report counts itself."""
        if self.reports is not None:
            return dict(self.reports)
        return {s: int(s == self.status) for s in (PASS, FAIL, NOT_APPLICABLE)}

    # ---- merging ----
    @classmethod
    def merge(cls, *reports: LogpAuditReport) -> LogpAuditReport:
        """One report of the batches of `reports` laid end to end along the sample dim.

        Exact for counts, the maxima and the max's token (sample indices are offset by the samples of
        the reports before), the histogram and the per-sample list; sums up to float64 addition.
        Percentiles come from the histogram unless only one report has finite active tokens.
        Status: fail if any constituent failed, pass if all applicable ones passed, else
        not_applicable. Raises ReportMismatchError when the reports were judged by different laws.
        """
        if len(reports) == 1 and isinstance(reports[0], (list, tuple)):
            reports = tuple(reports[0])
        if not reports:
            raise InputError("reports", "nothing to merge")
        for r in reports:
            if not isinstance(r, LogpAuditReport):
                raise InputError("reports", f"expected LogpAuditReport, got {type(r).__name__}")
        first = reports[0]
        law = ("op", "dtype", "arch", "judgment", "kind", "contract_id", "bound", "clip_range", "hist_spec")
        for r in reports[1:]:
            for k in law:
                if getattr(r, k) != getattr(first, k):
                    raise ReportMismatchError("reports", f"cannot merge reports with different {k}: "
                                                         f"{getattr(first, k)!r} vs {getattr(r, k)!r}")
        offset, worst, abs_max, first_nonfinite, first_bad_input = 0, None, None, None, None
        for r in reports:
            if r.abs_max is not None and (abs_max is None or r.abs_max > abs_max):
                abs_max, worst = r.abs_max, _shifted(r.worst, offset)
            if first_nonfinite is None and r.first_nonfinite is not None:
                first_nonfinite = _shifted(r.first_nonfinite, offset)
            if first_bad_input is None and r.first_nonfinite_input is not None:
                first_bad_input = _shifted(r.first_nonfinite_input, offset)
            offset += r.samples
        with_values = [r for r in reports if r.finite]
        ratios = [r.worst_ratio for r in reports if r.worst_ratio is not None]
        pdiff_maxes = [r.pdiff_max for r in reports if r.pdiff_max is not None]
        return cls(
            op=first.op, dtype=first.dtype, arch=first.arch, judgment=first.judgment, kind=first.kind,
            contract_id=first.contract_id, bound=first.bound, clip_range=first.clip_range,
            samples=offset, **{k: sum(getattr(r, k) for r in reports)
                               for k in ("tokens", "active", "nonfinite", "nonfinite_inputs", "exact", "clipped")},
            **{k: _add(getattr(r, k) for r in reports)
               for k in ("sum_dlogp", "sum_abs", "sum_ratio", "sum_kl", "sum_pdiff", "sum_pdiff_sq", "sum_chi2_token")},
            pdiff_max=max(pdiff_maxes) if pdiff_maxes else None,
            abs_max=abs_max, worst=worst, first_nonfinite=first_nonfinite, first_nonfinite_input=first_bad_input,
            worst_ratio=max(ratios) if ratios else None,
            histogram=tuple(int(c) for c in np.sum([r.histogram for r in reports], axis=0)),
            exact_percentiles=with_values[0].exact_percentiles if len(with_values) == 1 else None,
            per_sample=tuple(s for r in reports for s in r.per_sample),
            reports={k: sum(r.report_counts[k] for r in reports) for k in (PASS, FAIL, NOT_APPLICABLE)},
            hist_spec=first.hist_spec,
        )

    # ---- output ----
    def to_dict(self, *, per_sample: bool = True, histogram: bool = False) -> dict:
        """JSON-serializable (json.dumps(..., allow_nan=False) works): no tensors, no NaN. Missing
        metrics are None; an infinite value (a worst ratio against a zero bound, exp of a huge dlogp)
        is written as the string "inf"."""
        pct = self.percentiles or {}
        out = {
            "op": self.op, "dtype": self.dtype, "arch": self.arch, "judgment": self.judgment,
            "kind": self.kind, "contract_id": self.contract_id, "status": self.status,
            "bound": self.bound, "clip_range": list(self.clip_range),
            "samples": self.samples, "tokens": self.tokens, "active": self.active,
            "coverage": self.coverage, "nonfinite": self.nonfinite, "nonfinite_inputs": self.nonfinite_inputs,
            "exact": self.exact,
            "dlogp_mean": self.dlogp_mean, "abs_mean": self.abs_mean, "abs_max": self.abs_max,
            **{f"abs_p{round(q * 100)}": pct.get(q) for q in QUANTILES},
            "percentiles_exact": self.percentiles_exact,
            "ratio0": self.ratio0, "clipfrac0": self.clipfrac0, "approx_kl0": self.approx_kl0,
            "worst_ratio": self.worst_ratio,
            "worst_token": self.worst.to_dict() if self.worst else None,
            "first_nonfinite_token": self.first_nonfinite.to_dict() if self.first_nonfinite else None,
            "first_nonfinite_input_token": (self.first_nonfinite_input.to_dict()
                                            if self.first_nonfinite_input else None),
            "reports": self.report_counts,
        }
        out = {k: _json_float(v) for k, v in out.items()}
        out["framework_metrics"] = {k: _json_float(v) for k, v in self.framework_metrics().items()}
        if per_sample:
            out["per_sample"] = [s.to_dict() for s in self.per_sample]
        if histogram:
            out["histogram"] = {"low": float(HIST_EDGES[0]), "high": float(HIST_EDGES[-1]),
                                "bins_per_decade": BINS_PER_DECADE,
                                "nonzero": [[i, c] for i, c in enumerate(self.histogram) if c]}
        return out

    def summary(self) -> str:
        """One line for a training log."""
        head = f"{self.op}/{self.dtype} {self.judgment}: {self.status}"
        if not self.active:
            return f"{head} (no active tokens)"
        pct = self.percentiles or {}
        ratio = f" worst ratio {self.worst_ratio:.3g}" if self.worst_ratio is not None else ""
        parts = [f"{head}{ratio}", f"active {self.active}/{self.tokens}", f"exact {self.exact}"]
        if self.nonfinite:
            parts.append(f"nonfinite {self.nonfinite}")
        if self.nonfinite_inputs:
            parts.append(f"nonfinite inputs {self.nonfinite_inputs}")
        if self.finite:
            parts += [f"|dlogp| max {self.abs_max:.3g} p99 {pct[0.99]:.3g}",
                      f"ratio0 {self.ratio0:.9g} clipfrac0 {self.clipfrac0:.3g} kl0 {self.approx_kl0:.3g}"]
        return "; ".join(parts)


def merge_reports(reports) -> LogpAuditReport:
    """LogpAuditReport.merge over an iterable of reports, in its order."""
    return LogpAuditReport.merge(*list(reports))


def merge_across_ranks(report: LogpAuditReport, group=None) -> LogpAuditReport:
    """The merge of every rank's report, in rank order: the same report on every rank.

    Sample indices are global in rank order (rank 0's samples first). Without an initialized
    torch.distributed process group this process is the whole world and its report is returned.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return LogpAuditReport.merge(report)
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, report, group=group)
    return LogpAuditReport.merge(*gathered)


# ---- computing a report ----

class LogpAudit:
    """Accumulates the dlogp audit of a step's micro-batches on their device, with no host sync.

        audit = LogpAudit(dtype=torch.bfloat16, clip_range=(0.2, 0.28), expect_bitwise=False)
        for mb in micro_batches:
            audit.add(train_logp, mb.rollout_logp, mb.loss_mask, row_scale=row_scale)
        report = audit.report()  # the one host transfer

    The law (op, dtype, clip_range, expect_bitwise, arch) is resolved against the contract here,
    once, on the host: a missing op, dtype or judgment raises ContractError (it fails closed).

    add() only enqueues device work: no .item(), .cpu(), .tolist(), no bool() or float() of a
    tensor, no data-dependent shape or branch. Checks of shapes, dtypes and devices stay eager; the
    checks that need values (a mask holding only 0 and 1, row_scale finite and >= 0 at the active
    tokens) are device flags, raised by report() as InputError naming the argument. Worst and first
    non-finite tokens are kept as device indices and values and resolved at report time.

    report() is the LogpAuditReport of the add()s laid end to end along the sample dim: the same
    report as LogpAuditReport.merge of one compare_logp report per add(), bit for bit, except that
    percentiles are exact only where the first add() with any token holds every finite active token
    (one add(), as in compare_logp, in particular); otherwise they come from the histogram. Its
    `reports` counts the add()s that passed, failed and were not applicable (None for one add()).
    """

    def __init__(self, *, op: str = "selected_logp", dtype, clip_range=0.2, expect_bitwise: bool = False,
                 arch: str | None = None):
        self._law = _resolve_law(op, dtype, bool(expect_bitwise), arch)
        self.clip_range = _check_clip_range(clip_range)
        self.expect_bitwise = bool(expect_bitwise)
        self.reset()

    def reset(self) -> None:
        """Forget every add(); the law stays."""
        self._parts = []
        self._device = None
        self._hist = None

    @property
    def adds(self) -> int:
        return len(self._parts)

    @property
    def device(self) -> torch.device | None:
        """The device of the add()s (None before the first)."""
        return self._device

    def add(self, train_logp, rollout_logp, mask=None, *, row_scale=None, metadata: dict | None = None) -> None:
        """Audit one micro-batch: dlogp = train_logp - rollout_logp over the active tokens.

        train_logp, rollout_logp: float tensors [B, T] (sample, position) or [N] (one sample).
        mask: same shape, bool or 0/1; None means every token is active.
        row_scale: required for forward_accuracy (ignored when bitwise); a float or a tensor
          broadcastable to the logp's shape (for selected_logp: logp_row_scale of the logits).
        metadata: {name: value}; tensors shaped like the logp are read at the worst (and first
          non-finite) token, other tensors are copied as lists, other values as they are.

        Device work only, on the current stream; the inputs may be reused once it returns.
        """
        train, rollout, active, shape, mask_ok = _check_logp(train_logp, rollout_logp, mask)
        device = train.device
        if self._device is not None and device != self._device:
            raise DeviceError("train_logp", f"on {device}, the earlier add()s on {self._device}")
        if metadata is not None and (not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata)):
            raise InputError("metadata", "must be a dict with str keys")
        scale = scale_ok = None
        if not self.expect_bitwise:
            if row_scale is None:
                raise InputError("row_scale", f"required to judge {self._law['judgment']}: the allowed |dlogp| is "
                                              "2 * (atol + rtol * row_scale) (see audit.logp_row_scale)")
            scale, scale_ok = _check_row_scale(row_scale, shape, device, active)
        edges, quantiles = _device_constants(device)
        eps_low, eps_high = self.clip_range

        B, T = train.shape
        numel = B * T
        t64, r64 = train.double(), rollout.double()
        d = torch.where(t64 == r64, 0.0, t64 - r64)  # equal infinities are no difference
        finite = active & torch.isfinite(d)
        nonfinite = active & ~finite
        bad_input = active & ~(torch.isfinite(t64) & torch.isfinite(r64))
        d = torch.where(finite, d, 0.0)
        a = d.abs()
        ratio = torch.where(finite, torch.exp(d), 0.0)
        kl = torch.where(finite, torch.expm1(d) - d, 0.0)  # exp(d) - 1 - d without cancelling the 1
        clipped = finite & ((ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high))
        row_max = a.amax(1) if T else a.new_zeros(B)  # a is 0 off the finite active tokens
        # |exp(t) - exp(r)| = exp(max(t, r)) * (1 - exp(-|d|)): no cancellation, no inf - inf.
        pdiff = torch.where(finite & (a != 0), torch.exp(torch.maximum(t64, r64)) * -torch.expm1(-a), 0.0)
        # verl's rho^2 - 1 on its clamped log ratio, as expm1 so that the 1 does not cancel (0 where d is 0).
        chi2 = torch.expm1(2.0 * d.clamp(-VERL_LOG_RATIO_BOUND, VERL_LOG_RATIO_BOUND))

        rows_i = torch.stack([active.sum(1), nonfinite.sum(1), finite.sum(1), (finite & (a == 0)).sum(1),
                              clipped.sum(1)])  # int64 counts per sample, exact
        rows_f = torch.stack([d.sum(1), a.sum(1), ratio.sum(1), kl.sum(1), row_max])
        counts = torch.cat([rows_i.sum(1), bad_input.sum().reshape(1)])  # _I_ACTIVE .. _I_BAD_INPUT
        sums = torch.cat([rows_f[:4].sum(1), torch.stack([pdiff.sum(), pdiff.square().sum(), chi2.sum()])])

        part = _Part(B, T, len(shape))
        if numel:
            key = torch.where(finite, a, -1.0)
            # argmax returns the first of the largest: the worst token, the first non-finite dlogp and
            # the first non-finite input (index 0 when there is none; the counts tell).
            flat = torch.stack([key.argmax(), nonfinite.to(torch.uint8).argmax(), bad_input.to(torch.uint8).argmax()])
            rows = torch.div(flat, T, rounding_mode="floor")
            cols = (flat - rows * T).unsqueeze(1)

            def pick(x):  # x[rows, cols] without flattening x (an expanded metadata tensor stays uncopied)
                return x.index_select(0, rows).gather(1, cols).squeeze(1)

            worst_ratio = a.new_zeros(())
            if scale is not None:
                allowed = 2.0 * (self._law["bound"]["atol"] + self._law["bound"]["rtol"] * scale)
                worst_ratio = torch.where(finite & (a != 0), a / allowed, 0.0).max()
            tail = torch.cat([pick(key)[:1], torch.stack([pick(t64), pick(r64)], 1).reshape(-1),
                              torch.stack([worst_ratio, pdiff.max()])])
            part.meta = _metadata_on_device(metadata, shape, device, pick)
        else:
            flat = torch.zeros(3, dtype=torch.int64, device=device)
            tail = t64.new_zeros(_N_FLOATS - _N_SUMS)
            part.meta = _metadata_on_device(metadata, shape, device, None)
        ok = torch.ones((), dtype=torch.bool, device=device)
        flags = torch.stack([ok if mask_ok is None else mask_ok, ok if scale_ok is None else scale_ok])
        ints = torch.cat([counts, flat, flags.to(torch.int64)])
        floats = torch.cat([sums, tail])
        part.tensors = [ints, floats.view(torch.int64), rows_i.reshape(-1), rows_f.reshape(-1).view(torch.int64)]
        part.tensors += [t for _, kind, t in part.meta if kind in _PACKED_KINDS]

        if numel and not any(p.B * p.T for p in self._parts):
            # The first add() with tokens keeps the order statistics that its exact percentiles need
            # (those of a report holding all the finite tokens). Their indices depend on the finite
            # count, so they are computed on the device: the finite |dlogp| sort first (the rest is
            # +inf), and numpy's 'linear' positions floor((n - 1) * q), + 1 are exact in float64.
            srt = torch.sort(torch.where(finite, a, math.inf).reshape(-1)).values
            nm1 = (counts[_I_FINITE] - 1).double()
            v = nm1 * quantiles
            top = v >= nm1
            lo = torch.where(top, nm1, torch.floor(v))
            hi = torch.where(top, nm1, lo + 1.0)
            idx = torch.stack([lo, hi], 1).reshape(-1).long().clamp(0, numel - 1)
            part.tensors.append(srt.index_select(0, idx).view(torch.int64))
            part.picks = True

        # State changes last, once nothing can raise.
        if self._hist is None:
            self._device = device
            self._hist = torch.zeros(HIST_BINS, dtype=torch.int64, device=device)
        bins = torch.where(a == 0, 0, torch.bucketize(a, edges, right=True) + 1)
        # Integer counts: scatter_add_'s atomic adds are exact and order-independent, so the histogram
        # is deterministic; bincount would sync on CUDA (it computes its output size).
        self._hist.scatter_add_(0, bins.reshape(-1), finite.reshape(-1).to(torch.int64))
        self._parts.append(part)

    def report(self) -> LogpAuditReport:
        """The LogpAuditReport of every add() so far: one device-to-host transfer.

        Raises InputError naming `mask` or `row_scale` when an add() got a mask with values other
        than 0 and 1, or a row_scale not finite and >= 0 at an active token.
        """
        law = self._law
        if not self._parts:
            return LogpAuditReport(
                **law, clip_range=self.clip_range, samples=0, tokens=0, active=0, nonfinite=0,
                nonfinite_inputs=0, exact=0, clipped=0, sum_dlogp=0.0, sum_abs=0.0, sum_ratio=0.0,
                sum_kl=0.0, sum_pdiff=0.0, sum_pdiff_sq=0.0, sum_chi2_token=0.0, pdiff_max=None, abs_max=None,
                worst=None, first_nonfinite=None, first_nonfinite_input=None, worst_ratio=None,
                histogram=(0,) * HIST_BINS, exact_percentiles=None, per_sample=())
        host = torch.cat([t for p in self._parts for t in p.tensors] + [self._hist]).cpu().numpy()
        reader = _Reader(host)
        parsed = [p.read(reader) for p in self._parts]
        histogram = tuple(reader.ints(HIST_BINS).tolist())
        for i, (ints, *_) in enumerate(parsed):
            where = f" (add() number {i})" if len(parsed) > 1 else ""
            if not ints[_I_MASK_OK]:
                raise InputError("mask", f"must hold only 0 and 1{where}")
            if not ints[_I_SCALE_OK]:
                raise InputError("row_scale", f"must be finite and >= 0 at every active token{where}")
        reports = [self._part_report(p, *values) for p, values in zip(self._parts, parsed)]
        if len(reports) == 1:
            return replace(reports[0], histogram=histogram)
        return replace(LogpAuditReport.merge(*reports), histogram=histogram)

    def _part_report(self, part, ints, floats, rows_i, rows_f, metas, picks) -> LogpAuditReport:
        """One add()'s report from its host values (histogram left empty: the accumulated one is set)."""
        n_active, n_nonfinite, n_finite, n_exact, n_clipped, n_bad_input = ints[:_I_FLAT]
        s_dlogp, s_abs, s_ratio, s_kl, s_pdiff, s_pdiff_sq, s_chi2, key_at, *vals, worst_ratio, pdiff_max = floats
        B, T = part.B, part.T

        def token(slot):
            b, t = divmod(ints[_I_FLAT + slot], T)
            return TokenRecord(b, t, vals[2 * slot], vals[2 * slot + 1], part.metadata_at(slot, b, t, metas))

        per_sample = []
        for i in range(B):
            act, bad, fin, _, clp = (c[i] for c in rows_i)
            sd, sa, sr, sk, mx = (s[i] for s in rows_f)
            per_sample.append(SampleStats(act, bad, sd if fin else None, sd / fin if fin else None,
                                          sa / fin if fin else None, mx if fin else None,
                                          sr / fin if fin else None, sk / fin if fin else None,
                                          clp / fin if fin else None))
        exact_pct = None
        if picks is not None and n_finite:
            exact_pct = tuple(_lerp(picks[2 * k], picks[2 * k + 1], g)
                              for k, (_, _, g) in enumerate(_order_positions(n_finite)))
        return LogpAuditReport(
            **self._law, clip_range=self.clip_range, samples=B, tokens=B * T, active=n_active,
            nonfinite=n_nonfinite, nonfinite_inputs=n_bad_input, exact=n_exact, clipped=n_clipped,
            sum_dlogp=s_dlogp, sum_abs=s_abs, sum_ratio=s_ratio, sum_kl=s_kl, sum_pdiff=s_pdiff,
            sum_pdiff_sq=s_pdiff_sq, sum_chi2_token=s_chi2, pdiff_max=pdiff_max if n_finite else None,
            abs_max=key_at if n_finite else None, worst=token(0) if n_finite else None,
            first_nonfinite=token(1) if n_nonfinite else None,
            first_nonfinite_input=token(2) if n_bad_input else None,
            worst_ratio=worst_ratio if n_finite and not self.expect_bitwise else None,
            histogram=(0,) * HIST_BINS, exact_percentiles=exact_pct, per_sample=tuple(per_sample),
        )


def compare_logp(train_logp, rollout_logp, mask=None, *, op: str = "selected_logp", dtype,
                 clip_range=0.2, row_scale=None, expect_bitwise: bool = False, arch: str | None = None,
                 metadata: dict | None = None) -> LogpAuditReport:
    """Audit dlogp = train_logp - rollout_logp over the active tokens, judged by op's contract.

    train_logp, rollout_logp: float tensors [B, T] (sample, position) or [N] (one sample).
    mask: same shape, bool or 0/1; None means every token is active.
    dtype: the logits' dtype the logp was computed from (torch.dtype or name): picks the contract row.
    clip_range: eps, or (eps_low, eps_high): clipfrac0 counts exp(dlogp) outside [1 - eps_low, 1 + eps_high].
    expect_bitwise: both sides ran the same backend and build, so the judgment is forward_invariance
      (every active dlogp exactly 0). Otherwise forward_accuracy: each side is within
      atol + rtol * row_scale of float64, so |dlogp| may reach 2 * (atol + rtol * row_scale).
    row_scale: required for forward_accuracy (ignored when bitwise); a float or a tensor broadcastable
      to the logp's shape (for selected_logp: max |logits / T| + log V of the token's row, logp_row_scale).
    arch: the contract's per-arch override to apply (None: the base rows).
    metadata: {name: value}; tensors shaped like the logp are read at the worst (and first
      non-finite) token, other tensors are copied as lists, other values as they are.

    LogpAudit with one add() and its report(): all arithmetic is float64 on the tensors' device,
    and one host transfer brings the small results back. A missing op, dtype or judgment raises
    ContractError: there is no default law.
    """
    audit = LogpAudit(op=op, dtype=dtype, clip_range=clip_range, expect_bitwise=expect_bitwise, arch=arch)
    audit.add(train_logp, rollout_logp, mask, row_scale=row_scale, metadata=metadata)
    return audit.report()


# The layout of one add()'s values: int64 counts, indices and flags, then float64 sums and values.
_I_ACTIVE, _I_NONFINITE, _I_FINITE, _I_EXACT, _I_CLIPPED, _I_BAD_INPUT, _I_FLAT = range(7)
_I_MASK_OK, _I_SCALE_OK = _I_FLAT + 3, _I_FLAT + 4
_N_INTS = _I_FLAT + 5
_N_SUMS = 7
_N_FLOATS = _N_SUMS + 1 + 6 + 2  # sums; |dlogp| at the worst token; (train, rollout) at its 3 tokens; ratio, pdiff max
_PACKED_KINDS = ("bool", "int", "float")
_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class _Part:
    """What one add() left: its shape, its device tensors (all int64, float64 ones bit-cast) and how
    to read them back, and its metadata."""

    def __init__(self, B, T, ndim):
        self.B, self.T, self.ndim = B, T, ndim
        self.tensors, self.meta, self.picks = [], [], False

    def read(self, reader):
        ints = reader.ints(_N_INTS).tolist()
        floats = reader.floats(_N_FLOATS).tolist()
        rows_i = reader.ints(5 * self.B).reshape(5, self.B).tolist()
        rows_f = reader.floats(5 * self.B).reshape(5, self.B).tolist()
        metas = {key: reader.ints(3) for key, kind, _ in self.meta if kind in _PACKED_KINDS}
        picks = reader.floats(2 * len(QUANTILES)).tolist() if self.picks else None
        return ints, floats, rows_i, rows_f, metas, picks

    def metadata_at(self, slot, b, t, metas) -> dict:
        out = {}
        for key, kind, v in self.meta:
            if kind == "bool":
                v = bool(metas[key][slot])
            elif kind == "int":
                v = int(metas[key][slot])
            elif kind == "float":
                v = float(metas[key].view(np.float64)[slot])
            elif kind == "item":  # logp-shaped, but not packable on the logp's device: read here
                v = (v[t] if self.ndim == 1 else v[b, t]).item()
            elif kind == "list":
                v = v.tolist()
            out[key] = v
        return out


class _Reader:
    def __init__(self, host: np.ndarray):
        self.host, self.pos = host, 0

    def ints(self, n: int) -> np.ndarray:
        self.pos += n
        return self.host[self.pos - n:self.pos]

    def floats(self, n: int) -> np.ndarray:
        return self.ints(n).view(np.float64)


def _metadata_on_device(metadata, shape, device, pick) -> list:
    """[(key, kind, value)]: a logp-shaped tensor of a plain dtype on the logp's device is read at the
    three tokens now, on the device (int64, float64 bit-cast); other tensors are cloned and read at
    report time; other values are kept as they are."""
    out = []
    for key, v in (metadata or {}).items():
        if not torch.is_tensor(v):
            out.append((key, "const", v))
            continue
        v = v.detach()
        if tuple(v.shape) != shape:
            out.append((key, "list", v.clone()))
        elif pick is not None and v.device == device and v.dtype in (torch.bool, *_INT_DTYPES, *_FLOAT_DTYPES):
            at = pick(v.unsqueeze(0) if len(shape) == 1 else v)
            if v.is_floating_point():
                out.append((key, "float", at.double().view(torch.int64)))
            else:
                out.append((key, "bool" if v.dtype == torch.bool else "int", at.long()))
        else:
            out.append((key, "item", v.clone()))
    return out


_CONSTANTS: dict = {}


def _device_constants(device: torch.device) -> tuple:
    """(HIST_EDGES, QUANTILES) as float64 tensors on `device`, made once per device. On CUDA the copy
    goes from pinned memory with non_blocking=True: a copy from pageable memory would synchronize."""
    got = _CONSTANTS.get(device)
    if got is None:
        host = torch.from_numpy(np.concatenate([HIST_EDGES, QUANTILES]))
        if device.type == "cuda":
            host = host.pin_memory()
        both = host.to(device, non_blocking=True)
        got = _CONSTANTS[device] = (both[:len(HIST_EDGES)], both[len(HIST_EDGES):])
    return got


def _resolve_law(op, dtype, expect_bitwise, arch) -> dict:
    """The report fields that name the law: the judgment's contract row, looked up once; fails closed."""
    name = "forward_invariance" if expect_bitwise else "forward_accuracy"
    row = contracts.judgment(op, dtype, name, arch)  # fails closed
    dt = contracts.dtype_name(dtype)
    want = "bitwise" if expect_bitwise else "scaled_abs"
    if row.get("kind") != want:
        raise ContractError(f"{op}/{dt}/{name}", f"the audit judges kind {want}, the row is {row.get('kind')!r}")
    bound = None
    if not expect_bitwise:
        bound = (row.get("outputs") or {}).get("logp")
        if bound is None:
            raise ContractError(f"{op}/{dt}/{name}/logp", "the row has no bound for output logp")
        bound = {"atol": float(bound["atol"]), "rtol": float(bound["rtol"])}
    return {"op": op, "dtype": dt, "arch": arch, "judgment": name, "kind": want,
            "contract_id": contracts.contract_id(op, dtype, arch), "bound": bound}


def logp_row_scale(logits: torch.Tensor, temperature=1.0, *, chunk_rows: int = 1024) -> torch.Tensor:
    """row_scale of selected_logp on the device: max |logits / T| over a row's finite entries + log V.

    Float64, shape logits.shape[:-1]; the same numbers as testing.parity.row_scale. Division by T > 0
    is monotone, so the max is taken in the logits' own dtype (exact) and divided once; rows go in
    chunks of about chunk_rows so no
    full-size copy of the logits is made.
    """
    if not torch.is_tensor(logits) or not logits.is_floating_point() or logits.dim() < 1:
        raise DTypeError("logits", "must be a floating-point tensor [..., V]")
    V = logits.shape[-1]
    x = logits.detach() if logits.dim() > 1 else logits.detach().unsqueeze(0)
    peak = torch.zeros(x.shape[:-1], dtype=torch.float64, device=logits.device)
    # Chunks along the row dim (dim -2), addressed through the strides: a sliced [B, T, V] is not copied.
    step = max(1, chunk_rows // max(1, math.prod(x.shape[:-2])))
    for s in range(0, x.shape[-2] if V else 0, step):
        part = x[..., s:s + step, :]
        peak[..., s:s + step] = torch.where(torch.isfinite(part), part.abs(), 0).amax(-1).double()
    peak = peak.view(logits.shape[:-1])
    temp = temperature.to(device=logits.device, dtype=torch.float64) if torch.is_tensor(temperature) \
        else torch.tensor(float(temperature), dtype=torch.float64, device=logits.device)
    if not bool((torch.isfinite(temp) & (temp > 0)).all()):
        raise TemperatureError("temperature", "must be finite and > 0")
    peak = peak / temp
    return peak + math.log(max(V, 1))


# ---- helpers ----

def _check_clip_range(clip_range):
    pair = clip_range if isinstance(clip_range, (tuple, list)) else (clip_range, clip_range)
    if len(pair) != 2 or not all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in pair):
        raise InputError("clip_range", f"must be eps or (eps_low, eps_high), got {clip_range!r}")
    lo, hi = float(pair[0]), float(pair[1])
    if not (0.0 <= lo < 1.0) or not (0.0 <= hi < math.inf):
        raise InputError("clip_range", f"needs 0 <= eps_low < 1 and 0 <= eps_high < inf, got {clip_range!r}")
    return lo, hi


def _check_logp(train, rollout, mask):
    """Eager checks (no sync): the logp as [B, T] views, the active mask, the original shape, and a
    device flag (None for a bool mask) telling whether a numeric mask held only 0 and 1."""
    for arg, x in (("train_logp", train), ("rollout_logp", rollout)):
        if not torch.is_tensor(x) or not x.is_floating_point():
            raise DTypeError(arg, f"must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if train.dim() not in (1, 2):
        raise ShapeError("train_logp", f"must be [B, T] or [N], got shape {tuple(train.shape)}")
    if rollout.shape != train.shape:
        raise ShapeError("rollout_logp", f"shape {tuple(rollout.shape)} != train_logp's {tuple(train.shape)}")
    if rollout.device != train.device:
        raise DeviceError("rollout_logp", f"on {rollout.device}, train_logp on {train.device}")
    shape = tuple(train.shape)
    mask_ok = None
    if mask is None:
        active = torch.ones(shape, dtype=torch.bool, device=train.device)
    else:
        if not torch.is_tensor(mask) or mask.is_complex():
            raise DTypeError("mask", f"must be a bool or 0/1 tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
        if tuple(mask.shape) != shape:
            raise ShapeError("mask", f"shape {tuple(mask.shape)} != the logp's {shape}")
        if mask.device != train.device:
            raise DeviceError("mask", f"on {mask.device}, the logp on {train.device}")
        if mask.dtype != torch.bool:
            mask_ok = ((mask == 0) | (mask == 1)).all()  # raised by report()
            mask = mask != 0
        active = mask
    view = (1, -1) if train.dim() == 1 else shape
    return (train.detach().reshape(view), rollout.detach().reshape(view), active.detach().reshape(view), shape,
            mask_ok)


def _check_row_scale(row_scale, shape, device, active):
    """row_scale as float64 [B, T] and a device flag: finite and >= 0 at every active token (a float
    is checked now, a tensor's flag is raised by report())."""
    if isinstance(row_scale, (int, float)) and not isinstance(row_scale, bool):
        if not (math.isfinite(row_scale) and row_scale >= 0):
            raise InputError("row_scale", f"must be finite and >= 0, got {row_scale!r}")
        return torch.full(active.shape, float(row_scale), dtype=torch.float64, device=device), None
    elif torch.is_tensor(row_scale):
        if not row_scale.is_floating_point():
            raise DTypeError("row_scale", f"must be floating point, got {row_scale.dtype}")
        if row_scale.device != device:
            raise DeviceError("row_scale", f"on {row_scale.device}, the logp on {device}")
        try:
            fits = torch.broadcast_shapes(row_scale.shape, shape) == torch.Size(shape)
        except RuntimeError:
            fits = False
        if not fits:
            raise ShapeError("row_scale", f"shape {tuple(row_scale.shape)} does not broadcast to {shape}")
        scale = row_scale.detach().double().broadcast_to(shape).reshape(active.shape)
    else:
        raise InputError("row_scale", f"must be a float or a tensor, got {type(row_scale).__name__}")
    return scale, (torch.isfinite(scale) & (scale >= 0) | ~active).all()


def _lerp(a: float, b: float, g: float) -> float:
    """numpy's linear interpolation, term for term, so that exact percentiles equal numpy's."""
    diff = b - a
    return b - diff * (1 - g) if g >= 0.5 else a + diff * g


def _order_positions(n: int):
    """(lower index, upper index, weight) of each quantile: numpy's 'linear' method (also torch.quantile's)."""
    out = []
    for q in QUANTILES:
        v = (n - 1) * q
        if v >= n - 1:
            out.append((n - 1, n - 1, 0.0))
        else:
            lo = math.floor(v)
            out.append((lo, lo + 1, v - lo))
    return out


def _histogram_quantiles(histogram, n: int, abs_max: float) -> tuple:
    """Quantiles read from the histogram: an order statistic is its bin's geometric midpoint (0 in the
    zero bin; abs_max in the overflow bin, and never above abs_max), then numpy's interpolation."""
    reps = np.concatenate(([0.0, HIST_EDGES[0] / 2], _MIDPOINTS, [abs_max]))
    reps = np.minimum(reps, abs_max)
    cum = np.cumsum(histogram)

    def order_stat(k):
        return float(reps[int(np.searchsorted(cum, k, side="right"))])

    return tuple(_lerp(order_stat(lo), order_stat(hi), g) for lo, hi, g in _order_positions(n))


def _exp(x: float) -> float:
    """math.exp, inf where it overflows (math.exp raises there, torch gives inf)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _trl_sequence_ratio(mode, clip_min, clip_max):
    """TRL's sequence importance weight as a function of a sample's dlogp sum s: exp(s), clamped to
    [clip_min, clip_max] (sequence_truncate) or set to 0 outside it (sequence_mask); None: no bound."""
    if mode not in TRL_IS_MODES:
        raise InputError("trl_is_mode", f"must be one of {TRL_IS_MODES}, got {mode!r}")
    if not mode.startswith("sequence"):
        raise InputError("trl_is_mode", f"{mode!r} clamps or masks each token's ratio; the report keeps sums "
                                        "over tokens, so only the sequence modes can be rebuilt")
    for arg, v in (("trl_is_clip_min", clip_min), ("trl_is_clip_max", clip_max)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v)):
            raise InputError(arg, f"must be a number or None, got {v!r}")
    lo = -math.inf if clip_min is None else float(clip_min)
    hi = math.inf if clip_max is None else float(clip_max)
    if lo > hi:
        raise InputError("trl_is_clip_min", f"{clip_min!r} is above trl_is_clip_max {clip_max!r}")
    truncate = mode == "sequence_truncate"

    def ratio(s):
        r = _exp(s)
        if truncate:
            return min(max(r, lo), hi)
        return r if lo <= r <= hi else 0.0  # TRL masks r < clip_min and r > clip_max

    return ratio


def _add(values) -> float:
    """Left to right, one rounding per report: the same bits on every rank for the same reports."""
    total = 0.0
    for v in values:
        total += v
    return total


def _shifted(tok: TokenRecord | None, offset: int) -> TokenRecord | None:
    if tok is None or not offset:
        return tok
    return TokenRecord(tok.sample + offset, tok.position, tok.train, tok.rollout, tok.metadata)


def _plain(v):
    """Metadata as JSON: tensors and numpy values as lists or scalars, non-finite floats as strings."""
    if torch.is_tensor(v) or isinstance(v, (np.ndarray, np.generic)):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return _json_float(v)


def _json_float(v):
    """Non-finite floats as strings, so that the output is strict JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v
