"""float64 references of the RL losses (rlk_triton.losses) and their gradients.

Per token, with lr = logp - old_logp, r = exp(lr), A the advantage, cr = clip(r, 1 - eps_low, 1 + eps_high):
  ratio_kl        log_ratio = clip(lr, -c, c) (if clamped), ratio = exp(log_ratio), kl(logp, ref)
  kl estimators   d = logp - ref:  k1 = d,  k2 = d^2 / 2,  k3 = exp(-d) + d - 1
  ppo surrogate   pg = max(-A r, -A cr);  dual clip (A < 0): pg = min(pg, -A c)
  cispo           pg = -sg(cr) A logp
  per-token loss  l = tis * (pg + kl_coef * kl - entropy_coef * entropy)
                  tis = min(exp(old - rollout), cap) ("truncate"), else 1; "mask" drops tokens with
                  exp(old - rollout) > cap instead.
Inactive tokens give 0 everywhere and no gradient. The scalar loss is sum_t w_t l_t with the
aggregation's weights w (aggregation_weights), so d loss / d logp_t = w_t d l_t / d logp_t.
GSPO (gspo_terms / gspo_reference / gspo_grad_reference): the sequence ratio s_i = exp(mean log-ratio)
clipped per sequence, the same optional token terms averaged per sequence (see gspo_terms).
Everything is float64 and written the obvious way; tests check the gradients by finite differences.
"""
from __future__ import annotations

import numpy as np

DIAGNOSTICS = ("clipfrac", "approx_kl", "ratio_mean", "ratio_min", "ratio_max", "ppo_kl")


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def _active(mask, shape):
    if mask is None:
        return np.ones(shape, dtype=bool)
    return np.asarray(mask) != 0


def _tis(old, rollout_logp, is_weights, tis_mode, tis_cap, active):
    """(per-token importance weights or None, active): the caller's is_weights; else, with
    rollout_logp, w = exp(old - rollout) truncated at the cap ("truncate") or tokens with w > cap
    dropped from active ("mask", weights None)."""
    if is_weights is not None:
        return _f64(is_weights), active
    if rollout_logp is None:
        return None, active
    w = np.exp(old - _f64(rollout_logp))
    if tis_mode == "truncate":
        return np.minimum(w, tis_cap), active
    return None, active & (w <= tis_cap)


def kl_estimate(logp, ref_logp, estimator="k3"):
    """(kl, d kl / d logp), float64, of the current policy against ref, per token."""
    d = _f64(logp) - _f64(ref_logp)
    if estimator == "k1":
        return d, np.ones_like(d)
    if estimator == "k2":
        return 0.5 * d * d, d
    if estimator == "k3":
        return np.exp(-d) + d - 1.0, 1.0 - np.exp(-d)
    if estimator == "low_var_kl":  # verl's: u = ref - logp clamped to [-20, 20], the estimate to [-10, 10]
        u = -d
        inside = (u >= -20.0) & (u <= 20.0)
        uc = np.clip(u, -20.0, 20.0)
        k3 = np.exp(uc) - uc - 1.0
        grad = np.where(inside & (k3 >= -10.0) & (k3 <= 10.0), 1.0 - np.exp(uc), 0.0)
        return np.clip(k3, -10.0, 10.0), grad
    raise ValueError(f"unknown kl estimator {estimator!r}")


# ---- ratio_kl ----

def ratio_kl_reference(logp, old_logp, ref_logp=None, mask=None, kl_estimator="k3", log_ratio_clamp=None):
    """(log_ratio, ratio, kl or None), float64; 0 on inactive tokens."""
    logp, old = _f64(logp), _f64(old_logp)
    active = _active(mask, logp.shape)
    lr = logp - old
    if log_ratio_clamp is not None:
        lr = np.clip(lr, -log_ratio_clamp, log_ratio_clamp)
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = np.exp(lr)
        kl = None if ref_logp is None else np.where(active, kl_estimate(logp, ref_logp, kl_estimator)[0], 0.0)
    return np.where(active, lr, 0.0), np.where(active, ratio, 0.0), kl


