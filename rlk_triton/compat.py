"""Framework presets: a framework's loss configuration, in its own names, mapped onto rlk's arguments.

    from rlk_triton import compat
    p = compat.verl(actor_cfg, rollout_correction=algorithm_cfg.rollout_correction)
    rc = rollout_correction(old_logp, rollout_logp, mask, **p.rollout_correction)   # when p.rollout_correction
    loss, per_token, diag = p(logp, old_logp, advantages, mask=rc.keep, ref_logp=ref_logp, entropy=entropy,
                              is_weights=rc.weights)
    # or, when p.normalizer_rule is None: policy_loss(logp, old_logp, advantages, mask=..., **p)

A Preset is a dict of keyword arguments for its loss function (p.loss: rlk_triton.losses.policy_loss or
gspo_loss) with: p.rollout_correction (kwargs of rlk_triton.losses.rollout_correction, or None),
p.advantages (kwargs that give the framework's advantage conventions to rlk_triton.advantages' functions,
per estimator), p.normalizer_rule (None, "T" or "B x max_len", "B": a normalizer the framework takes
from the batch's shape; calling the preset fills it in) and p.notes (where the numbers still differ).
Configurations rlk cannot reproduce raise InputError naming the option. docs/compat.md has every
mapping, taken from each framework's source (verl 0.8 core_algos.py / rollout_corr_helper.py, TRL's
GRPOTrainer, slime's megatron loss.py / ppo_utils.py).
"""
from __future__ import annotations

import math
from typing import Any, Optional

from .errors import InputError
from .losses import gspo_loss, policy_loss

__all__ = ["Preset", "verl", "trl", "slime"]

_MISSING = object()


class Preset(dict):
    """Keyword arguments of `loss` for one framework configuration (see the module docstring)."""

    def __init__(self, loss, kwargs: dict, *, rollout_correction: Optional[dict] = None,
                 advantages: Optional[dict] = None, normalizer_rule: Optional[str] = None,
                 max_completion_length: Optional[int] = None, notes: tuple = ()):
        super().__init__(kwargs)
        self.loss = loss
        self.rollout_correction = rollout_correction
        self.advantages = advantages or {}
        self.normalizer_rule = normalizer_rule
        self.max_completion_length = max_completion_length
        self.notes = tuple(notes)

    def __call__(self, logp, old_logp, advantages, **kwargs):
        """self.loss(logp, old_logp, advantages, **self, **kwargs), with the normalizer the framework
        takes from the batch's shape filled in (unless given)."""
        kw = dict(self)
        kw.update(kwargs)
        if kw.get("normalizer") is None and self.normalizer_rule is not None:
            B, T = logp.shape
            kw["normalizer"] = {"T": T, "B": B, "B x max_len": B * (self.max_completion_length or T)}[
                self.normalizer_rule] or None
        return self.loss(logp, old_logp, advantages, **kw)


def _get(cfg, key, default=_MISSING):
    """cfg[key] or cfg.key for a dict, an OmegaConf node or any object; dotted keys descend."""
    node = cfg
    for part in key.split("."):
        if node is None:
            break
        if isinstance(node, dict) or hasattr(node, "keys") and hasattr(node, "__getitem__"):
            node = node[part] if part in node else None
        else:
            node = getattr(node, part, None)
    if node is None:
        if default is _MISSING:
            raise InputError("cfg", f"missing {key!r}")
        return default
    return node


def _unsupported(option, value, why):
    raise InputError(option, f"{value!r}: {why}")


# ---- verl ----

_VERL_KL = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "low_var_kl", "k3": "low_var_kl"}
VERL_SAFETY_BOUND = 20.0  # verl clamps log-ratios at +-20 before exp (policy loss, IS weights, rejection)


