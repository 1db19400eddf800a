"""How the RL losses and advantages are checked: inputs, error scales, judges, cases, row ops.

rlk_triton/operators.py describes ratio_kl, policy_loss, gspo_loss, gae, group_advantages and
reinforce_pp_baseline; rl_harnesses() says how to check them; the tests (tests/test_rl_losses.py, tests/test_gspo.py,
tests/test_rl_backends.py, tests/test_rl_registry.py),
`rlk-triton check` and scripts/measure_rl_losses.py use the same definitions from here, so that the
contract and everything that judges against it share one definition of `scale`.

Error scales (the `scale` of the scaled_abs rows; the size of the numbers the fp32 arithmetic
handles, which its rounding error grows with), per active token, float64, with lr = logp - old,
r = exp(lr), cr = clip(r), A the advantage, u = ref - logp:
  kscale(kl)      k1: |u|,  k2: u^2,  k3: exp(u) + |u| + 1
  log_ratio       |log_ratio|
  ratio           r (1 + |lr|)                    (exp turns lr's rounding into r's relative error)
  kl              kscale
  per_token_loss  tis_s * (pg_s + |kl_coef| kscale + |entropy_coef entropy|) + |l|, with
                  pg_s = |A| (r (1 + |lr|) + cr + [dual] c), times |logp| for cispo,
                  tis_s = min(w, cap) (1 + |old - rollout|) for "truncate", else 1
  loss            sum_t w_t scale_t over the aggregation's weights w
  clipfrac 1; approx_kl mean(exp(old - logp) + |old - logp| + 1); ratio_mean mean(r (1 + |lr|));
  ratio_min / ratio_max max(r (1 + |lr|)), all over the active tokens (0 when none is active).
Gradient sensitivity (rounding_plus_sensitivity), per active token:
  policy_loss d logp     (|g_loss w_t| + |g_t|) tis_s (dpg_s + |kl_coef| dkscale), dpg_s = |A| (r (1 + |lr|) + cr)
                         (the first term only for cispo's cr), dkscale k1: 1, k2: |u|, k3: 1 + exp(u) (1 + |u|)
  policy_loss d entropy  (|g_loss w_t| + |g_t|) tis_s |entropy_coef|
  ratio_kl d logp        (|g_lr| + |g_r| r (1 + |lr|)) + |g_kl| dkscale
Inputs keep a margin of 1e-4 (relative) from the branch edges (clip bounds, dual clip, log-ratio
clamp, TIS cap), where the gradient jumps and the branch is decided by the last fp32 rounding; the
contract judges the arithmetic, not those ties.

GSPO (gspo_loss): per-sequence scales, defined in the comment above gspo_inputs.
Advantages (contracts/advantages.yaml): the scales are reference/advantages.py's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .. import contracts
from .._runtime import arch_of
from ..losses import gspo_loss, policy_loss, ratio_kl
from ..reference.losses import (aggregation_weights, gspo_grad_reference, gspo_reference, gspo_row_weights, gspo_terms,
                                policy_loss_grad_reference, policy_loss_reference, policy_loss_terms,
                                ratio_kl_grad_reference, ratio_kl_reference)
from .invariance import RowOp

OP = "rl_losses"
EPS_LOW, EPS_HIGH, DUAL_C, CLAMP, TIS_CAP, NORMALIZER = 0.2, 0.28, 3.0, 0.3, 1.5, 1000.0
RATIO_EDGES = (1 - EPS_LOW, 1 + EPS_LOW, 1 + EPS_HIGH, DUAL_C)
LOG_RATIO_EDGES = (-CLAMP, CLAMP)
TIS_EDGES = (TIS_CAP,)
EDGE_MARGIN = 1e-4


# ---- inputs ----

def _away_from(x, edges, margin=EDGE_MARGIN):
    """x (float32) moved by 3 * margin where it lies within margin of an edge (float64 distance)."""
    x64 = x.astype(np.float64)
    near = np.zeros(x.shape, bool)
    for e in edges:
        near |= np.abs(x64 - e) < margin * max(1.0, abs(e))
    return np.where(near, x64 + 3 * margin * max(1.0, *map(abs, edges)), x64).astype(np.float32)


def make_inputs(B, T, seed=0, *, adv_per_seq=False, empty_rows=(), p_active=0.8, device="cpu"):
    """fp32 [B, T] inputs shaped like an RL step: log-probs <= 0, old / ref / rollout logp nearby,
    a few tokens far off (ratios beyond the dual clip), ~p_active of the tokens active."""
    rng = np.random.default_rng(seed)
    logp = (-np.abs(rng.standard_normal((B, T))) * 2).astype(np.float32)
    off = 0.5 * rng.standard_normal((B, T))
    wild = rng.random((B, T)) < 0.05
    off = np.where(wild, rng.uniform(-2.0, 2.0, (B, T)), off)
    old = (logp - off).astype(np.float32)
    lr = logp.astype(np.float64) - old
    edges = [math.log(e) for e in RATIO_EDGES] + list(LOG_RATIO_EDGES)
    old = (logp - _away_from(lr.astype(np.float32), edges)).astype(np.float32)
    ref = (logp + 0.3 * rng.standard_normal((B, T))).astype(np.float32)
    roll = (old + 0.3 * rng.standard_normal((B, T))).astype(np.float32)
    lw = old.astype(np.float64) - roll
    roll = (old - _away_from(lw.astype(np.float32), [math.log(c) for c in TIS_EDGES])).astype(np.float32)
    adv = rng.standard_normal((B,) if adv_per_seq else (B, T)).astype(np.float32)
    entropy = rng.uniform(0.0, 4.0, (B, T)).astype(np.float32)
    mask = rng.random((B, T)) < p_active
    mask[list(empty_rows)] = False
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    return {"logp": t(logp), "old_logp": t(old), "ref_logp": t(ref), "rollout_logp": t(roll),
            "advantages": t(adv), "entropy": t(entropy), "mask": t(mask)}


def policy_kwargs(inputs, spec):
    """(kwargs for rlk_triton.losses.policy_loss, kwargs for the float64 reference) of one case.

    spec keys: loss_type, aggregation, normalizer, eps_high, dual_clip_c, kl_coef, kl_estimator,
    entropy_coef, tis_mode ("truncate" / "mask" / None), is_weights (True: seeded weights in [0, 2)),
    tis_scope, log_ratio_clamp; or kwargs: policy_loss's keyword arguments as they are (a preset's)."""
    if "kwargs" in spec:
        ours = {"loss_type": "ppo", "aggregation": "token-mean", "normalizer": None, "eps_low": EPS_LOW,
                "dual_clip_c": None, **spec["kwargs"]}
        return ours, {k: (_np(v) if torch.is_tensor(v) else v) for k, v in ours.items()}
    ours = {"loss_type": spec.get("loss_type", "ppo"), "eps_low": EPS_LOW, "eps_high": spec.get("eps_high"),
            "dual_clip_c": spec.get("dual_clip_c"), "aggregation": spec.get("aggregation", "token-mean"),
            "normalizer": spec.get("normalizer")}
    if spec.get("kl_coef"):
        ours.update(ref_logp=inputs["ref_logp"], kl_coef=spec["kl_coef"], kl_estimator=spec.get("kl_estimator", "k3"))
    if spec.get("entropy_coef"):
        ours.update(entropy=inputs["entropy"], entropy_coef=spec["entropy_coef"])
    if spec.get("tis_mode"):
        ours.update(rollout_logp=inputs["rollout_logp"], tis_cap=TIS_CAP, tis_mode=spec["tis_mode"])
    if spec.get("is_weights"):
        ours["is_weights"] = seeded_weights(inputs["logp"].shape, inputs["logp"].device)
    for key in ("tis_scope", "log_ratio_clamp"):
        if spec.get(key) is not None:
            ours[key] = spec[key]
    ref = {k: (_np(v) if torch.is_tensor(v) else v) for k, v in ours.items()}
    return ours, ref


def seeded_weights(shape, device, seed=7):
    """fp32 importance weights in [0, 2) (a fixed seed): the is_weights of the parity cases."""
    return (2 * torch.rand(shape, generator=torch.Generator().manual_seed(seed))).to(device)


def _np(x):
    return x.detach().double().cpu().numpy()


# ---- error scales and sensitivities (the contract's definitions; see the module docstring) ----

def _kscale(u, estimator):
    if estimator == "low_var_kl":  # k3 on the clamped u
        u = np.clip(u, -20.0, 20.0)
        estimator = "k3"
    return {"k1": np.abs(u), "k2": u * u, "k3": np.exp(u) + np.abs(u) + 1.0}[estimator]


def _dkscale(u, estimator):
    if estimator == "low_var_kl":
        u = np.clip(u, -20.0, 20.0)
        estimator = "k3"
    return {"k1": np.ones_like(u), "k2": np.abs(u), "k3": 1.0 + np.exp(u) * (1.0 + np.abs(u))}[estimator]


def _policy_pieces(x, ref_kw):
    """Per-token pieces of the scales, float64 [B, T]."""
    logp, old = x["logp"], x["old_logp"]
    adv = x["advantages"] if x["advantages"].ndim == 2 else np.broadcast_to(x["advantages"][:, None], logp.shape)
    lr = logp - old
    if ref_kw.get("log_ratio_clamp") is not None:
        lr = np.clip(lr, -ref_kw["log_ratio_clamp"], ref_kw["log_ratio_clamp"])
    r = np.exp(lr)
    eps_low = ref_kw.get("eps_low", EPS_LOW)
    eps_high = eps_low if ref_kw.get("eps_high") is None else ref_kw["eps_high"]
    cr = np.clip(r, 1 - eps_low, 1 + eps_high)
    rr = r * (1 + np.abs(lr))
    cispo = ref_kw.get("loss_type") == "cispo"
    pg_s = np.abs(adv) * (rr + cr + (ref_kw.get("dual_clip_c") or 0.0)) * (np.abs(logp) if cispo else 1.0)
    dpg_s = np.abs(adv) * (cr if cispo else rr + cr)
    kl_s = dkl_s = 0.0
    if ref_kw.get("kl_coef"):
        u = x["ref_logp"] - logp
        est = ref_kw.get("kl_estimator", "k3")
        kl_s = abs(ref_kw["kl_coef"]) * _kscale(u, est)
        dkl_s = abs(ref_kw["kl_coef"]) * _dkscale(u, est)
    ent_s = abs(ref_kw.get("entropy_coef", 0.0)) * np.abs(x["entropy"])
    tis_s = 1.0
    if ref_kw.get("is_weights") is not None:
        tis_s = np.abs(ref_kw["is_weights"])
    elif ref_kw.get("tis_mode") == "truncate":
        lw = old - x["rollout_logp"]
        tis_s = np.minimum(np.exp(lw), TIS_CAP) * (1 + np.abs(lw))
    # the weight on the policy term only (tis_scope "pg"), or on the whole token loss
    pg_w, rest_w = (tis_s, 1.0) if ref_kw.get("tis_scope") == "pg" else (1.0, tis_s)
    return {"rr": rr, "pg": pg_s, "dpg": dpg_s, "kl": kl_s, "dkl": dkl_s, "ent": ent_s, "tis": tis_s,
            "pg_w": pg_w, "rest_w": rest_w, "k3_old": np.exp(-lr) + np.abs(lr) + 1.0, "k1_old": np.abs(lr)}


def _mean_over(values, active):
    n = active.sum()
    return float(values[active].sum() / n) if n else 0.0


def policy_forward_scales(x, ref_kw, terms, weights):
    p = _policy_pieces(x, ref_kw)
    active = terms["active"]
    tok = np.where(active, p["rest_w"] * (p["pg_w"] * p["pg"] + p["kl"] + p["ent"]) + np.abs(terms["loss"]), 0.0)
    rr_max = float(p["rr"][active].max()) if active.any() else 0.0
    return {"per_token_loss": tok, "loss": float((weights * tok).sum()),
            "clipfrac": 1.0 if active.any() else 0.0, "approx_kl": _mean_over(p["k3_old"], active),
            "ratio_mean": _mean_over(p["rr"], active), "ratio_min": rr_max, "ratio_max": rr_max,
            "ppo_kl": _mean_over(p["k1_old"], active)}


def policy_grad_sensitivity(x, ref_kw, terms, weights, grad_loss, grad_tokens):
    p = _policy_pieces(x, ref_kw)
    up = np.abs(grad_loss * weights) + (0.0 if grad_tokens is None else np.abs(grad_tokens))
    active = terms["active"]
    d_logp = np.where(active, up * p["rest_w"] * (p["pg_w"] * p["dpg"] + p["dkl"]), 0.0)
    d_ent = np.where(active, up * p["rest_w"] * abs(ref_kw.get("entropy_coef", 0.0)), 0.0)
    return d_logp, d_ent


def ratio_kl_scales(x, estimator, clamp, ref_out):
    lr, r = ref_out[0], ref_out[1]
    s = {"log_ratio": np.abs(lr), "ratio": r * (1 + np.abs(lr))}
    if ref_out[2] is not None:
        s["kl"] = _kscale(x["ref_logp"] - x["logp"], estimator)
    return s


def ratio_kl_grad_sensitivity(x, estimator, clamp, g_lr, g_r, g_kl):
    lr = x["logp"] - x["old_logp"]
    if clamp is not None:
        lr = np.clip(lr, -clamp, clamp)
    s = np.abs(g_lr) + np.abs(g_r) * np.exp(lr) * (1 + np.abs(lr))
    if g_kl is not None:
        s = s + np.abs(g_kl) * _dkscale(x["ref_logp"] - x["logp"], estimator)
    return s


# ---- running and judging a case ----

def assert_unused_outputs_are_zeros(outputs_of, x, n_outputs):
    """For each of a loss's first n_outputs differentiated alone (a seeded upstream gradient), x's
    gradient has the bits of the same backward with explicit zero gradients for the other outputs:
    what the op's backward makes of the gradients autograd leaves out (None). outputs_of(x) -> outputs."""
    for used in range(n_outputs):
        xg = x.detach().clone().requires_grad_(True)
        outs = outputs_of(xg)[:n_outputs]
        g = torch.randn(outs[used].shape, generator=torch.Generator().manual_seed(used)).to(x.device)
        (alone,) = torch.autograd.grad(outs[used], xg, g, retain_graph=True)
        ups = [torch.zeros_like(o) for o in outs]
        ups[used] = g
        (explicit,) = torch.autograd.grad(outs, xg, ups)
        assert torch.equal(alone, explicit), f"output {used} differentiated alone"