def ratio_kl_grad_reference(logp, old_logp, ref_logp, mask, grad_log_ratio, grad_ratio, grad_kl=None,
                            kl_estimator="k3", log_ratio_clamp=None):
    """d/d logp of sum(g_lr * log_ratio + g_r * ratio + g_kl * kl), float64."""
    logp, old = _f64(logp), _f64(old_logp)
    active = _active(mask, logp.shape)
    lr = logp - old
    dlr = np.ones_like(lr)
    if log_ratio_clamp is not None:  # torch.clamp's convention: the bounds themselves pass the gradient
        dlr = ((lr >= -log_ratio_clamp) & (lr <= log_ratio_clamp)).astype(np.float64)
        lr = np.clip(lr, -log_ratio_clamp, log_ratio_clamp)
    d = (_f64(grad_log_ratio) + _f64(grad_ratio) * np.exp(lr)) * dlr
    if ref_logp is not None and grad_kl is not None:
        d = d + _f64(grad_kl) * kl_estimate(logp, ref_logp, kl_estimator)[1]
    return np.where(active, d, 0.0)


# ---- policy_loss ----

def policy_loss_terms(logp, old_logp, advantages, mask, *, loss_type="ppo", eps_low=0.2, eps_high=None,
                      dual_clip_c=None, ref_logp=None, kl_coef=0.0, kl_estimator="k3", entropy=None,
                      entropy_coef=0.0, rollout_logp=None, tis_cap=None, tis_mode="truncate", tis_scope="loss",
                      is_weights=None, log_ratio_clamp=None):
    """Per-token quantities (dict of float64 / bool [B, T] arrays): loss, dloss_dlogp, dloss_dentropy,
    active (after TIS masking), clipped, ratio, log_ratio, approx_kl (k3 of old vs current), ppo_kl
    (k1 of old vs current, old - logp). tis_scope "pg" weighs the policy term only; is_weights are
    given weights (as "truncate" weighs); log_ratio_clamp clamps logp - old (no gradient beyond)."""
    logp, old = _f64(logp), _f64(old_logp)
    adv = _f64(advantages)
    if adv.ndim == 1:
        adv = np.broadcast_to(adv[:, None], logp.shape)
    active = _active(mask, logp.shape)
    eps_high = eps_low if eps_high is None else eps_high
    lr = logp - old
    dlr = np.ones_like(lr)
    if log_ratio_clamp is not None:
        dlr = ((lr >= -log_ratio_clamp) & (lr <= log_ratio_clamp)).astype(np.float64)
        lr = np.clip(lr, -log_ratio_clamp, log_ratio_clamp)
    r = np.exp(lr)
    cr = np.clip(r, 1.0 - eps_low, 1.0 + eps_high)
    if loss_type == "cispo":
        pg = -cr * adv * logp
        dpg = -cr * adv
        clipped = cr != r
    else:
        unclipped, clipped_term = -adv * r, -adv * cr
        clipped = clipped_term > unclipped
        pg = np.maximum(unclipped, clipped_term)
        dpg = np.where(clipped, 0.0, -adv * r * dlr)
        if dual_clip_c is not None:
            dual = (adv < 0) & (-adv * dual_clip_c < pg)
            pg = np.where(dual, -adv * dual_clip_c, pg)
            dpg = np.where(dual, 0.0, dpg)
    tw, active = _tis(old, rollout_logp, is_weights, tis_mode, tis_cap, active)
    if tw is not None and tis_scope == "pg":
        pg, dpg = pg * tw, dpg * tw
    loss, dloss = pg, dpg
    if kl_coef != 0.0:
        kl, dkl = kl_estimate(logp, ref_logp, kl_estimator)
        loss, dloss = loss + kl_coef * kl, dloss + kl_coef * dkl
    dent = np.zeros_like(loss)
    if entropy_coef != 0.0:
        loss = loss - entropy_coef * _f64(entropy)
        dent = dent - entropy_coef
    if tw is not None and tis_scope != "pg":
        loss, dloss, dent = loss * tw, dloss * tw, dent * tw
    k3_old = np.exp(-lr) + lr - 1.0
    z = lambda x: np.where(active, x, 0.0)  # noqa: E731
    return {"loss": z(loss), "dloss_dlogp": z(dloss), "dloss_dentropy": z(dent), "active": active,
            "clipped": clipped & active, "ratio": r, "log_ratio": lr, "approx_kl": z(k3_old), "ppo_kl": z(-lr)}


