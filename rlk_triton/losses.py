"""RL policy losses on per-token log-probabilities: the module RL trainers import.

    from rlk_triton.losses import policy_loss, ratio_kl
    loss, per_token, diag = policy_loss(logp, old_logp, advantages, mask=mask, loss_type="grpo",
                                        aggregation="seq-mean-token-mean")
    log_ratio, ratio, kl = ratio_kl(logp, old_logp, ref_logp, mask=mask)

Inputs are fp32 [B, T] (row = sequence), outputs fp32. Gradients flow to logp (and to entropy when
its bonus is on); old / ref / rollout logp, advantages, mask and normalizer are constants.
A token's values and gradients are bitwise independent of the other rows (docs/rl_losses.md).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Union

import torch

from ._runtime import interpreter_active
from .errors import BackendError, DeviceError, DTypeError, InputError, ShapeError
from .ops import gspo as _gspo
from .ops import rl_losses as _op
from .ops import rl_torch as _torch_reference
from .ops import rollout_correction as _rc

LOSS_TYPES = ("ppo", "grpo", "dapo", "dr_grpo", "cispo")
AGGREGATIONS = tuple(_op.AGGREGATIONS)
KL_ESTIMATORS = tuple(_op.KL_ESTIMATORS)
TIS_MODES = ("truncate", "mask")
TIS_SCOPES = tuple(_op.TIS_SCOPES)
DIAGNOSTICS = _op.DIAGNOSTICS
# The aggregation each loss type is usually paired with (the caller still states it explicitly).
USUAL_AGGREGATION = {
    "ppo": "token-mean",
    "grpo": "seq-mean-token-mean",
    "dapo": "token-mean",  # with eps_high > eps_low ("clip-higher")
    "dr_grpo": "seq-mean-token-sum-norm",  # normalizer = a constant, e.g. max response length x sequences
    "cispo": "token-mean",
}
MAX_T = 2**24  # per-row token counts are kept in fp32
# Backend ids of these ops and of rlk_triton.advantages' (rlk_triton.registry describes them;
# rlk_triton.policy chooses): the Triton kernels, or float64 torch (rlk_triton/ops/rl_torch.py).
BACKENDS = ("triton", "torch_reference")

_INTERPRETED = interpreter_active()

Normalizer = Union[None, float, int, torch.Tensor]

IS_LEVELS = tuple(_rc.IS_LEVELS)
IS_MODES = tuple(_rc.IS_MODES)
RS_OPTIONS = _rc.RS_OPTIONS

__all__ = ["policy_loss", "ratio_kl", "gspo_loss", "rollout_correction", "RolloutCorrection", "LOSS_TYPES",
           "AGGREGATIONS", "KL_ESTIMATORS", "TIS_MODES", "TIS_SCOPES", "IS_LEVELS", "IS_MODES", "RS_OPTIONS",
           "USUAL_AGGREGATION"]


class RolloutCorrection(NamedTuple):
    """rollout_correction's result: weights (fp32 [B, T], 0 off the mask; None without is_level),
    keep (bool [B, T]: the mask after rejection) and stats (dict of float64 0-dim device tensors)."""
    weights: Optional[torch.Tensor]
    keep: torch.Tensor
    stats: dict


def rollout_correction(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    is_level: Optional[str] = None,
    is_mode: str = "truncate",
    is_high: Optional[float] = None,
    is_low: Optional[float] = None,
    rejection: Optional[dict] = None,
    log_ratio_clamp: Optional[float] = None,
    backend: str = "triton",
) -> RolloutCorrection:
    """Importance weights and rejection for the rollout / trainer mismatch, fused, per sequence.

    With lr_t = old_logp_t - rollout_logp_t over the active tokens of each row (lrc_t = lr_t clamped
    to +-log_ratio_clamp when given; verl clamps at 20):
      is_level "token": w_t = exp(lrc_t); "sequence": w = exp(sum_t lr_t) (the product of the token
        ratios, TRL's and verl's sequence IS); "geometric": w = exp(mean_t lr_t) (their geometric mean);
        the sequence's log-weight is clamped too. None: no weights (rejection only).
      is_mode "truncate": clip(w, is_low, is_high) (verl's and slime's TIS; is_low None: no lower
        bound); "mask": w where is_low <= w <= is_high, else 0 (TRL's *_mask modes; IcePop with
        token weights and both bounds). A zero weight keeps the token in every count.
      rejection: {option: bound} with verl's rollout_rs options (RS_OPTIONS): token_k1 / k2 / k3, and
        seq_sum_kX, seq_mean_kX, seq_max_k2 / k3 over a sequence, of k1 = -lrc (= log rollout / old),
        k2 = lrc^2 / 2, k3 = exp(lrc) - 1 - lrc. k1 options take ratio bounds (lo, hi) (kept when
        log lo <= statistic <= log hi); the others an upper bound. Rejected tokens leave keep: pass
        keep as the loss's mask to drop them from every count (verl's modified response mask).
    Use: policy_loss(..., mask=rc.keep, is_weights=rc.weights, tis_scope="pg").
    stats (float64 0-dim tensors, no host sync): is_mean / is_min / is_max of the weights over the
    active tokens (token level) or the sequences with a token (sequence levels), rs_masked_fraction
    (rejected / active tokens), rs_seq_masked_fraction (rows with a rejected token / rows).
    A sequence's weights and keep are bitwise independent of the other rows. backend: "triton" or
    "torch_reference" (float64 torch, rounded once).
    """
    _check_logp(old_logp, backend, name="old_logp")
    _check_like("rollout_logp", rollout_logp, old_logp, ref_name="old_logp")
    mask_u8 = _check_mask(mask, old_logp, ref_name="old_logp")
    if is_level is not None:
        _check_choice("is_level", is_level, IS_LEVELS)
        if is_high is None:
            raise InputError("is_high", "is_level is given: pass the upper bound (float('inf') for none)")
    _check_choice("is_mode", is_mode, IS_MODES)
    if is_high is not None:
        is_high = _positive("is_high", is_high, allow_inf=True)
    if is_low is not None:
        is_low = _number("is_low", is_low)
        if is_low < 0.0 or (is_high is not None and is_low > is_high):
            raise InputError("is_low", f"must lie in [0, is_high], got {is_low!r}")
    if log_ratio_clamp is not None:
        log_ratio_clamp = _positive("log_ratio_clamp", log_ratio_clamp, allow_inf=True)
    rs = _check_rejection(rejection)
    args = (old_logp.contiguous(), rollout_logp.contiguous(), mask_u8, is_level, is_mode, is_low, is_high, rs,
            log_ratio_clamp)
    if backend == "torch_reference":
        weights, keep, rows = _torch_reference.rollout_correction(*args)
    else:
        weights, keep, rows = _rc.launch_rollout_correction(*args)
    return RolloutCorrection(weights, keep, _rollout_stats(weights, keep, rows, mask_u8 != 0, is_level))


def _check_rejection(rejection) -> dict:
    if rejection is None:
        return {}
    if not isinstance(rejection, dict):
        raise InputError("rejection", f"must be a dict {{option: bound}}, got {type(rejection).__name__}")
    out = {}
    for name, bound in rejection.items():
        if name not in RS_OPTIONS:
            raise InputError("rejection", f"unknown option {name!r} (have: {', '.join(RS_OPTIONS)})")
        if name.endswith("k1"):
            if not isinstance(bound, (tuple, list)) or len(bound) != 2:
                raise InputError("rejection", f"{name} takes ratio bounds (lo, hi), got {bound!r}")
            lo, hi = (_positive("rejection", b) for b in bound)
            if lo > hi:
                raise InputError("rejection", f"{name}: lo {lo} > hi {hi}")
            out[name] = (lo, hi)
        else:
            out[name] = _positive("rejection", bound, allow_inf=True)
    return out


def _rollout_stats(weights, keep, rows, active, is_level) -> dict:
    """A few float64 numbers of the correction, on the device (a torch composition: no fusion to gain)."""
    f64 = torch.float64
    n_active = active.sum().to(f64)
    rejected = (active & ~keep).to(f64)
    B = active.shape[0]
    stats = {"rs_masked_fraction": torch.where(n_active > 0, rejected.sum() / n_active.clamp(min=1), 0.0),
             "rs_seq_masked_fraction": (rejected.sum(1) > 0).to(f64).sum() / max(B, 1)}
    if weights is not None:
        w = weights.to(f64)
        if is_level == "token":
            on, vals, count = active, w, n_active
        else:
            on = rows[:, 0] > 0
            vals = w.amax(1) if w.shape[1] else w.sum(1)  # the sequence's one weight (>= 0)
            count = on.to(f64).sum()
        stats["is_mean"] = torch.where(count > 0, torch.where(on, vals, 0.0).sum() / count.clamp(min=1), 0.0)
        big = torch.tensor(float("inf"), dtype=f64, device=w.device)
        stats["is_min"] = torch.where(count > 0, torch.where(on, vals, big).amin() if vals.numel() else big, 0.0)
        stats["is_max"] = torch.where(count > 0, torch.where(on, vals, -big).amax() if vals.numel() else -big, 0.0)
    return stats


def ratio_kl(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: Optional[torch.Tensor] = None,
    *,
    mask: Optional[torch.Tensor] = None,
    kl_estimator: str = "k3",
    log_ratio_clamp: Optional[float] = None,
    backend: str = "triton",
):
    """Per-token (log_ratio, ratio, kl), fp32 [B, T].

    log_ratio = logp - old_logp, clamped to [-c, c] when log_ratio_clamp = c (no gradient beyond the
    bounds); ratio = exp(log_ratio); kl = the estimator of KL(current || ref) with d = logp - ref_logp:
    k1 = d, k2 = d^2 / 2, k3 = exp(-d) + d - 1 (unbiased, low variance, >= 0). kl is None without ref_logp.
    Masked tokens (mask == 0) give exact 0 in all three outputs and no gradient. Differentiable w.r.t.
    logp only. backend: "triton" (the kernels) or "torch_reference" (float64 torch, rounded once to
    fp32: runs on any device, slow, same contract); rlk_triton.policy.resolve chooses one.
    """
    _check_logp(logp, backend)
    _check_like("old_logp", old_logp, logp)
    if ref_logp is not None:
        _check_like("ref_logp", ref_logp, logp)
    mask_u8 = None if mask is None else _check_mask(mask, logp)
    _check_choice("kl_estimator", kl_estimator, KL_ESTIMATORS)
    if log_ratio_clamp is not None:
        log_ratio_clamp = _positive("log_ratio_clamp", log_ratio_clamp, allow_inf=True)
    fwd = _torch_reference.ratio_kl if backend == "torch_reference" else _op.call_ratio_kl_fwd
    log_ratio, ratio, kl = fwd(
        logp.contiguous(), old_logp.contiguous(), None if ref_logp is None else ref_logp.contiguous(),
        mask_u8, kl_estimator, log_ratio_clamp,
    )
    return log_ratio, ratio, (kl if ref_logp is not None else None)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    mask: torch.Tensor,
    loss_type: str = "ppo",
    eps_low: float = 0.2,
    eps_high: Optional[float] = None,
    dual_clip_c: Optional[float] = None,
    aggregation: str = "token-mean",
    normalizer: Normalizer = None,
    ref_logp: Optional[torch.Tensor] = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy: Optional[torch.Tensor] = None,
    entropy_coef: float = 0.0,
    rollout_logp: Optional[torch.Tensor] = None,
    tis_cap: Optional[float] = None,
    tis_mode: str = "truncate",
    tis_scope: str = "loss",
    is_weights: Optional[torch.Tensor] = None,
    log_ratio_clamp: Optional[float] = None,
    validate: bool = True,
    backend: str = "triton",
):
    """The clipped policy-gradient loss and its relatives, fused: (loss, per_token_loss, diagnostics).

    Per active token, with r = exp(logp - old_logp), cr = clip(r, 1 - eps_low, 1 + eps_high):
      ppo / grpo / dapo / dr_grpo: pg = max(-A r, -A cr); with dual_clip_c = c, for A < 0: min(pg, -A c)
      cispo:                       pg = -sg(cr) A logp
      l = tis * (pg + kl_coef * kl(logp, ref_logp) - entropy_coef * entropy)     (tis_scope "loss")
      l = tis * pg + kl_coef * kl(logp, ref_logp) - entropy_coef * entropy       (tis_scope "pg")
    The loss types differ only in the aggregation they are usually paired with (USUAL_AGGREGATION);
    pass it explicitly. Truncated importance sampling (rollout_logp given): w = exp(old_logp -
    rollout_logp); tis_mode "truncate" weighs by tis = min(w, tis_cap), "mask" drops tokens with
    w > tis_cap as if masked. Or the caller's per-token weights: is_weights (fp32 [B, T], constants,
    e.g. from rollout_correction) weigh like "truncate" does, tis = is_weights. tis_scope says what
    the weight multiplies: "loss" (default: the whole token loss) or "pg" (the policy term only, as
    verl, TRL and slime do). log_ratio_clamp = c clamps logp - old_logp to [-c, c] before exp (verl
    clamps at 20): no gradient through r beyond; the diagnostics see the clamped log-ratio.

    Args:
        logp, old_logp, ref_logp, rollout_logp, entropy: fp32 [B, T].
        advantages: fp32 [B, T], or [B] (one per sequence).
        mask: [B, T] bool or 0/1 numbers; nonzero = active.
        aggregation: "token-mean" sum / (normalizer or #active tokens); "seq-mean-token-sum" sum over
            sequences with >= 1 active token of their token sum / (normalizer or #such sequences);
            "seq-mean-token-mean" the same with each sequence's token mean; "seq-mean-token-sum-norm"
            sum / normalizer (required: Dr. GRPO's constant). A zero denominator gives loss 0.
        normalizer: the global denominator the framework owns (a positive number, or a 1-element
            tensor on logp's device holding a finite number >= 0, read by the kernel; 0 gives loss 0).
        validate: check a tensor normalizer on the host (finite and >= 0, else InputError naming
            normalizer): one device sync, and only when the normalizer is a tensor (nothing else here
            syncs). With validate=False (CUDA graphs; skipped under torch.compile too) nothing syncs
            and a negative or non-finite normalizer tensor makes the loss and gradients NaN.
        backend: "triton" (the kernels) or "torch_reference" (float64 torch, rounded once: any
            device, slow, same contract).

    Returns:
        loss (fp32 0-dim), per_token_loss (fp32 [B, T], 0 on inactive tokens), diagnostics: dict of
        fp32 0-dim tensors clipfrac, approx_kl (mean k3 of old vs current), ratio_mean, ratio_min,
        ratio_max, ppo_kl (mean k1 of old vs current: old_logp - logp, verl's actor/ppo_kl) over the
        active tokens, all 0 when no token is active. Differentiable w.r.t. logp and,
        when entropy_coef != 0, entropy.
    """
    _check_logp(logp, backend)
    _check_like("old_logp", old_logp, logp)
    _check_advantages(advantages, logp)
    mask_u8 = _check_mask(mask, logp)
    _check_choice("loss_type", loss_type, LOSS_TYPES)
    _check_choice("aggregation", aggregation, AGGREGATIONS)
    eps_low, eps_high = _clip_range(eps_low, eps_high)
    if dual_clip_c is not None:
        dual_clip_c = _number("dual_clip_c", dual_clip_c)
        if dual_clip_c <= 1.0:
            raise InputError("dual_clip_c", f"must be > 1 (it bounds -A r from above at -A c), got {dual_clip_c!r}")
        if loss_type == "cispo":
            raise InputError("dual_clip_c", "applies to the clipped surrogate, not to cispo")
    t = _token_terms(logp, ref_logp, kl_coef, kl_estimator, entropy, entropy_coef, rollout_logp, tis_cap, tis_mode,
                     is_weights, tis_scope)
    if log_ratio_clamp is not None:
        log_ratio_clamp = _positive("log_ratio_clamp", log_ratio_clamp, allow_inf=True)
    norm_value, norm_tensor = _check_normalizer(normalizer, aggregation, logp, validate)

    fwd = _torch_reference.policy_loss if backend == "torch_reference" else _op.call_policy_loss_fwd
    loss, per_token, diag, *_row_weight = fwd(
        logp.contiguous(), old_logp.contiguous(), advantages.contiguous(), mask_u8, t.ref_logp, t.entropy,
        t.rollout_logp, norm_tensor, norm_value, loss_type, aggregation, 1.0 - eps_low, 1.0 + eps_high, dual_clip_c,
        t.kl_coef, kl_estimator, t.entropy_coef, t.tis_mode, t.tis_cap, t.tis_scope, log_ratio_clamp,
    )
    return loss, per_token, dict(zip(DIAGNOSTICS, diag.detach().unbind()))  # one view op for the six


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    mask: torch.Tensor,
    eps_low: float = 3e-4,
    eps_high: Optional[float] = 4e-4,
    normalizer: Optional[float] = None,
    ref_logp: Optional[torch.Tensor] = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy: Optional[torch.Tensor] = None,
    entropy_coef: float = 0.0,
    rollout_logp: Optional[torch.Tensor] = None,
    tis_cap: Optional[float] = None,
    tis_mode: str = "truncate",
    tis_scope: str = "loss",
    is_weights: Optional[torch.Tensor] = None,
    aggregation: str = "seq-mean-token-mean",
    backend: str = "triton",
):
    """GSPO: the clipped surrogate on the sequence-level ratio s_i = exp(mean over the sequence's
    active tokens of (logp - old_logp)). (loss, sequence_loss, diagnostics).

        pg_i = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))
        l_i  = mean over the active tokens t of tis_t * (pg_i + kl_coef * kl_t - entropy_coef * entropy_t)
        loss = sum over sequences with >= 1 active token of l_i / (normalizer or their number)

    aggregation: "seq-mean-token-mean" (default, the GSPO paper's: above); "token-mean": sum_i n_i l_i /
    (normalizer or #active tokens), each sequence weighted by its length n_i (verl's GSPO with its
    actor default, TRL's sequence-level ratio with bnpo / dapo); "seq-mean-token-sum": sum_i n_i l_i /
    (normalizer or #sequences); "seq-mean-token-sum-norm": sum_i n_i l_i / normalizer (required).
    tis_scope "pg" weighs the policy term only (l_i = mean_t (tis_t pg_i + kl_coef kl_t - entropy_coef
    entropy_t)); is_weights: the caller's per-token weights instead of rollout_logp / tis_cap, as in
    policy_loss.

    The KL penalty (ref_logp, kl_coef, kl_estimator), the entropy bonus (entropy, entropy_coef) and
    truncated importance sampling (rollout_logp, tis_cap, tis_mode) are policy_loss's, token by token,
    aggregated like the policy term (each sequence's token mean): kl_t as in ratio_kl;
    w_t = exp(old_logp - rollout_logp), "truncate" weighs token t's share by tis_t = min(w_t, tis_cap),
    "mask" drops tokens with w_t > tis_cap as if masked (they leave s_i and n_i); tis_t = 1 otherwise.

    logp, old_logp, ref_logp, entropy, rollout_logp: fp32 [B, T]; advantages: fp32 [B] (one per
    sequence); mask [B, T]. The default clip range is the GSPO paper's (3e-4, 4e-4): ratios of whole
    sequences move little. Returns the fp32 0-dim loss, the fp32 [B] per-sequence terms l_i (0 for a
    sequence with no active token), and policy_loss's diagnostics: clipfrac, ratio_mean, ratio_min,
    ratio_max over those sequences (of s_i), approx_kl and ppo_kl (mean k3 and k1 of old vs current
    over the active tokens); all 0 when there is none. Differentiable w.r.t. logp and, when entropy_coef != 0, entropy:
    d l_i / d logp_t = tis_t ((-A_i or 0 when clipped) s_i + kl_coef dkl_t) / n_i (the GSPO paper's
    token-level form: plain GSPO without truncation), d l_i / d entropy_t = -tis_t entropy_coef / n_i.
    backend: "triton" or "torch_reference" (float64 torch, rounded once), as in policy_loss.
    """
    _check_logp(logp, backend)
    _check_like("old_logp", old_logp, logp)
    mask_u8 = _check_mask(mask, logp)
    if not torch.is_tensor(advantages) or advantages.dtype != torch.float32:
        raise DTypeError("advantages", f"must be a float32 tensor, got {getattr(advantages, 'dtype', type(advantages).__name__)}")
    if tuple(advantages.shape) != (logp.shape[0],):
        raise ShapeError("advantages", f"GSPO takes one advantage per sequence: [{logp.shape[0]}], got {tuple(advantages.shape)}")
    if advantages.device != logp.device:
        raise DeviceError("advantages", f"on {advantages.device}, logp on {logp.device}")
    eps_low, eps_high = _clip_range(eps_low, eps_high)
    _check_choice("aggregation", aggregation, AGGREGATIONS)
    if normalizer is not None:
        normalizer = _positive("normalizer", normalizer)
    elif aggregation == "seq-mean-token-sum-norm":
        raise InputError("normalizer", "seq-mean-token-sum-norm divides by a constant the caller chooses")
    t = _token_terms(logp, ref_logp, kl_coef, kl_estimator, entropy, entropy_coef, rollout_logp, tis_cap, tis_mode,
                     is_weights, tis_scope)
    fwd = _torch_reference.gspo_loss if backend == "torch_reference" else _gspo.call_gspo_loss_fwd
    loss, seq_loss, diag, *_aux = fwd(
        logp.contiguous(), old_logp.contiguous(), advantages.contiguous(), mask_u8, t.ref_logp, t.entropy,
        t.rollout_logp, 1.0 - eps_low, 1.0 + eps_high, normalizer, t.kl_coef, kl_estimator, t.entropy_coef,
        t.tis_mode, t.tis_cap, aggregation, t.tis_scope)
    return loss, seq_loss, dict(zip(_gspo.DIAGNOSTICS, diag.detach().unbind()))


# ---- validation: typed errors that name the argument ----

class _TokenTerms(NamedTuple):
    """The optional per-token terms of policy_loss and gspo_loss, validated; a tensor is None when its
    term is off (what the kernels and the torch reference take)."""
    ref_logp: Optional[torch.Tensor]
    kl_coef: float
    entropy: Optional[torch.Tensor]
    entropy_coef: float
    rollout_logp: Optional[torch.Tensor]  # is_weights in tis_mode "weights"
    tis_mode: str  # "none" without rollout_logp / is_weights
    tis_cap: Optional[float]
    tis_scope: str


def _token_terms(logp, ref_logp, kl_coef, kl_estimator, entropy, entropy_coef, rollout_logp, tis_cap,
                 tis_mode, is_weights=None, tis_scope="loss") -> _TokenTerms:
    """KL penalty, entropy bonus and truncated importance sampling: one set of checks for every loss."""
    _check_choice("kl_estimator", kl_estimator, KL_ESTIMATORS)
    _check_choice("tis_mode", tis_mode, TIS_MODES)
    _check_choice("tis_scope", tis_scope, TIS_SCOPES)
    kl_coef = _number("kl_coef", kl_coef)
    entropy_coef = _number("entropy_coef", entropy_coef)
    if ref_logp is not None:
        _check_like("ref_logp", ref_logp, logp)
    elif kl_coef != 0.0:
        raise InputError("ref_logp", "kl_coef != 0 needs ref_logp")
    if entropy is not None:
        _check_like("entropy", entropy, logp)
    elif entropy_coef != 0.0:
        raise InputError("entropy", "entropy_coef != 0 needs the per-token entropy")
    if rollout_logp is not None:
        _check_like("rollout_logp", rollout_logp, logp)
        if tis_cap is None:
            raise InputError("tis_cap", "rollout_logp is given: pass tis_cap (float('inf') for untruncated weights)")
        tis_cap = _positive("tis_cap", tis_cap, allow_inf=True)
    elif tis_cap is not None:
        raise InputError("rollout_logp", "tis_cap is given: pass rollout_logp (the rollout engine's logp)")
    c = lambda x, on: x.contiguous() if x is not None and on else None  # noqa: E731
    if is_weights is not None:
        if rollout_logp is not None:
            raise InputError("is_weights", "pass either is_weights or rollout_logp with tis_cap, not both")
        _check_like("is_weights", is_weights, logp)
        return _TokenTerms(c(ref_logp, kl_coef != 0.0), kl_coef, c(entropy, entropy_coef != 0.0), entropy_coef,
                           is_weights.detach().contiguous(), "weights", None, tis_scope)
    return _TokenTerms(c(ref_logp, kl_coef != 0.0), kl_coef, c(entropy, entropy_coef != 0.0), entropy_coef,
                       c(rollout_logp, True), "none" if rollout_logp is None else tis_mode, tis_cap, tis_scope)


def _clip_range(eps_low, eps_high) -> tuple[float, float]:
    """(eps_low, eps_high) of clip(r, 1 - eps_low, 1 + eps_high); eps_high None means eps_low."""
    eps_low = _number("eps_low", eps_low)
    if not 0.0 <= eps_low <= 1.0:
        raise InputError("eps_low", f"must lie in [0, 1], got {eps_low!r}")
    eps_high = eps_low if eps_high is None else _number("eps_high", eps_high, allow_inf=True)
    if eps_high < 0.0:
        raise InputError("eps_high", f"must be >= 0, got {eps_high!r}")
    return eps_low, eps_high


def _check_backend(backend):
    if backend not in BACKENDS:
        raise BackendError("backend", f"unknown backend {backend!r} (have: {', '.join(BACKENDS)})")


def _check_device(name, x, backend):
    """Triton runs on CUDA, or on CPU under the interpreter; the torch reference on CUDA or CPU."""
    if x.device.type == "cpu":
        if backend == "triton" and not _INTERPRETED:
            raise DeviceError(name, "CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 "
                              "before importing rlk_triton, or move to CUDA")
    elif x.device.type != "cuda":
        raise DeviceError(name, f"unsupported device {x.device}")


def _check_logp(logp, backend, name="logp"):
    _check_backend(backend)
    if not isinstance(logp, torch.Tensor):
        raise DTypeError(name, f"expected a torch.Tensor, got {type(logp).__name__}")
    if logp.dtype != torch.float32:
        raise DTypeError(name, f"dtype {logp.dtype} is not float32 (per-token log-probabilities are fp32)")
    if logp.dim() != 2:
        raise ShapeError(name, f"must be [B, T] (one row per sequence), got shape {tuple(logp.shape)}")
    if logp.shape[1] >= MAX_T:
        raise ShapeError(name, f"T = {logp.shape[1]} must be < 2^24 (per-row token counts are kept in fp32)")
    if logp.numel() >= 2**31:
        raise ShapeError(name, f"B * T = {logp.numel()} must be < 2^31 (token totals are int32)")
    _check_device(name, logp, backend)


def _check_like(name, x, logp, ref_name="logp"):
    if not isinstance(x, torch.Tensor):
        raise DTypeError(name, f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise DTypeError(name, f"dtype {x.dtype} is not float32")
    if tuple(x.shape) != tuple(logp.shape):
        raise ShapeError(name, f"shape {tuple(x.shape)} does not match {ref_name} {tuple(logp.shape)}")
    if x.device != logp.device:
        raise DeviceError(name, f"on {x.device}, {ref_name} on {logp.device}")


def _check_advantages(adv, logp):
    if not isinstance(adv, torch.Tensor):
        raise DTypeError("advantages", f"expected a torch.Tensor, got {type(adv).__name__}")
    if adv.dtype != torch.float32:
        raise DTypeError("advantages", f"dtype {adv.dtype} is not float32")
    if tuple(adv.shape) not in (tuple(logp.shape), tuple(logp.shape[:1])):
        raise ShapeError("advantages", f"shape {tuple(adv.shape)} is neither [B, T] = {tuple(logp.shape)} "
                         f"nor [B] = {tuple(logp.shape[:1])}")
    if adv.device != logp.device:
        raise DeviceError("advantages", f"on {adv.device}, logp on {logp.device}")


def _check_mask(mask, logp, ref_name="logp") -> torch.Tensor:
    """The mask as uint8 0/1 (a free view for bool masks)."""
    if not isinstance(mask, torch.Tensor):
        raise DTypeError("mask", f"expected a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype.is_complex:
        raise DTypeError("mask", f"dtype {mask.dtype} is not bool, integer or floating point")
    if tuple(mask.shape) != tuple(logp.shape):
        raise ShapeError("mask", f"shape {tuple(mask.shape)} does not match {ref_name} {tuple(logp.shape)}")
    if mask.device != logp.device:
        raise DeviceError("mask", f"on {mask.device}, {ref_name} on {logp.device}")
    if mask.dtype != torch.bool:
        mask = mask != 0
    if torch.compiler.is_compiling():
        # Inductor (torch 2.11) cannot lower the bool -> uint8 view: copy (same 0/1 bytes) instead.
        return mask.to(torch.uint8).contiguous()
    return mask.contiguous().view(torch.uint8)


def _check_choice(name, value, choices):
    if value not in choices:
        raise InputError(name, f"unknown {name} {value!r} (have: {', '.join(choices)})")


def _number(name, value, allow_inf=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(name, f"expected a number, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise InputError(name, f"must be finite, got {value!r}")
    return v


def _positive(name, value, allow_inf=False) -> float:
    v = _number(name, value, allow_inf)
    if v <= 0.0:
        raise InputError(name, f"must be > 0, got {value!r}")
    return v


def _check_normalizer(normalizer, aggregation, logp, validate=True):
    """(value, None), (None, fp32-readable 1-element tensor) or (None, None). A tensor's value is
    checked only with validate (a host sync); the kernel turns a bad one into a NaN loss otherwise."""
    if normalizer is None:
        if aggregation == "seq-mean-token-sum-norm":
            raise InputError("normalizer", "seq-mean-token-sum-norm divides by a constant the caller "
                             "chooses (Dr. GRPO: e.g. max response length x number of sequences)")
        return None, None
    if isinstance(normalizer, torch.Tensor):
        if normalizer.numel() != 1:
            raise ShapeError("normalizer", f"must hold one number, got shape {tuple(normalizer.shape)}")
        if normalizer.dtype == torch.bool or normalizer.dtype.is_complex:
            raise DTypeError("normalizer", f"dtype {normalizer.dtype} is not a real number type")
        if normalizer.device != logp.device:
            raise DeviceError("normalizer", f"on {normalizer.device}, logp on {logp.device}")
        value = normalizer.detach().reshape(1).contiguous()
        if validate and not torch.compiler.is_compiling():
            if not bool((torch.isfinite(value) & (value >= 0)).all()):  # the host sync of validation
                raise InputError("normalizer", f"the tensor must hold a finite number >= 0, got {value.item()!r}")
        return None, value
    return _positive("normalizer", normalizer), None