def run_policy(inputs, spec, grad_loss=1.3, token_grad_seed=None, backend="triton"):
    """Ours and the reference, values and gradients: (ours, ref, kw64, terms, weights, g_tok)."""
    ours_kw, ref_kw = policy_kwargs(inputs, spec)
    logp = inputs["logp"].detach().clone().requires_grad_(True)
    if "entropy" in ours_kw:
        ours_kw["entropy"] = ours_kw["entropy"].detach().clone().requires_grad_(True)
    loss, per_token, diag = policy_loss(logp, inputs["old_logp"], inputs["advantages"], mask=inputs["mask"],
                                        backend=backend, **ours_kw)
    g_tok = None
    total = loss * grad_loss
    if token_grad_seed is not None:
        g_tok = torch.randn(per_token.shape, generator=torch.Generator().manual_seed(token_grad_seed))
        total = total + (per_token * g_tok.to(per_token.device)).sum()
    total.backward()
    ours = {"loss": loss.detach(), "per_token_loss": per_token.detach(), **diag, "d_logp": logp.grad,
            "d_entropy": ours_kw["entropy"].grad if "entropy" in ours_kw else None}
    x, mask, terms, weights = _policy_case(inputs, ref_kw)
    r_loss, r_tok, r_diag = policy_loss_reference(x["logp"], x["old_logp"], x["advantages"], mask, **ref_kw)
    g_tok64 = None if g_tok is None else g_tok.double().numpy()
    r_dlogp, r_dent = policy_loss_grad_reference(x["logp"], x["old_logp"], x["advantages"], mask, grad_loss,
                                                 g_tok64, **ref_kw)
    ref = {"loss": r_loss, "per_token_loss": r_tok, **r_diag, "d_logp": r_dlogp, "d_entropy": r_dent}
    return ours, ref, (x, ref_kw, terms, weights, grad_loss, g_tok64)