def verl(cfg, rollout_correction=None) -> Preset:
    """verl's actor loss (actor_rollout_ref.actor: clip_ratio, clip_ratio_low / high, clip_ratio_c,
    loss_agg_mode, policy_loss.loss_mode vanilla / gspo / cispo, use_kl_loss, kl_loss_coef,
    kl_loss_type, entropy_coeff, loss_scale_factor) and algorithm.rollout_correction (rollout_is,
    rollout_is_threshold, rollout_rs, rollout_rs_threshold).

    Conventions carried: the dual clip always on (clip_ratio_c, default 3) for vanilla; the log-ratio
    clamped at +-20; k3 / low_var_kl clamped (u to +-20, the estimate to +-10); IS weights on the
    policy term only (tis_scope "pg"); rejection as a mask; the global normalizer is the caller's
    (verl's global_batch_info: normalizer = batch_num_tokens / dp_size, or global_batch_size /
    dp_size); seq-mean-token-sum-norm divides by loss_scale_factor or the response length T.
    Not carried: a batch with no active token (verl: NaN, rlk: 0); GSPO's clamp of the sequence
    log-ratio at 10 (s_i > e^10 only).
    """
    clip = float(_get(cfg, "clip_ratio", 0.2))
    low = float(_get(cfg, "clip_ratio_low", clip) or clip)
    high = float(_get(cfg, "clip_ratio_high", clip) or clip)
    agg = _get(cfg, "loss_agg_mode", "token-mean")
    mode = _get(cfg, "policy_loss.loss_mode", "vanilla")
    kw: dict[str, Any] = {"eps_low": low, "eps_high": high, "aggregation": agg}
    if _get(cfg, "use_kl_loss", False):
        kl_type = _get(cfg, "kl_loss_type", "low_var_kl")
        if kl_type not in _VERL_KL:
            _unsupported("kl_loss_type", kl_type, f"not reproduced (have: {', '.join(_VERL_KL)}); "
                         "'abs', 'full' and the straight-through '+' forms are not rlk estimators")
        kw.update(kl_coef=float(_get(cfg, "kl_loss_coef", 0.001)), kl_estimator=_VERL_KL[kl_type])
    ent = float(_get(cfg, "entropy_coeff", 0.0))
    if ent:
        kw["entropy_coef"] = ent
    notes = ["a batch with no active token: verl's loss is NaN, rlk's 0"]
    if mode == "vanilla":
        c = float(_get(cfg, "clip_ratio_c", 3.0))
        kw.update(loss_type="ppo", dual_clip_c=c, log_ratio_clamp=VERL_SAFETY_BOUND)
        loss = policy_loss
    elif mode == "cispo":
        kw.update(loss_type="cispo", log_ratio_clamp=VERL_SAFETY_BOUND)
        loss = policy_loss
    elif mode == "gspo":
        loss = gspo_loss
        notes.append("GSPO: verl clamps the sequence log-ratio at 10; rlk does not (s_i > e^10 only). "
                     "verl <= 0.8 aggregates GSPO seq-mean-token-mean whatever loss_agg_mode says: pass "
                     "aggregation='seq-mean-token-mean' for those versions")
    else:
        _unsupported("policy_loss.loss_mode", mode, "not reproduced (have: vanilla, gspo, cispo)")
    rule = None
    if agg == "seq-mean-token-sum-norm":
        factor = _get(cfg, "loss_scale_factor", None)
        if factor is not None:
            kw["normalizer"] = float(factor)
        else:
            rule = "T"  # verl's default: the response length of the micro-batch
    rc = _verl_rollout_correction(rollout_correction) if rollout_correction is not None else None
    if rc is not None and rc.get("is_level") is not None:
        kw["tis_scope"] = "pg"
    advantages = {
        "grpo": {"singleton": "raw"},  # group_advantages(mode="mean_std" or "mean")
        "rloo": {"singleton": "raw"},  # the loop estimator; verl's vectorized RLOO gives 0 (rlk's default)
        "reinforce_plus_plus_baseline": {"singleton": "raw", "eps_placement": "var", "eps": 1e-8},
        "gae": {"whiten": {"eps": 1e-8, "eps_placement": "var", "unbiased": True}},  # masked_whiten(gae(...)[0], mask)
    }
    return Preset(loss, kw, rollout_correction=rc, advantages=advantages, normalizer_rule=rule, notes=notes)


def _verl_rollout_correction(rc_cfg) -> Optional[dict]:
    level = _get(rc_cfg, "rollout_is", None)
    rs = _get(rc_cfg, "rollout_rs", None)
    if _get(rc_cfg, "rollout_is_batch_normalize", False):
        _unsupported("rollout_is_batch_normalize", True, "not reproduced (a batch statistic; divide the weights "
                     "by their mean yourself)")
    if level is None and rs is None:
        return None
    out: dict[str, Any] = {"log_ratio_clamp": VERL_SAFETY_BOUND}
    if level is not None:
        if level not in ("token", "sequence"):
            _unsupported("rollout_is", level, "verl has token and sequence")
        out.update(is_level=level, is_mode="truncate", is_high=float(_get(rc_cfg, "rollout_is_threshold", 2.0)))
    if rs is not None:
        options = [o.strip() for o in str(rs).split(",") if o.strip()]
        spec = _get(rc_cfg, "rollout_rs_threshold", None)
        if spec is None:
            _unsupported("rollout_rs_threshold", None, "required with rollout_rs")
        specs = [s.strip() for s in str(spec).split(",") if s.strip()]
        if len(specs) == 1:
            specs = specs * len(options)
        if len(specs) != len(options):
            _unsupported("rollout_rs_threshold", spec, "one threshold, or one per rollout_rs option")
        rejection = {}
        for opt, s in zip(options, specs):
            if opt.endswith("k1"):
                lo, hi = (s.split("_", 1) if "_" in s else (str(1.0 / float(s)), s))
                rejection[opt] = (float(lo), float(hi))
            else:
                rejection[opt] = float(s)
        out["rejection"] = rejection
    return out


