"""dlogp audit: does the trainer's logp of each sampled token agree with the rollout engine's?

RL frameworks compute a sampled token's log-probability twice, in the rollout engine and in the
trainer; the policy ratio exp(train - rollout) should be 1 before the first update. compare_logp
measures dlogp = train - rollout over the active tokens of a step and judges it against the op's
contract (contracts/<op>.yaml), so that "aligned" means what the contract says, never a default.

Reports merge across micro-batches and ranks: counts, float64 sums, the max (with its token) and a
fixed histogram of |dlogp| add exactly. Percentiles of one report are exact; merged ones are read
from the histogram, within a factor PERCENTILE_MERGE_FACTOR of the exact ones (docs/audit.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

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
    exact: int  # active tokens with dlogp exactly 0
    clipped: int
    sum_dlogp: float
    sum_abs: float
    sum_ratio: float
    sum_kl: float
    abs_max: float | None
    worst: TokenRecord | None  # the token of abs_max (the first one on ties)
    first_nonfinite: TokenRecord | None
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

        Exact for counts, the max and its token (sample indices are offset by the samples of the
        reports before), the histogram and the per-sample list; sums up to float64 addition.
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
        offset, worst, abs_max, first_nonfinite = 0, None, None, None
        for r in reports:
            if r.abs_max is not None and (abs_max is None or r.abs_max > abs_max):
                abs_max, worst = r.abs_max, _shifted(r.worst, offset)
            if first_nonfinite is None and r.first_nonfinite is not None:
                first_nonfinite = _shifted(r.first_nonfinite, offset)
            offset += r.samples
        with_values = [r for r in reports if r.finite]
        ratios = [r.worst_ratio for r in reports if r.worst_ratio is not None]
        return cls(
            op=first.op, dtype=first.dtype, arch=first.arch, judgment=first.judgment, kind=first.kind,
            contract_id=first.contract_id, bound=first.bound, clip_range=first.clip_range,
            samples=offset, **{k: sum(getattr(r, k) for r in reports)
                               for k in ("tokens", "active", "nonfinite", "exact", "clipped")},
            **{k: _add(getattr(r, k) for r in reports) for k in ("sum_dlogp", "sum_abs", "sum_ratio", "sum_kl")},
            abs_max=abs_max, worst=worst, first_nonfinite=first_nonfinite,
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
            "coverage": self.coverage, "nonfinite": self.nonfinite, "exact": self.exact,
            "dlogp_mean": self.dlogp_mean, "abs_mean": self.abs_mean, "abs_max": self.abs_max,
            **{f"abs_p{round(q * 100)}": pct.get(q) for q in QUANTILES},
            "percentiles_exact": self.percentiles_exact,
            "ratio0": self.ratio0, "clipfrac0": self.clipfrac0, "approx_kl0": self.approx_kl0,
            "worst_ratio": self.worst_ratio,
            "worst_token": self.worst.to_dict() if self.worst else None,
            "first_nonfinite_token": self.first_nonfinite.to_dict() if self.first_nonfinite else None,
            "reports": self.report_counts,
        }
        out = {k: _json_float(v) for k, v in out.items()}
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

    All arithmetic is float64 on the tensors' device; only small results move to the host.
    A missing op, dtype or judgment raises ContractError: there is no default law.
    """
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
    cid = contracts.contract_id(op, dtype, arch)

    eps_low, eps_high = _check_clip_range(clip_range)
    train, rollout, active, shape = _check_logp(train_logp, rollout_logp, mask)
    if metadata is not None and (not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata)):
        raise InputError("metadata", "must be a dict with str keys")
    scale = None
    if not expect_bitwise:
        if row_scale is None:
            raise InputError("row_scale", f"required to judge {name}: the allowed |dlogp| is "
                                          "2 * (atol + rtol * row_scale) (see audit.logp_row_scale)")
        scale = _check_row_scale(row_scale, shape, train.device, active)

    B, T = train.shape
    t64, r64 = train.double(), rollout.double()
    d = torch.where(t64 == r64, 0.0, t64 - r64)  # equal infinities are no difference
    finite = active & torch.isfinite(d)
    nonfinite = active & ~finite
    d = torch.where(finite, d, 0.0)
    a = d.abs()
    ratio = torch.where(finite, torch.exp(d), 0.0)
    kl = torch.where(finite, torch.expm1(d) - d, 0.0)  # exp(d) - 1 - d without cancelling the 1
    clipped = finite & ((ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high))
    row_max = a.amax(1) if T else a.new_zeros(B)  # a is 0 off the finite active tokens

    per_row = torch.stack([active.sum(1), nonfinite.sum(1), finite.sum(1), (finite & (a == 0)).sum(1),
                           clipped.sum(1)]).cpu().tolist()  # counts, exact
    sums = torch.stack([d.sum(1), a.sum(1), ratio.sum(1), kl.sum(1), row_max])
    totals = sums[:4].sum(1).cpu().tolist()
    sums = sums.cpu().tolist()
    n_active, n_nonfinite, n_finite, n_exact, n_clipped = (sum(c) for c in per_row)

    per_sample = []
    for i in range(B):
        act, bad, fin, _, clp = (int(c[i]) for c in per_row)
        _, s_abs, s_ratio, s_kl, mx = (s[i] for s in sums)
        per_sample.append(SampleStats(act, bad, s_abs / fin if fin else None, mx if fin else None,
                                      s_ratio / fin if fin else None, s_kl / fin if fin else None,
                                      clp / fin if fin else None))

    def token(flat_index):
        b, t = divmod(int(flat_index), T)
        meta = _metadata_at(metadata, shape, b, t)
        return TokenRecord(b, t, float(t64[b, t]), float(r64[b, t]), meta)

    worst = abs_max = worst_ratio = exact_pct = first_bad = hist = None
    if n_finite:
        key = torch.where(finite, a, -1.0).flatten()
        at = torch.argmax(key)  # the first of the largest
        worst, abs_max = token(at), float(key[at])
        values = a[finite]
        hist = _histogram(values)
        exact_pct = _exact_quantiles(torch.sort(values).values)
        if scale is not None:
            allowed = 2.0 * (bound["atol"] + bound["rtol"] * scale)
            tok_ratio = torch.where(finite & (a != 0), a / allowed, 0.0)
            worst_ratio = float(tok_ratio.max())
    if n_nonfinite:
        first_bad = token(torch.nonzero(nonfinite.flatten())[0, 0])

    return LogpAuditReport(
        op=op, dtype=dt, arch=arch, judgment=name, kind=want, contract_id=cid, bound=bound,
        clip_range=(eps_low, eps_high), samples=B, tokens=B * T, active=int(n_active),
        nonfinite=int(n_nonfinite), exact=int(n_exact), clipped=int(n_clipped),
        sum_dlogp=totals[0], sum_abs=totals[1], sum_ratio=totals[2], sum_kl=totals[3],
        abs_max=abs_max, worst=worst, first_nonfinite=first_bad, worst_ratio=worst_ratio,
        histogram=hist if hist is not None else (0,) * HIST_BINS, exact_percentiles=exact_pct,
        per_sample=tuple(per_sample),
    )


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
            if not bool(((mask == 0) | (mask == 1)).all()):
                raise InputError("mask", "must hold only 0 and 1")
            mask = mask != 0
        active = mask
    view = (1, -1) if train.dim() == 1 else shape
    return (train.detach().reshape(view), rollout.detach().reshape(view), active.reshape(view), shape)