def _policy_case(inputs, ref_kw):
    """(inputs as float64 NumPy, mask, policy_loss_terms, aggregation weights) of a float64 policy case."""
    x = {k: _np(v) for k, v in inputs.items() if k != "mask"}
    mask = inputs["mask"].cpu().numpy()
    core = {k: v for k, v in ref_kw.items() if k not in ("aggregation", "normalizer")}
    terms = policy_loss_terms(x["logp"], x["old_logp"], x["advantages"], mask, **core)
    return x, mask, terms, aggregation_weights(terms["active"], ref_kw["aggregation"], ref_kw["normalizer"])


def policy_loss_scales(inputs, spec):
    """(loss scale, d logp sensitivity [B, T]) of the policy loss with upstream gradient 1: the
    magnitudes its value and gradient are computed from (the scales judge_policy holds ours to)."""
    _, ref_kw = policy_kwargs(inputs, spec)
    x, _, terms, weights = _policy_case(inputs, ref_kw)
    return (policy_forward_scales(x, ref_kw, terms, weights)["loss"],
            policy_grad_sensitivity(x, ref_kw, terms, weights, 1.0, None)[0])


def judge_policy(inputs, spec, device, grad_loss=1.3, token_grad_seed=1, backend="triton"):
    """{output or gradient: worst error / what the contract allows} (<= 1 passes)."""
    arch = arch_of(torch.device(device))
    ours, ref, (x, ref_kw, terms, weights, g, g_tok) = run_policy(inputs, spec, grad_loss, token_grad_seed,
                                                                  backend)
    fwd = contracts.judgment(OP, torch.float32, "forward_accuracy", arch)["outputs"]
    scales = policy_forward_scales(x, ref_kw, terms, weights)
    out = {name: contracts.scaled_abs_ratio(_np(ours[name]), ref[name], scales[name], fwd[name])
           for name in scales}
    bound = contracts.judgment(OP, torch.float32, "gradient_accuracy", arch)
    s_logp, s_ent = policy_grad_sensitivity(x, ref_kw, terms, weights, g, g_tok)
    out["d_logp"] = contracts.rounding_plus_sensitivity_ratio(_np(ours["d_logp"]), ref["d_logp"], s_logp, bound)
    if ours["d_entropy"] is not None:
        out["d_entropy"] = contracts.rounding_plus_sensitivity_ratio(_np(ours["d_entropy"]), ref["d_entropy"],
                                                                     s_ent, bound)
    return out


def judge_ratio_kl(inputs, device, *, with_ref=True, use_mask=True, estimator="k3", clamp=None, seed=2,
                   backend="triton"):
    """{output or gradient: worst error / what the contract allows} (<= 1 passes)."""
    arch = arch_of(torch.device(device))
    logp = inputs["logp"].detach().clone().requires_grad_(True)
    ref_t = inputs["ref_logp"] if with_ref else None
    mask = inputs["mask"] if use_mask else None
    outs = ratio_kl(logp, inputs["old_logp"], ref_t, mask=mask, kl_estimator=estimator, log_ratio_clamp=clamp,
                    backend=backend)
    gen = torch.Generator().manual_seed(seed)
    ups = [torch.randn(logp.shape, generator=gen) for _ in range(3)]
    total = sum((o * u.to(o.device)).sum() for o, u in zip(outs, ups) if o is not None)
    total.backward()
    x = {k: _np(v) for k, v in inputs.items() if k != "mask"}
    m = None if mask is None else mask.cpu().numpy()
    ref_out = ratio_kl_reference(x["logp"], x["old_logp"], x["ref_logp"] if with_ref else None, m, estimator, clamp)
    g = [u.double().numpy() for u in ups]
    ref_grad = ratio_kl_grad_reference(x["logp"], x["old_logp"], x["ref_logp"] if with_ref else None, m, g[0], g[1],
                                       g[2] if with_ref else None, estimator, clamp)
    fwd = contracts.judgment(OP, torch.float32, "forward_accuracy", arch)["outputs"]
    scales = ratio_kl_scales(x, estimator, clamp, ref_out)
    out = {name: contracts.scaled_abs_ratio(_np(o), r, scales[name], fwd[name])
           for name, o, r in zip(("log_ratio", "ratio", "kl"), outs, ref_out) if o is not None}
    bound = contracts.judgment(OP, torch.float32, "gradient_accuracy", arch)
    sens = ratio_kl_grad_sensitivity(x, estimator, clamp, g[0], g[1], g[2] if with_ref else None)
    out["d_logp"] = contracts.rounding_plus_sensitivity_ratio(_np(logp.grad), ref_grad, sens, bound)
    return out

# ---- GSPO (rlk_triton.losses.gspo_loss): inputs, scales, judge ----
# Scales (what fp32 rounding grows with), per sequence i over its active tokens (after TIS masking),
# with m_i = mean of |logp| + |old_logp| (the subtraction and the mean: s_i = exp(mean log-ratio)
# carries a relative error of about eps (1 + m_i)), tis_s_t as in policy_loss (min(w, cap) (1 + |old -
# rollout|) for "truncate", else 1) and kscale / dkscale as above:
#   gspo_sequence_loss  mean_t tis_s_t (|A_i| max(s_i, clip(s_i)) (1 + m_i) + |kl_coef| kscale_t + |entropy_coef entropy_t|)
#   gspo_loss           the same, summed with the aggregation's weight (1 / normalizer or 1 / #sequences)
#   gspo_ratio          s_i (1 + m_i) (ratio_mean: the mean of those; ratio_min / ratio_max: their max)
#   clipfrac 1; approx_kl as policy_loss's (over the active tokens)
#   d logp sensitivity  |up_i| tis_s_t (|A_i| s_i [unclipped] (1 + m_i) + |kl_coef| dkscale_t) / n_i
#   d entropy           |up_i| tis_s_t |entropy_coef| / n_i,   up_i = g_loss w + g_i
# Without the optional terms these are the scales the gspo_* rows were first measured with.