# ---- TRL ----

_TRL_AGG = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm",
            "dapo": "token-mean", "cispo": "token-mean"}


def trl(args, *, use_vllm: bool = True) -> Preset:
    """TRL's GRPOTrainer (GRPOConfig: loss_type grpo / bnpo / dr_grpo / dapo / cispo, epsilon,
    epsilon_high, beta, delta, importance_sampling_level, max_completion_length, entropy_coef,
    vllm_importance_sampling_correction / _mode / _clip_min / _clip_max).

    Conventions carried: "grpo" averages over every row, empty ones included (normalizer = B);
    "dr_grpo" divides by B x max_completion_length; "dapo" / "cispo" by the caller's
    num_items_in_batch / num_processes (the normalizer; the local token count by default); CISPO's
    clamp of the ratio at epsilon_high (absolute) with no lower bound; delta as the dual clip (the
    same numbers when delta > 1 + epsilon_high); the vLLM importance ratio (sequence: the product of
    the token ratios) on the policy term only, before the beta KL (k3, unclamped); "sequence"
    importance sampling level: gspo_loss. Not carried: gradient-accumulation scaling (TRL divides by
    the accumulation steps: scale the loss), top_entropy_quantile, off_policy_mask_threshold, the
    entropy bonus with grpo / dr_grpo (TRL's is a token mean whatever the loss type).
    """
    loss_type = _get(args, "loss_type", "dapo")
    if loss_type not in _TRL_AGG:
        _unsupported("loss_type", loss_type, f"not reproduced (have: {', '.join(_TRL_AGG)})")
    eps = float(_get(args, "epsilon", 0.2))
    eps_high = float(_get(args, "epsilon_high", eps) or eps)
    for option, off in (("top_entropy_quantile", 1.0), ("off_policy_mask_threshold", None)):
        v = _get(args, option, off)
        if v != off:
            _unsupported(option, v, "not reproduced")
    level = _get(args, "importance_sampling_level", "token")
    kw: dict[str, Any] = {"eps_low": eps, "eps_high": eps_high, "aggregation": _TRL_AGG[loss_type]}
    beta = float(_get(args, "beta", 0.0))
    if beta:
        if _get(args, "use_bias_correction_kl", False):
            _unsupported("use_bias_correction_kl", True, "not reproduced")
        kw.update(kl_coef=beta, kl_estimator="k3")
    ent = float(_get(args, "entropy_coef", 0.0))
    if ent:
        if loss_type in ("grpo", "dr_grpo"):
            _unsupported("entropy_coef", ent, f"TRL's entropy bonus is a token mean, not {loss_type}'s aggregation")
        kw["entropy_coef"] = ent
    notes = ["TRL divides grpo / bnpo / dr_grpo losses by the gradient-accumulation steps: scale the loss"]
    if loss_type == "cispo":
        if level != "token":
            _unsupported("importance_sampling_level", level, "cispo is token-level")
        kw.update(loss_type="cispo", eps_low=1.0, eps_high=eps_high - 1.0)  # clamp(r, max=epsilon_high)
    else:
        kw["loss_type"] = "grpo"
        delta = _get(args, "delta", None)
        if delta is not None:
            if not float(delta) > 1.0 + eps_high:
                _unsupported("delta", delta, "reproduced as the dual clip only when delta > 1 + epsilon_high")
            if level != "token":
                _unsupported("delta", delta, "with the sequence level")
            kw["dual_clip_c"] = float(delta)
    loss = policy_loss
    if level == "sequence":
        loss = gspo_loss
        kw.pop("loss_type", None)
        if loss_type == "dr_grpo":
            kw["aggregation"] = "seq-mean-token-sum-norm"
        notes.append("sequence level with token-level vLLM weights: TRL's gradient spreads each sequence's "
                     "mean weight over its tokens, rlk weighs each token's share by its own weight (the same "
                     "value, the same gradient with sequence-level weights)")
    elif level != "token":
        _unsupported("importance_sampling_level", level, "have: token, sequence")
    rule = {"grpo": "B", "dr_grpo": "B x max_len"}.get(loss_type)
    rc = None
    if use_vllm and _get(args, "vllm_importance_sampling_correction", True):
        mode = _get(args, "vllm_importance_sampling_mode", "sequence_mask")
        lvl, _, m = mode.partition("_")
        if lvl not in ("token", "sequence") or m not in ("truncate", "mask"):
            _unsupported("vllm_importance_sampling_mode", mode, "have: token_/sequence_ truncate / mask")
        hi = _get(args, "vllm_importance_sampling_clip_max", 3.0)
        lo = _get(args, "vllm_importance_sampling_clip_min", None)
        rc = {"is_level": lvl, "is_mode": m, "is_high": math.inf if hi is None else float(hi),
              "is_low": None if lo is None else float(lo)}
        kw["tis_scope"] = "pg"
    return Preset(loss, kw, rollout_correction=rc, normalizer_rule=rule,
                  max_completion_length=_get(args, "max_completion_length", None), notes=notes)