def aggregation_weights(active, aggregation, normalizer=None):
    """w [B, T] float64 with loss = sum(w * per_token_loss): the aggregation's d loss / d l_t.

    A zero denominator (no active token, no active sequence, or normalizer 0) gives weights 0.
    """
    active = np.asarray(active, bool)
    n_row = active.sum(axis=1).astype(np.float64)
    n_seq = float((n_row > 0).sum())
    if aggregation == "token-mean":
        den = float(active.sum()) if normalizer is None else float(normalizer)
        per_row = np.full(n_row.shape, 1.0 / den if den else 0.0)
    elif aggregation in ("seq-mean-token-sum", "seq-mean-token-mean"):
        den = n_seq if normalizer is None else float(normalizer)
        per_row = np.full(n_row.shape, 1.0 / den if den else 0.0)
        if aggregation == "seq-mean-token-mean":
            per_row = np.divide(per_row, n_row, out=np.zeros_like(per_row), where=n_row > 0)
    elif aggregation == "seq-mean-token-sum-norm":
        den = float(normalizer)
        per_row = np.full(n_row.shape, 1.0 / den if den else 0.0)
    else:
        raise ValueError(f"unknown aggregation {aggregation!r}")
    return np.where(active, per_row[:, None], 0.0)


def aggregate(per_token_loss, active, aggregation, normalizer=None):
    """The scalar loss, written from the definitions (not from the weights)."""
    loss = np.where(active, _f64(per_token_loss), 0.0)
    n_row = active.sum(axis=1)
    row_sum = loss.sum(axis=1)
    seqs = n_row > 0
    if aggregation == "token-mean":
        den = active.sum() if normalizer is None else normalizer
        return float(loss.sum() / den) if den else 0.0
    if aggregation == "seq-mean-token-sum":
        den = seqs.sum() if normalizer is None else normalizer
        return float(row_sum[seqs].sum() / den) if den else 0.0
    if aggregation == "seq-mean-token-mean":
        den = seqs.sum() if normalizer is None else normalizer
        return float((row_sum[seqs] / n_row[seqs]).sum() / den) if den else 0.0
    if aggregation == "seq-mean-token-sum-norm":
        return float(loss.sum() / normalizer) if normalizer else 0.0
    raise ValueError(f"unknown aggregation {aggregation!r}")


def policy_loss_reference(logp, old_logp, advantages, mask, *, aggregation="token-mean", normalizer=None,
                          **kwargs):
    """(loss, per_token_loss [B, T], diagnostics {name: float}), float64. kwargs: policy_loss_terms'."""
    t = policy_loss_terms(logp, old_logp, advantages, mask, **kwargs)
    active = t["active"]
    loss = aggregate(t["loss"], active, aggregation, normalizer)
    n = int(active.sum())
    if n == 0:  # no active token: every diagnostic is 0
        diag = dict.fromkeys(DIAGNOSTICS, 0.0)
    else:
        r = t["ratio"][active]
        diag = {"clipfrac": float(t["clipped"].sum() / n), "approx_kl": float(t["approx_kl"].sum() / n),
                "ratio_mean": float(r.mean()), "ratio_min": float(r.min()), "ratio_max": float(r.max()),
                "ppo_kl": float(t["ppo_kl"].sum() / n)}
    return loss, t["loss"], diag


def policy_loss_grad_reference(logp, old_logp, advantages, mask, grad_loss, grad_per_token=None, *,
                               aggregation="token-mean", normalizer=None, **kwargs):
    """(d logp, d entropy) of grad_loss * loss + sum(grad_per_token * per_token_loss), float64."""
    t = policy_loss_terms(logp, old_logp, advantages, mask, **kwargs)
    up = float(grad_loss) * aggregation_weights(t["active"], aggregation, normalizer)
    if grad_per_token is not None:
        up = up + _f64(grad_per_token)
    return np.where(t["active"], up * t["dloss_dlogp"], 0.0), np.where(t["active"], up * t["dloss_dentropy"], 0.0)


# ---- GSPO ----

GSPO_DIAGNOSTICS = ("clipfrac", "approx_kl", "ratio_mean", "ratio_min", "ratio_max", "ppo_kl")