GSPO_CLIPS = {"paper": (3e-4, 4e-4), "ppo": (EPS_LOW, EPS_HIGH)}
GSPO_FEATURES = {
    "plain": {},
    "kl_k1": {"kl_coef": 0.05, "kl_estimator": "k1"},
    "kl_k2": {"kl_coef": 0.05, "kl_estimator": "k2"},
    "kl_k3": {"kl_coef": 0.1, "kl_estimator": "k3"},
    "entropy": {"entropy_coef": 0.01},
    "tis_truncate": {"tis_mode": "truncate"},
    "tis_mask": {"tis_mode": "mask"},
    "everything": {"kl_coef": 0.1, "entropy_coef": 0.01, "tis_mode": "truncate"},
    "low_var_kl": {"kl_coef": 0.1, "kl_estimator": "low_var_kl"},
    "tis_pg": {"kl_coef": 0.1, "entropy_coef": 0.01, "tis_mode": "truncate", "tis_scope": "pg"},
    "is_weights": {"kl_coef": 0.1, "entropy_coef": 0.01, "is_weights": True},
    "is_weights_pg": {"kl_coef": 0.1, "entropy_coef": 0.01, "is_weights": True, "tis_scope": "pg"},
    "token_mean": {"kl_coef": 0.1, "tis_mode": "truncate", "aggregation": "token-mean"},
    "token_sum": {"entropy_coef": 0.01, "aggregation": "seq-mean-token-sum"},
}