def _check_row_scale(row_scale, shape, device, active):
    if isinstance(row_scale, (int, float)) and not isinstance(row_scale, bool):
        scale = torch.full(active.shape, float(row_scale), dtype=torch.float64, device=device)
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
    if not bool((torch.isfinite(scale) & (scale >= 0) | ~active).all()):
        raise InputError("row_scale", "must be finite and >= 0 at every active token")
    return scale


def _histogram(values: torch.Tensor) -> tuple:
    """Counts of |dlogp| values (finite, >= 0) per bin of the fixed layout."""
    edges = torch.as_tensor(HIST_EDGES, device=values.device)
    bins = torch.where(values == 0, 0, torch.bucketize(values, edges, right=True) + 1)
    return tuple(torch.bincount(bins, minlength=HIST_BINS).cpu().tolist())


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


def _exact_quantiles(sorted_values: torch.Tensor) -> tuple:
    pos = _order_positions(sorted_values.numel())
    idx = torch.tensor([i for lo, hi, _ in pos for i in (lo, hi)], device=sorted_values.device)
    picked = sorted_values[idx].cpu().tolist()
    return tuple(_lerp(picked[2 * k], picked[2 * k + 1], g) for k, (_, _, g) in enumerate(pos))


def _histogram_quantiles(histogram, n: int, abs_max: float) -> tuple:
    """Quantiles read from the histogram: an order statistic is its bin's geometric midpoint (0 in the
    zero bin; abs_max in the overflow bin, and never above abs_max), then numpy's interpolation."""
    reps = np.concatenate(([0.0, HIST_EDGES[0] / 2], _MIDPOINTS, [abs_max]))
    reps = np.minimum(reps, abs_max)
    cum = np.cumsum(histogram)

    def order_stat(k):
        return float(reps[int(np.searchsorted(cum, k, side="right"))])

    return tuple(_lerp(order_stat(lo), order_stat(hi), g) for lo, hi, g in _order_positions(n))


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


def _metadata_at(metadata, shape, b, t) -> dict:
    out = {}
    for k, v in (metadata or {}).items():
        if torch.is_tensor(v):
            if tuple(v.shape) == shape:
                v = v[t] if len(shape) == 1 else v[b, t]
                v = v.item()
            else:
                v = v.tolist()
        out[k] = v
    return out


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