def gspo_terms(logp, old_logp, advantages, mask, *, eps_low=3e-4, eps_high=4e-4, ref_logp=None, kl_coef=0.0,
               kl_estimator="k3", entropy=None, entropy_coef=0.0, rollout_logp=None, tis_cap=None,
               tis_mode="truncate", sg_logp=None, is_weights=None, tis_scope="loss", aggregation=None):
    """GSPO, written as the GSPO paper's token-level surrogate (float64). With s_i = exp(mean over the
    sequence's active tokens of (sg_logp - old_logp)) and s_it = s_i exp(logp_t - sg_logp_t) (sg_logp:
    the stop-gradient point, logp itself by default, so s_it = s_i in value):
        pg_it = max(-A_i s_it, -A_i clip(s_it, 1 - eps_low, 1 + eps_high))
        l_i   = mean over active t of tis_t (pg_it + kl_coef kl_t - entropy_coef entropy_t)
    tis_t = min(exp(old - rollout), cap) ("truncate"; else 1); "mask" drops tokens with
    exp(old - rollout) > cap first, as if masked. Without truncation d l_i / d logp_t is the plain
    GSPO gradient (pg_it's derivative is the same for every token); with it, each token's share is
    weighted by its own tis_t. is_weights: given weights tis_t (as "truncate" weighs); tis_scope "pg":
    tis_t weighs pg_it only. Returns per-sequence and per-token float64 arrays (a dict); aggregation
    is gspo_reference's (unused here)."""
    lp, old = _f64(logp), _f64(old_logp)
    adv = _f64(advantages)
    active = _active(mask, lp.shape)
    tis, active = _tis(old, rollout_logp, is_weights, tis_mode, tis_cap, active)
    tis = np.ones_like(lp) if tis is None else tis
    sg = lp if sg_logp is None else _f64(sg_logp)
    n = active.sum(1).astype(np.float64)
    has = n > 0
    n1 = np.maximum(n, 1.0)
    s = np.exp(np.where(active, sg - old, 0.0).sum(1) / n1)
    s_tok = s[:, None] * np.exp(np.where(active, lp - sg, 0.0))
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    a = adv[:, None]
    unclipped_tok, clipped_tok = -a * s_tok, -a * np.clip(s_tok, lo, hi)
    pg = np.maximum(unclipped_tok, clipped_tok)
    dpg = np.where(unclipped_tok >= clipped_tok, -a * s_tok, 0.0)  # ties take the unclipped gradient
    extra, dextra = np.zeros_like(lp), np.zeros_like(lp)
    if kl_coef != 0.0:
        kl, dkl = kl_estimate(lp, ref_logp, kl_estimator)
        extra, dextra = extra + kl_coef * kl, kl_coef * dkl
    dent = np.zeros_like(lp)
    if entropy_coef != 0.0:
        extra = extra - entropy_coef * _f64(entropy)
        dent = dent - entropy_coef
    z = lambda x: np.where(active, x, 0.0)  # noqa: E731
    tw_rest = np.ones_like(lp) if tis_scope == "pg" else tis
    terms = np.where(has, z(tis * pg + tw_rest * extra).sum(1) / n1, 0.0)
    k3_old = np.exp(old - lp) - (old - lp) - 1.0
    return {"terms": terms, "s": s, "has": has, "n": n, "active": active,
            "clipped": has & (s != np.clip(s, lo, hi)), "approx_kl": z(k3_old), "ppo_kl": z(old - lp),
            "dterm_dlogp": z(tis * dpg + tw_rest * dextra) / n1[:, None],
            "dterm_dentropy": z(tw_rest * dent) / n1[:, None]}


def gspo_row_weights(has, n, normalizer, aggregation="seq-mean-token-mean"):
    """d loss / d l_i [B] float64: f_i / den (f_i = 1 for seq-mean-token-mean, else n_i; den the
    normalizer, else #tokens for token-mean, #sequences with a token otherwise); 0 where den is 0."""
    if normalizer is not None:
        den = float(normalizer)
    elif aggregation == "token-mean":
        den = float(n[has].sum())
    else:
        den = float(has.sum())
    f = np.ones_like(n) if aggregation in (None, "seq-mean-token-mean") else n
    return np.where(has, f / den, 0.0) if den > 0 else np.zeros_like(n)


def gspo_reference(logp, old_logp, advantages, mask, *, normalizer=None, aggregation="seq-mean-token-mean",
                   **kwargs):
    """float64 GSPO: (loss, per-sequence terms l_i [B], diagnostics {name: float}).

    loss = sum over sequences with >= 1 active token of f_i l_i / den (gspo_row_weights). Diagnostics:
    clipfrac, ratio_mean / min / max over those sequences (of s_i), approx_kl / ppo_kl the mean k3 /
    k1 of old vs current over the active tokens, as policy_loss; all 0 when there is none. kwargs:
    gspo_terms'."""
    t = gspo_terms(logp, old_logp, advantages, mask, **kwargs)
    has, s = t["has"], t["s"]
    loss = float((t["terms"] * gspo_row_weights(has, t["n"], normalizer, aggregation)).sum())
    seqs, tokens = int(has.sum()), int(t["active"].sum())
    diag = {"clipfrac": float(t["clipped"].sum() / seqs) if seqs else 0.0,
            "approx_kl": float(t["approx_kl"].sum() / tokens) if tokens else 0.0,
            "ratio_mean": float(s[has].mean()) if seqs else 0.0,
            "ratio_min": float(s[has].min()) if seqs else 0.0,
            "ratio_max": float(s[has].max()) if seqs else 0.0,
            "ppo_kl": float(t["ppo_kl"].sum() / tokens) if tokens else 0.0}
    return loss, t["terms"], diag