def gspo_inputs(B, T, seed, device, spread=1e-3, p_active=0.8, empty_rows=()):
    """fp32 inputs of gspo_loss: logp = old_logp + spread * N(0, 1) (sequence ratios near 1), one
    advantage per sequence, ref / rollout logp and entropy as make_inputs (rollout kept 1e-4 away from
    the TIS cap)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 4
    logp = old + spread * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    mask = torch.rand(B, T, generator=g) < p_active
    mask[list(empty_rows)] = False
    ref = logp + 0.3 * torch.randn(B, T, generator=g)
    lw = _away_from((0.3 * torch.randn(B, T, generator=g)).numpy(), [math.log(c) for c in TIS_EDGES])
    roll = old - torch.from_numpy(lw)
    entropy = torch.rand(B, T, generator=g) * 4
    return {k: v.to(device) for k, v in (("logp", logp), ("old_logp", old), ("advantages", adv), ("mask", mask),
                                          ("ref_logp", ref), ("rollout_logp", roll), ("entropy", entropy))}


def gspo_kwargs(inputs, spec):
    """(kwargs for rlk_triton.losses.gspo_loss, kwargs for reference/losses.py's gspo_*) of one case.
    spec keys: clip ("paper" / "ppo"), normalizer, kl_coef, kl_estimator, entropy_coef, tis_mode,
    is_weights (True: seeded weights), tis_scope, aggregation; or kwargs: gspo_loss's keyword arguments."""
    if "kwargs" in spec:
        ours = {"normalizer": None, "aggregation": "seq-mean-token-mean", "eps_high": None, **spec["kwargs"]}
        if ours["eps_high"] is None:
            ours["eps_high"] = ours["eps_low"]
        return ours, {k: (_np(v) if torch.is_tensor(v) else v) for k, v in ours.items()}
    eps_low, eps_high = GSPO_CLIPS[spec.get("clip", "paper")]
    ours = {"eps_low": eps_low, "eps_high": eps_high, "normalizer": spec.get("normalizer"),
            "aggregation": spec.get("aggregation", "seq-mean-token-mean")}
    if spec.get("kl_coef"):
        ours.update(ref_logp=inputs["ref_logp"], kl_coef=spec["kl_coef"], kl_estimator=spec.get("kl_estimator", "k3"))
    if spec.get("entropy_coef"):
        ours.update(entropy=inputs["entropy"], entropy_coef=spec["entropy_coef"])
    if spec.get("tis_mode"):
        ours.update(rollout_logp=inputs["rollout_logp"], tis_cap=TIS_CAP, tis_mode=spec["tis_mode"])
    if spec.get("is_weights"):
        ours["is_weights"] = seeded_weights(inputs["logp"].shape, inputs["logp"].device)
    if spec.get("tis_scope"):
        ours["tis_scope"] = spec["tis_scope"]
    return ours, {k: (_np(v) if torch.is_tensor(v) else v) for k, v in ours.items()}


def _gspo_pieces(x, mask, ref_kw):
    """Per-sequence and per-token pieces of the GSPO scales (see above), float64."""
    kw = {k: v for k, v in ref_kw.items() if k not in ("normalizer", "aggregation")}
    t = gspo_terms(x["logp"], x["old_logp"], x["advantages"], mask, **kw)
    active, n, has, s = t["active"], t["n"], t["has"], t["s"]
    n1 = np.maximum(n, 1.0)
    mag = np.where(active, np.abs(x["logp"]) + np.abs(x["old_logp"]), 0.0).sum(1) / n1
    a = x["advantages"]
    cs = np.clip(s, 1 - ref_kw["eps_low"], 1 + ref_kw["eps_high"])
    unclipped = -a * s >= -a * cs
    tis_s = np.ones_like(x["logp"])
    if ref_kw.get("is_weights") is not None:
        tis_s = np.abs(ref_kw["is_weights"])
    elif ref_kw.get("tis_mode") == "truncate":
        lw = x["old_logp"] - x["rollout_logp"]
        tis_s = np.minimum(np.exp(lw), TIS_CAP) * (1 + np.abs(lw))
    rest_s = np.ones_like(tis_s) if ref_kw.get("tis_scope") == "pg" else tis_s
    tok_s = dtok_s = np.zeros_like(x["logp"])
    if ref_kw.get("kl_coef"):
        u = x["ref_logp"] - x["logp"]
        tok_s = abs(ref_kw["kl_coef"]) * _kscale(u, ref_kw.get("kl_estimator", "k3"))
        dtok_s = abs(ref_kw["kl_coef"]) * _dkscale(u, ref_kw.get("kl_estimator", "k3"))
    tok_s = tok_s + abs(ref_kw.get("entropy_coef", 0.0)) * np.abs(x["entropy"])
    z = lambda v: np.where(active, v, 0.0)  # noqa: E731
    pg_s = np.abs(a) * np.maximum(s, cs) * (1 + mag)
    seq = np.where(has, z(tis_s * pg_s[:, None] + rest_s * tok_s).sum(1) / n1, 0.0)
    dpg_s = np.where(unclipped, np.abs(a) * s, 0.0) * (1 + mag)
    return {"t": t, "seq": seq, "ratio": np.where(has, s * (1 + mag), 0.0), "n1": n1,
            "d_logp": z(tis_s * dpg_s[:, None] + rest_s * dtok_s) / n1[:, None],
            "d_entropy": z(rest_s * abs(ref_kw.get("entropy_coef", 0.0))) / n1[:, None],
            "k3_old": np.exp(x["old_logp"] - x["logp"]) + np.abs(x["old_logp"] - x["logp"]) + 1.0,
            "k1_old": np.abs(x["old_logp"]) + np.abs(x["logp"])}


def _gspo_scale_pieces(x, mask, ref_kw):
    """(_gspo_pieces, the rows' aggregation weights) of a float64 GSPO case."""
    p = _gspo_pieces(x, mask, ref_kw)
    return p, gspo_row_weights(p["t"]["has"], p["t"]["n"], ref_kw.get("normalizer"), ref_kw.get("aggregation"))


def gspo_loss_scales(inputs, spec):
    """(loss scale, d logp sensitivity [B, T]) of the GSPO loss with upstream gradient 1: the
    magnitudes its value and gradient are computed from (the scales judge_gspo holds ours to)."""
    _, ref_kw = gspo_kwargs(inputs, spec)
    x = {k: _np(v) for k, v in inputs.items() if k != "mask"}
    p, w = _gspo_scale_pieces(x, inputs["mask"].cpu().numpy(), ref_kw)
    return float((p["seq"] * w).sum()), np.abs(w)[:, None] * p["d_logp"]


def run_gspo(inputs, spec, grad_loss=1.3, grad_rows_seed=None, backend="triton"):
    """gspo_loss and the float64 reference, values and gradients: (ours, ref, (x, mask, ref_kw, g_rows))."""
    ours_kw, ref_kw = gspo_kwargs(inputs, spec)
    logp = inputs["logp"].detach().clone().requires_grad_(True)
    if "entropy" in ours_kw:
        ours_kw["entropy"] = ours_kw["entropy"].detach().clone().requires_grad_(True)
    loss, seq, diag = gspo_loss(logp, inputs["old_logp"], inputs["advantages"], mask=inputs["mask"], backend=backend,
                                **ours_kw)
    total, g_rows = loss * grad_loss, None
    if grad_rows_seed is not None:
        g_rows = torch.randn(seq.shape, generator=torch.Generator().manual_seed(grad_rows_seed))
        total = total + (seq * g_rows.to(seq.device)).sum()
    total.backward()
    ours = {"gspo_loss": loss.detach(), "gspo_sequence_loss": seq.detach(), **diag, "d_logp": logp.grad,
            "d_entropy": ours_kw["entropy"].grad if "entropy" in ours_kw else None}
    x = {k: _np(v) for k, v in inputs.items() if k != "mask"}
    mask = inputs["mask"].cpu().numpy()
    r_loss, r_seq, r_diag = gspo_reference(x["logp"], x["old_logp"], x["advantages"], mask, **ref_kw)
    g64 = None if g_rows is None else g_rows.double().numpy()
    r_dlogp, r_dent = gspo_grad_reference(x["logp"], x["old_logp"], x["advantages"], mask, grad_loss, g64, **ref_kw)
    ref = {"gspo_loss": r_loss, "gspo_sequence_loss": r_seq, **r_diag, "d_logp": r_dlogp, "d_entropy": r_dent}
    return ours, ref, (x, mask, ref_kw, g64)


def judge_gspo(inputs, spec, device, grad_loss=1.3, grad_rows_seed=1, backend="triton"):
    """{output or gradient: worst error / what the contract allows} (<= 1 passes)."""
    arch = arch_of(torch.device(device))
    ours, ref, (x, mask, ref_kw, g_rows) = run_gspo(inputs, spec, grad_loss, grad_rows_seed, backend)
    p, w = _gspo_scale_pieces(x, mask, ref_kw)
    has, active = p["t"]["has"], p["t"]["active"]
    fwd = contracts.judgment(OP, torch.float32, "forward_accuracy", arch)["outputs"]
    r_ext = float(p["ratio"].max(initial=0.0))
    scales = {"gspo_loss": (float((p["seq"] * w).sum()), "gspo_loss"),
              "ppo_kl": (_mean_over(p["k1_old"], active), "ppo_kl"),
              "gspo_sequence_loss": (p["seq"], "gspo_sequence_loss"),
              "clipfrac": (1.0 if has.any() else 0.0, "clipfrac"),
              "approx_kl": (_mean_over(p["k3_old"], active), "approx_kl"),
              "ratio_mean": (float(p["ratio"].sum() / max(has.sum(), 1)), "gspo_ratio"),
              "ratio_min": (r_ext, "gspo_ratio"), "ratio_max": (r_ext, "gspo_ratio")}
    out = {name: contracts.scaled_abs_ratio(np.atleast_1d(_np(ours[name])), np.atleast_1d(ref[name]),
                                            np.atleast_1d(sc), fwd[row]) for name, (sc, row) in scales.items()}
    bound = contracts.judgment(OP, torch.float32, "gradient_accuracy", arch)
    up = np.abs(grad_loss * w) + (0.0 if g_rows is None else np.abs(g_rows))
    out["d_logp"] = contracts.rounding_plus_sensitivity_ratio(_np(ours["d_logp"]), ref["d_logp"],
                                                              up[:, None] * p["d_logp"], bound)
    if ours["d_entropy"] is not None:
        out["d_entropy"] = contracts.rounding_plus_sensitivity_ratio(_np(ours["d_entropy"]), ref["d_entropy"],
                                                                     up[:, None] * p["d_entropy"], bound)
    return out


def _norm_for(aggregation):
    return 37.0 if aggregation == "seq-mean-token-sum-norm" else None


FEATURES = {
    "entropy": {"entropy_coef": 0.01},
    "tis_truncate": {"tis_mode": "truncate"},
    "tis_mask": {"tis_mode": "mask"},
    "dual_clip": {"dual_clip_c": DUAL_C},
    "kl_k1": {"kl_coef": 0.05, "kl_estimator": "k1"},
    "kl_k2": {"kl_coef": 0.05, "kl_estimator": "k2"},
    "no_upper_clip": {"eps_high": float("inf")},
    "everything": {"entropy_coef": 0.01, "tis_mode": "truncate", "dual_clip_c": DUAL_C, "kl_coef": 0.1,
                   "eps_high": EPS_HIGH},
    # the framework conventions (rlk_triton.compat): KL clamped, TIS on the policy term, given weights,
    # a clamped log-ratio
    "low_var_kl": {"kl_coef": 0.1, "kl_estimator": "low_var_kl"},
    "tis_pg": {"tis_mode": "truncate", "tis_scope": "pg", "kl_coef": 0.1, "entropy_coef": 0.01},
    "is_weights": {"is_weights": True, "kl_coef": 0.1, "entropy_coef": 0.01},
    "is_weights_pg": {"is_weights": True, "tis_scope": "pg", "kl_coef": 0.1, "entropy_coef": 0.01,
                      "dual_clip_c": DUAL_C},
    "log_ratio_clamp": {"log_ratio_clamp": CLAMP, "dual_clip_c": DUAL_C, "kl_coef": 0.05},
}


# ---- advantages: judged against reference/advantages.py with its scales ----

def _adv_bound(output, device):
    return contracts.judgment("advantages", torch.float32, "forward_accuracy",
                              arch_of(torch.device(device)))["outputs"][output]


def gae_inputs(B, T, seed, device, p_active=0.8, scale=1.0):
    """(rewards, values, mask, bootstrap_values): N(0, scale^2) values, ~p_active of the tokens active."""
    g = torch.Generator().manual_seed(seed)
    r = (torch.randn(B, T, generator=g) * scale).to(device)
    v = (torch.randn(B, T, generator=g) * scale).to(device)
    m = (torch.rand(B, T, generator=g) < p_active).to(device)
    boot = (torch.randn(B, generator=g) * scale).to(device)
    return r, v, m, boot


def group_inputs(B, groups, seed, device):
    """(scores, group_ids in [0, groups), valid with ~15% invalid rows)."""
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(B, generator=g) * 2 + 1).to(device)
    gid = torch.randint(0, groups, (B,), generator=g).to(device)
    ok = (torch.rand(B, generator=g) > 0.15).to(device)
    return s, gid, ok


def judge_gae(r, v, m, boot, gamma, lam, device, backend="triton"):
    """{gae_advantages, gae_returns: worst error / contract bound}; masked tokens must be exact 0."""
    from ..advantages import gae
    from ..reference.advantages import gae_reference

    adv, ret = gae(r, v, m, gamma=gamma, lam=lam, bootstrap_values=boot, backend=backend)
    m64 = np.ones(r.shape, bool) if m is None else m.cpu().numpy()
    b64 = None if boot is None else boot.cpu().numpy()
    ra, rr, sc = gae_reference(r.cpu().numpy(), v.cpu().numpy(), m64, b64, gamma, lam)
    return {"gae_advantages": contracts.scaled_abs_ratio(adv.cpu(), ra, sc, _adv_bound("gae_advantages", device)),
            "gae_returns": contracts.scaled_abs_ratio(ret.cpu(), rr, sc, _adv_bound("gae_returns", device))}