# ---- slime ----

_SLIME_KL = {"k1": "k1", "k2": "k2", "k3": "k3", "low_var_kl": "low_var_kl"}


def slime(args) -> Preset:
    """slime's policy loss (args: advantage_estimator, eps_clip, eps_clip_high, eps_clip_c, use_kl_loss,
    kl_loss_coef, kl_loss_type, entropy_coef, use_tis, tis_clip, tis_clip_low, custom_tis_function_path,
    calculate_per_token_loss).

    Conventions carried: the per-sample token mean summed over samples (seq-mean-token-mean; the
    normalizer is the global sample count the caller divides by) or, with calculate_per_token_loss, the
    token sum (token-mean with the global token count); TIS clamp(w, tis_clip_low, tis_clip) on the
    policy term only, denominators unchanged; IcePop (custom_tis_function_path ending in
    icepop_function): weight 0 outside [tis_clip_low, tis_clip]; k3 unclamped, low_var_kl clamped.
    Not carried: GSPO with TIS (slime's gradient spreads the sequence's mean weight, see trl()), OPSM,
    the unbiased-KL importance ratio, routing replay.
    """
    est = _get(args, "advantage_estimator", "grpo")
    eps = float(_get(args, "eps_clip", 0.2))
    eps_high = float(_get(args, "eps_clip_high", eps) or eps)
    kw: dict[str, Any] = {"eps_low": eps, "eps_high": eps_high,
                          "aggregation": "token-mean" if _get(args, "calculate_per_token_loss", False)
                          else "seq-mean-token-mean"}
    for option in ("use_opsm", "use_unbiased_kl"):
        if _get(args, option, False):
            _unsupported(option, True, "not reproduced")
    if _get(args, "use_kl_loss", False):
        kt = _get(args, "kl_loss_type", "k1")
        if kt not in _SLIME_KL:
            _unsupported("kl_loss_type", kt, f"have: {', '.join(_SLIME_KL)}")
        kw.update(kl_coef=float(_get(args, "kl_loss_coef", 0.0)), kl_estimator=_SLIME_KL[kt])
    ent = float(_get(args, "entropy_coef", 0.0))
    if ent:
        kw["entropy_coef"] = ent
    loss = policy_loss
    if est == "gspo":
        loss = gspo_loss
        if _get(args, "use_tis", False):
            _unsupported("use_tis", True, "with GSPO: slime spreads the sequence's mean weight (not reproduced)")
    elif est == "cispo":
        kw["loss_type"] = "cispo"
    else:
        kw["loss_type"] = "ppo"
        c = _get(args, "eps_clip_c", None)
        if c is not None:
            kw["dual_clip_c"] = float(c)
    rc = None
    if _get(args, "use_tis", False):
        custom = _get(args, "custom_tis_function_path", None)
        icepop = custom is not None and str(custom).endswith("icepop_function")
        if custom is not None and not icepop:
            _unsupported("custom_tis_function_path", custom, "only slime's icepop_function is reproduced")
        lo = _get(args, "tis_clip_low", 0.0)
        rc = {"is_level": "token", "is_mode": "mask" if icepop else "truncate",
              "is_high": float(_get(args, "tis_clip", 2.0)), "is_low": None if lo is None else float(lo)}
        kw["tis_scope"] = "pg"
    return Preset(loss, kw, rollout_correction=rc, notes=(
        "slime divides by the global sample (or token) count outside the loss: pass it as normalizer",))