def gspo_grad_reference(logp, old_logp, advantages, mask, grad_loss, grad_terms=None, *, normalizer=None,
                        aggregation="seq-mean-token-mean", **kwargs):
    """(d logp, d entropy) [B, T] float64 of grad_loss * loss + sum(grad_terms * l_i)."""
    t = gspo_terms(logp, old_logp, advantages, mask, **kwargs)
    up = float(grad_loss) * gspo_row_weights(t["has"], t["n"], normalizer, aggregation)
    if grad_terms is not None:
        up = up + _f64(grad_terms)
    up = up[:, None]
    return up * t["dterm_dlogp"], up * t["dterm_dentropy"]


# ---- rollout correction ----

RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def rollout_correction_reference(old_logp, rollout_logp, mask, *, is_level=None, is_mode="truncate", is_low=None,
                                 is_high=None, rejection=None, log_ratio_clamp=None):
    """float64 (weights [B, T] or None, keep [B, T] bool, L [B], weight_scale [B, T]).

    lr = old - rollout (lrc clamped to +-log_ratio_clamp); weights: token exp(lrc), sequence exp(sum lr),
    geometric exp(mean lr) (the sum / mean clamped too), then "truncate" clip(w, is_low, is_high) or
    "mask" w inside [is_low, is_high] else 0; 0 on inactive tokens. Rejection ({option: bound}) with
    verl's rollout_rs statistics k1 = -lrc, k2 = lrc^2 / 2, k3 = exp(lrc) - 1 - lrc per token, their sum /
    mean / max per sequence: k1 kept inside [log lo, log hi] (bounds given as ratios), k2 / k3 at or
    below the bound. weight_scale: w (1 + |lrc|) for token weights, w (1 + sum |lr|) for the sequence
    product, w (1 + mean |lr|) for the geometric mean (what fp32 rounding of the exponent grows with)."""
    old, roll = _f64(old_logp), _f64(rollout_logp)
    active = _active(mask, old.shape)
    lr = np.where(active, old - roll, 0.0)
    lrc = lr if log_ratio_clamp is None else np.clip(lr, -log_ratio_clamp, log_ratio_clamp)
    k1, k2 = -lrc, 0.5 * lrc * lrc
    k3 = np.where(active, np.exp(lrc) - 1.0 - lrc, 0.0)
    n = active.sum(1).astype(np.float64)
    n1 = np.maximum(n, 1.0)
    seq = {"seq_sum_k1": k1.sum(1), "seq_sum_k2": k2.sum(1), "seq_sum_k3": k3.sum(1),
           "seq_mean_k1": k1.sum(1) / n1, "seq_mean_k2": k2.sum(1) / n1, "seq_mean_k3": k3.sum(1) / n1,
           "seq_max_k2": np.where(active, k2, 0.0).max(1, initial=0.0),
           "seq_max_k3": np.where(active, k3, 0.0).max(1, initial=0.0)}
    tok = {"token_k1": k1, "token_k2": k2, "token_k3": k3}
    keep = active.copy()
    for name, bound in (rejection or {}).items():
        stat = seq[name][:, None] if name in seq else tok[name]
        ok = ((stat >= np.log(bound[0])) & (stat <= np.log(bound[1]))) if name.endswith("k1") else stat <= bound
        keep &= np.broadcast_to(ok, keep.shape)
    big_l = lr.sum(1) if is_level == "sequence" else lr.sum(1) / n1
    if log_ratio_clamp is not None:
        big_l = np.clip(big_l, -log_ratio_clamp, log_ratio_clamp)
    weights = scale = None
    if is_level is not None:
        if is_level == "token":
            w, mag = np.exp(lrc), np.abs(lrc)
        else:
            w = np.broadcast_to(np.exp(big_l)[:, None], lr.shape)
            mag = np.abs(lr).sum(1) if is_level == "sequence" else np.abs(lr).sum(1) / n1
            mag = np.broadcast_to(mag[:, None], lr.shape)
        raw = w
        if is_mode == "truncate":
            w = np.clip(w, -np.inf if is_low is None else is_low, is_high)
        else:
            ok = w <= is_high
            if is_low is not None:
                ok &= w >= is_low
            w = np.where(ok, w, 0.0)
        weights = np.where(active, w, 0.0)
        scale = np.where(active & (w == raw), raw * (1.0 + mag), 0.0)  # a bound or 0 is exact
    return weights, keep, np.where(n > 0, big_l, 0.0), scale