def judge_group_advantages(s, gid, ok, num_groups, mode, device, backend="triton", eps=1e-6):
    """{group_advantages: worst error / contract bound}; invalid rows must be exact 0."""
    from ..advantages import group_advantages
    from ..reference.advantages import group_advantages_reference

    out = group_advantages(s, gid, num_groups=num_groups, mode=mode, valid=ok, eps=eps, backend=backend)
    ref, sc = group_advantages_reference(s.cpu().numpy(), gid.cpu().numpy(),
                                         None if ok is None else ok.cpu().numpy(), mode, eps)
    return {"group_advantages": contracts.scaled_abs_ratio(out.cpu(), ref, sc, _adv_bound("group_advantages", device))}


def judge_reinforce_pp(s, gid, mask, ok, num_groups, device, backend="triton"):
    from ..advantages import reinforce_pp_baseline
    from ..reference.advantages import reinforce_pp_baseline_reference

    out = reinforce_pp_baseline(s, gid, mask, num_groups=num_groups, valid=ok, backend=backend)
    ref, sc = reinforce_pp_baseline_reference(s.cpu().numpy(), gid.cpu().numpy(), mask.cpu().numpy(),
                                              ok.cpu().numpy())
    return {"group_advantages": contracts.scaled_abs_ratio(out.cpu(), ref, sc, _adv_bound("group_advantages", device))}


# ---- row ops for the invariance harness (rlk_triton.testing.invariance) ----

def _seed(gen):
    return int(torch.randint(0, 2**31 - 1, (1,), generator=gen))


def policy_row_op(T, device, aggregation="token-mean", adv_per_seq=False, backend="triton") -> RowOp:
    """policy_loss's per-token loss and its d logp / d entropy, with every term on and a normalizer."""
    spec = {"loss_type": "ppo", "aggregation": aggregation, "normalizer": NORMALIZER, **FEATURES["everything"]}

    def make_rows(n, gen):
        x = make_inputs(n, T, seed=_seed(gen), adv_per_seq=adv_per_seq, device=device)
        return (x["logp"], x["old_logp"], x["advantages"], x["mask"], x["ref_logp"], x["entropy"], x["rollout_logp"])

    def forward(logp, old, adv, mask, ref, ent, roll):
        kw, _ = policy_kwargs({"ref_logp": ref, "entropy": ent, "rollout_logp": roll}, spec)
        kw["entropy"] = ent
        return (policy_loss(logp, old, adv, mask=mask, backend=backend, **kw)[1],)

    return RowOp(f"policy_loss.{backend}[T={T},{aggregation}{',adv[B]' if adv_per_seq else ''}]", forward, make_rows,
                 grad_inputs=(0, 5))


def ratio_kl_row_op(T, device, clamp=CLAMP, backend="triton") -> RowOp:
    def make_rows(n, gen):
        x = make_inputs(n, T, seed=_seed(gen), device=device)
        return x["logp"], x["old_logp"], x["ref_logp"], x["mask"]

    def forward(logp, old, ref, mask):
        return ratio_kl(logp, old, ref, mask=mask, log_ratio_clamp=clamp, backend=backend)

    return RowOp(f"ratio_kl.{backend}[T={T}]", forward, make_rows, grad_inputs=(0,))


def gae_row_op(T, device, gamma=0.99, lam=0.95, backend="triton") -> RowOp:
    """gae per row: (advantages, returns) of rows of (rewards, values, mask, bootstrap_values)."""
    from ..advantages import gae

    def make_rows(n, gen):
        return gae_inputs(n, T, _seed(gen), device)

    def forward(r, v, m, boot):
        return gae(r, v, m, gamma=gamma, lam=lam, bootstrap_values=boot, backend=backend)

    return RowOp(f"gae.{backend}[T={T}]", forward, make_rows)


def group_row_op(members, device, mode="mean_std", backend="triton") -> RowOp:
    """group_advantages with one GROUP per harness row: inputs scores [n, members] and valid [n, members].

    The n groups are flattened member-major (g0 m0, g1 m0, ..., g0 m1, ...), so groups interleave and
    a group's rows move with n and with its place: the harness then checks bitwise that a group's
    advantages depend on its own members only (batch size, position, neighbours, empty groups).
    """
    from ..advantages import group_advantages

    def make_rows(n, gen):
        s = (torch.randn(n, members, generator=gen) * 2 + 1).to(device)
        ok = (torch.rand(n, members, generator=gen) > 0.15).to(device)
        return s, ok

    def forward(s, ok):
        n = s.shape[0]
        gid = torch.arange(n, device=s.device).repeat(members)
        out = group_advantages(s.t().reshape(-1), gid, num_groups=n, mode=mode, valid=ok.t().reshape(-1),
                               backend=backend)
        return (out.view(members, n).t(),)

    return RowOp(f"group_advantages.{backend}[members={members},{mode}]", forward, make_rows)


def gspo_row_op(T, device, backend="triton") -> RowOp:
    """gspo_loss's per-sequence terms and their d logp / d entropy, every term on and a normalizer (with
    it, a sequence's term and gradients are its own)."""
    spec = {"clip": "ppo", "normalizer": NORMALIZER, **GSPO_FEATURES["everything"]}

    def make_rows(n, gen):
        x = gspo_inputs(n, T, _seed(gen), device, spread=1e-2)
        return (x["logp"], x["old_logp"], x["advantages"], x["mask"], x["ref_logp"], x["entropy"], x["rollout_logp"])

    def forward(logp, old, adv, mask, ref, ent, roll):
        kw, _ = gspo_kwargs({"ref_logp": ref, "entropy": ent, "rollout_logp": roll}, spec)
        kw["entropy"] = ent
        return (gspo_loss(logp, old, adv, mask=mask, backend=backend, **kw)[1],)

    return RowOp(f"gspo_loss.{backend}[T={T}]", forward, make_rows, grad_inputs=(0, 5))


REINFORCE_PP_TOKEN_STATS = (0.25, 1.5)  # token_mean, token_std given: the whitening is then per token


def reinforce_pp_row_op(members, T, device, backend="triton") -> RowOp:
    """reinforce_pp_baseline with one GROUP per harness row (scores [n, members], valid [n, members],
    mask [n, members, T]), flattened member-major as group_row_op, with token_mean / token_std given:
    the batch-level whitening statistics are the caller's then, and a group's token advantages depend
    on its own members only."""
    from ..advantages import reinforce_pp_baseline

    def make_rows(n, gen):
        s = (torch.randn(n, members, generator=gen) * 2 + 1).to(device)
        ok = (torch.rand(n, members, generator=gen) > 0.15).to(device)
        m = (torch.rand(n, members, T, generator=gen) < 0.8).to(device)
        return s, ok, m

    def forward(s, ok, m):
        n = s.shape[0]
        gid = torch.arange(n, device=s.device).repeat(members)
        mean, std = REINFORCE_PP_TOKEN_STATS
        out = reinforce_pp_baseline(s.t().reshape(-1), gid, m.transpose(0, 1).reshape(members * n, T), num_groups=n,
                                    valid=ok.t().reshape(-1), token_mean=mean, token_std=std, backend=backend)
        return (out.view(members, n, T).transpose(0, 1),)

    return RowOp(f"reinforce_pp_baseline.{backend}[members={members},T={T}]", forward, make_rows)


RC_SPECS = {  # rollout_correction settings of the parity cases, row ops and probes
    "token_truncate": {"is_level": "token", "is_high": 2.0, "is_low": 0.5},
    "icepop": {"is_level": "token", "is_mode": "mask", "is_low": 0.5, "is_high": 2.0},
    "sequence": {"is_level": "sequence", "is_high": 1e30, "log_ratio_clamp": 20.0},
    "geometric_rs": {"is_level": "geometric", "is_mode": "mask", "is_low": 0.8, "is_high": 1.25,
                     "rejection": {"token_k1": (0.4, 2.5), "seq_mean_k3": 0.06, "seq_max_k2": 0.5,
                                   "seq_sum_k1": (1e-3, 1e3)}},
}


def rc_inputs(B, T, seed, device, spread=0.3):
    """(old_logp, rollout_logp, mask) of rollout_correction: rollout = old + spread * N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 4
    roll = old + spread * torch.randn(B, T, generator=g)
    mask = torch.rand(B, T, generator=g) < 0.8
    return old.to(device), roll.to(device), mask.to(device)


def judge_rollout_correction(old, roll, mask, spec, device, backend="triton"):
    """{is_weights: worst error / contract bound}, with the keep mask required equal to the float64
    reference's (inputs away from the bounds: the decision is then exact)."""
    from ..losses import rollout_correction
    from ..reference.losses import rollout_correction_reference

    rc = rollout_correction(old, roll, mask, backend=backend, **spec)
    w, keep, _, scale = rollout_correction_reference(_np(old), _np(roll), mask.cpu().numpy(), **spec)
    out = {"keep": 0.0 if np.array_equal(rc.keep.cpu().numpy(), keep) else float("inf")}
    if w is not None:
        bound = contracts.judgment(OP, torch.float32, "forward_accuracy", arch_of(torch.device(device)))["outputs"]
        out["is_weights"] = contracts.scaled_abs_ratio(rc.weights.cpu(), w, scale, bound["is_weights"])
    return out


def judge_masked_whiten(values, mask, device, backend="triton", **kw):
    from ..advantages import masked_whiten
    from ..reference.advantages import masked_whiten_reference

    out = masked_whiten(values, mask, backend=backend, **kw)
    ref, scale = masked_whiten_reference(_np(values), mask.cpu().numpy(), **kw)
    return {"whitened": contracts.scaled_abs_ratio(out.cpu(), ref, scale, _adv_bound("whitened", device))}


def rollout_correction_row_op(T, device, spec="geometric_rs", backend="triton") -> RowOp:
    """rollout_correction's weights and keep mask per sequence."""
    from ..losses import rollout_correction

    def make_rows(n, gen):
        return rc_inputs(n, T, _seed(gen), device)

    def forward(old, roll, mask):
        rc = rollout_correction(old, roll, mask, backend=backend, **RC_SPECS[spec])
        return rc.weights, rc.keep.to(torch.uint8)

    return RowOp(f"rollout_correction.{backend}[T={T},{spec}]", forward, make_rows)


def masked_whiten_row_op(T, device, backend="triton") -> RowOp:
    """masked_whiten with the caller's mean and var (then each row's output is its own)."""
    from ..advantages import masked_whiten

    def make_rows(n, gen):
        return (torch.randn(n, T, generator=gen) * 2 + 1).to(device), (torch.rand(n, T, generator=gen) < 0.8).to(device)

    def forward(v, m):
        return (masked_whiten(v, m, mean=0.5, var=3.0, backend=backend),)

    return RowOp(f"masked_whiten.{backend}[T={T}]", forward, make_rows)


# ---- parity cases (seeded, self-describing) ----

@dataclass(frozen=True)
class RatioKlCase:
    B: int
    T: int
    estimator: str = "k3"
    clamp: object = None
    with_ref: bool = True
    use_mask: bool = True
    seed: int = 0
    dtype = torch.float32  # the contract row that judges it

    def label(self) -> str:
        return (f"[{self.B}x{self.T}] {self.estimator} clamp={self.clamp} ref={self.with_ref} "
                f"mask={self.use_mask}")


@dataclass(frozen=True)
class PolicyCase:
    B: int
    T: int
    loss_type: str = "ppo"
    aggregation: str = "token-mean"
    feature: str = ""  # a key of FEATURES, or "" for the plain loss
    adv_per_seq: bool = False
    seed: int = 0
    dtype = torch.float32

    def spec(self) -> dict:
        spec = {"loss_type": self.loss_type, "aggregation": self.aggregation,
                "normalizer": _norm_for(self.aggregation), **FEATURES.get(self.feature, {})}
        if self.loss_type == "cispo":
            spec["dual_clip_c"] = None
        return spec

    def label(self) -> str:
        return f"[{self.B}x{self.T}] {self.loss_type} {self.aggregation} {self.feature or 'plain'}" + (
            " adv[B]" if self.adv_per_seq else "")


@dataclass(frozen=True)
class GaeCase:
    B: int
    T: int
    gamma: float = 0.99
    lam: float = 0.95
    seed: int = 0
    dtype = torch.float32

    def label(self) -> str:
        return f"[{self.B}x{self.T}] gamma={self.gamma} lam={self.lam}"


@dataclass(frozen=True)
class GroupCase:
    B: int
    groups: int
    mode: str = "mean_std"
    seed: int = 0
    dtype = torch.float32

    def label(self) -> str:
        return f"B={self.B} groups={self.groups} {self.mode}"


@dataclass(frozen=True)
class GspoCase:
    B: int
    T: int
    feature: str = "plain"  # a key of GSPO_FEATURES
    clip: str = "paper"  # a key of GSPO_CLIPS
    spread: float = 1e-2
    normalizer: object = None
    seed: int = 0
    dtype = torch.float32

    def spec(self) -> dict:
        return {"clip": self.clip, "normalizer": self.normalizer, **GSPO_FEATURES[self.feature]}

    def label(self) -> str:
        return f"[{self.B}x{self.T}] gspo {self.feature} clip={self.clip} spread={self.spread} norm={self.normalizer}"


@dataclass(frozen=True)
class ReinforcePPCase:
    B: int
    groups: int
    T: int
    seed: int = 0
    dtype = torch.float32

    def label(self) -> str:
        return f"B={self.B} groups={self.groups} T={self.T} reinforce++"


@dataclass(frozen=True)
class RolloutCorrectionCase:
    B: int
    T: int
    spec: str = "token_truncate"  # a key of RC_SPECS
    spread: float = 0.3
    seed: int = 0
    dtype = torch.float32

    def label(self) -> str:
        return f"[{self.B}x{self.T}] rollout_correction {self.spec} spread={self.spread}"


@dataclass(frozen=True)
class WhitenCase:
    B: int
    T: int
    eps_placement: str = "var"
    seed: int = 0
    dtype = torch.float32

    def label(self) -> str:
        return f"[{self.B}x{self.T}] masked_whiten eps on {self.eps_placement}"


def judge_case(case, device, backend="triton") -> dict:
    """Judge one parity case of any RL operator: {name: worst error / contract bound} (<= 1 passes)."""
    if isinstance(case, RatioKlCase):
        x = make_inputs(case.B, case.T, seed=case.seed, empty_rows=(min(1, case.B - 1),), device=device)
        return judge_ratio_kl(x, device, with_ref=case.with_ref, use_mask=case.use_mask, estimator=case.estimator,
                              clamp=case.clamp, backend=backend)
    if isinstance(case, PolicyCase):
        x = make_inputs(case.B, case.T, seed=case.seed, adv_per_seq=case.adv_per_seq,
                        empty_rows=(min(1, case.B - 1),), device=device)
        return judge_policy(x, case.spec(), device, backend=backend)
    if isinstance(case, GaeCase):
        r, v, m, boot = gae_inputs(case.B, case.T, case.seed, device)
        if case.B > 1:
            m[1] = False  # a fully masked row
        if case.T > 3:
            m[0, -3:] = False  # right padding
        return judge_gae(r, v, m, boot, case.gamma, case.lam, device, backend)
    if isinstance(case, GroupCase):
        s, gid, ok = group_inputs(case.B, case.groups, case.seed, device)
        return judge_group_advantages(s, gid, ok, case.groups + 2, case.mode, device, backend)  # 2 empty groups
    if isinstance(case, GspoCase):
        x = gspo_inputs(case.B, case.T, case.seed, device, case.spread, empty_rows=(min(1, case.B - 1),))
        return judge_gspo(x, case.spec(), device, backend=backend)
    if isinstance(case, ReinforcePPCase):
        s, gid, ok = group_inputs(case.B, case.groups, case.seed, device)
        m = (torch.rand(case.B, case.T, generator=torch.Generator().manual_seed(case.seed + 1)) < 0.8).to(device)
        return judge_reinforce_pp(s, gid, m, ok, case.groups + 2, device, backend)  # 2 empty groups
    if isinstance(case, RolloutCorrectionCase):
        old, roll, mask = rc_inputs(case.B, case.T, case.seed, device, case.spread)
        return judge_rollout_correction(old, roll, mask, RC_SPECS[case.spec], device, backend)
    if isinstance(case, WhitenCase):
        g = torch.Generator().manual_seed(case.seed)
        v = (torch.randn(case.B, case.T, generator=g) * 3 + 1).to(device)
        m = (torch.rand(case.B, case.T, generator=g) < 0.8).to(device)
        return judge_masked_whiten(v, m, device, backend, eps_placement=case.eps_placement)
    raise TypeError(f"not an RL parity case: {case!r}")


# ---- the registry entries ----

def _probe_with(case):
    def probe(backend, device):
        ratios = judge_case(case, device, backend)
        if not max(ratios.values()) <= 1.0:
            raise AssertionError(f"probe result outside the contract: error / bound {ratios}")
    return probe


def rl_harnesses() -> list:
    """How `rlk-triton check` checks ratio_kl, policy_loss, gspo_loss, gae, group_advantages and
    reinforce_pp_baseline (rlk_triton/operators.py)."""
    from .harness import Harness

    both = ("triton", "torch_reference")

    def ratio_kl_cases(on_gpu):
        B, T = (64, 8192) if on_gpu else (4, 45)
        return [RatioKlCase(B, T, "k3", CLAMP, seed=1), RatioKlCase(B, T, "k2", None, use_mask=False, seed=2),
                RatioKlCase(3, 300, "k1", None, with_ref=False, seed=3)]

    def policy_cases(on_gpu):
        B, T = (64, 8192) if on_gpu else (4, 33)
        return [PolicyCase(B, T, "ppo", "token-mean", seed=11),
                PolicyCase(B, T, "grpo", "seq-mean-token-mean", "everything", seed=12),
                PolicyCase(B, T, "dr_grpo", "seq-mean-token-sum-norm", "tis_mask", adv_per_seq=True, seed=13),
                PolicyCase(B, T, "cispo", "seq-mean-token-sum", "entropy", seed=14)]

    def gae_cases(on_gpu):
        big = [GaeCase(64, 8192, seed=23)] if on_gpu else []
        return [GaeCase(4, 31, seed=21), GaeCase(3, 700, 1.0, 1.0, seed=22)] + big

    def group_cases(on_gpu):
        big = [GroupCase(4096, 512, m, seed=34) for m in ("mean", "mean_std", "rloo")] if on_gpu else []
        return [GroupCase(64, 9, "mean", 31), GroupCase(64, 9, "mean_std", 32), GroupCase(64, 9, "rloo", 33),
                GroupCase(1, 1, "mean_std", 35)] + big

    def gspo_cases(on_gpu):
        B, T = (64, 8192) if on_gpu else (4, 33)
        return [GspoCase(B, T, "plain", "paper", 1e-3, seed=41),
                GspoCase(B, T, "everything", "ppo", 1e-2, NORMALIZER, seed=42),
                GspoCase(3, 300, "tis_mask", "ppo", 1e-1, seed=43),
                GspoCase(B, T, "kl_k2", "paper", 1e-4, seed=44)]

    def reinforce_pp_cases(on_gpu):
        big = [ReinforcePPCase(4096, 512, 1024, seed=54)] if on_gpu else []
        return [ReinforcePPCase(64, 9, 7, seed=51), ReinforcePPCase(5, 2, 40, seed=52),
                ReinforcePPCase(1, 1, 3, seed=53)] + big

    def rc_cases(on_gpu):
        B, T = (64, 8192) if on_gpu else (4, 45)
        return [RolloutCorrectionCase(B, T, "token_truncate", seed=61), RolloutCorrectionCase(B, T, "icepop", seed=62),
                RolloutCorrectionCase(B, T, "sequence", 0.01, seed=63),
                RolloutCorrectionCase(3, 300, "geometric_rs", seed=64)]

    def whiten_cases(on_gpu):
        B, T = (64, 8192) if on_gpu else (4, 45)
        return [WhitenCase(B, T, "var", seed=71), WhitenCase(3, 300, "std", seed=72)]

    return [
        Harness("rollout_correction", rc_cases, judge_case,
                lambda device, on_gpu: [rollout_correction_row_op(8192 if on_gpu else 30, device, backend=b)
                                        for b in both],
                _probe_with(RolloutCorrectionCase(2, 9, "token_truncate", seed=65))),
        Harness("masked_whiten", whiten_cases, judge_case,
                lambda device, on_gpu: [masked_whiten_row_op(8192 if on_gpu else 30, device, backend=b) for b in both],
                _probe_with(WhitenCase(2, 9, seed=73))),
        Harness("ratio_kl", ratio_kl_cases, judge_case,
                lambda device, on_gpu: [ratio_kl_row_op(8192 if on_gpu else 30, device, backend=b) for b in both],
                _probe_with(RatioKlCase(2, 9, "k3", CLAMP, seed=5))),
        Harness("policy_loss", policy_cases, judge_case,
                lambda device, on_gpu: [policy_row_op(8192 if on_gpu else 30, device, backend=b) for b in both],
                _probe_with(PolicyCase(2, 9, "grpo", "seq-mean-token-mean", "everything", seed=6))),
        Harness("gae", gae_cases, judge_case,
                lambda device, on_gpu: [gae_row_op(8192 if on_gpu else 300, device, backend=b) for b in both],
                _probe_with(GaeCase(1, 9, seed=7))),
        Harness("group_advantages", group_cases, judge_case,
                lambda device, on_gpu: [group_row_op(8 if on_gpu else 4, device, m, backend=b)
                                        for b in both for m in ("mean_std", "rloo")],
                _probe_with(GroupCase(12, 3, "mean_std", seed=8))),
        Harness("gspo_loss", gspo_cases, judge_case,
                lambda device, on_gpu: [gspo_row_op(8192 if on_gpu else 30, device, backend=b) for b in both],
                _probe_with(GspoCase(2, 9, "everything", "ppo", 1e-2, seed=9))),
        Harness("reinforce_pp_baseline", reinforce_pp_cases, judge_case,
                lambda device, on_gpu: [reinforce_pp_row_op(8 if on_gpu else 4, 64 if on_gpu else 5, device,
                                                             backend=b) for b in both],
                _probe_with(ReinforcePPCase(12, 3, 4, seed=10))),
    ]
