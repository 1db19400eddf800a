"""The contract-preserving torch reference backends of the RL losses and advantages: runs anywhere, slow.

backend="torch_reference" of rlk_triton.losses (ratio_kl, policy_loss, gspo_loss) and
rlk_triton.advantages (gae, group_advantages, reinforce_pp_baseline, masked_whiten). The callers validate first
(one place, shared with the Triton path) and pass the same normalized tensors as to the kernels.

Numerics: every input is upcast to float64 on its device, the math is written as in reference/, and
each output is rounded ONCE to float32 at the end; gradients come from autograd through the float64
ops and are rounded once too (the backward of the upcast). So each output is within half an fp32
ulp (plus float64 noise) of the float64 reference: inside every row of contracts/rl_losses.yaml and
contracts/advantages.yaml.

Batch invariance, by construction:
- per-token math is elementwise, and inactive tokens are replaced by 0 before any arithmetic, so
  whatever padding holds (-inf, NaN) never reaches a value or a gradient;
- every sum over a row (a sequence's tokens, a group's members) goes through `row_sums`: rows in
  chunks of exactly CHUNK_ROWS (the last one zero-padded), tokens in tiles of TILE (zero-padded),
  each tile reduced by one sum of a shape that depends on T only, the tiles folded left to right by
  elementwise adds. A row's sum therefore never depends on B, on its neighbours, or on trailing
  padding (extra tiles add exact zeros);
- batch-level sums (the loss, diagnostics) fold CHUNK_ROWS-row chunks in row order (`batch_sum`):
  appending empty rows adds exact zeros;
- GAE is a reverse loop over time, vectorized over rows: each step is elementwise on [B] vectors;
- group statistics put each group's members, in member order, on one row of a [groups, members]
  matrix and use `row_sums`: a group's values depend on its members and their order only.
No scatter-adds of floating point, no atomics: deterministic on CUDA too.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_ROWS = 16  # as rlk_triton/ops/selected_logp_torch.py
TILE = 256
F64 = torch.float64


# ---- fixed-shape reductions ----

def row_sums(x: torch.Tensor) -> torch.Tensor:
    """[R, C] float64 -> [R]: each row summed in a fixed order (see the module docstring)."""
    R, C = x.shape
    if R == 0 or C == 0:
        return x.sum(-1)  # empty or zeros, still connected to the graph
    n_tiles = -(-C // TILE)
    out = []
    for start in range(0, R, CHUNK_ROWS):
        k = min(CHUNK_ROWS, R - start)
        part = F.pad(x[start:start + k], (0, n_tiles * TILE - C, 0, CHUNK_ROWS - k))
        tiles = part.reshape(CHUNK_ROWS, n_tiles, TILE).sum(-1)
        acc = tiles[:, 0]
        for j in range(1, n_tiles):
            acc = acc + tiles[:, j]
        out.append(acc[:k])
    return torch.cat(out)


def batch_sum(v: torch.Tensor) -> torch.Tensor:
    """[R] float64 -> []: CHUNK_ROWS-row chunks, each one fixed-shape sum, folded in row order."""
    acc = v[:0].sum()
    for start in range(0, v.shape[0], CHUNK_ROWS):
        k = min(CHUNK_ROWS, v.shape[0] - start)
        acc = acc + F.pad(v[start:start + k], (0, CHUNK_ROWS - k)).sum()
    return acc


def _safe(x, active):
    """x in float64 with inactive entries replaced by 0 (no -inf / NaN reaches the arithmetic)."""
    return torch.where(active, x.to(F64), 0.0)


def _const(x, active):
    """_safe of an input that is a constant of the loss: no gradient, as on the Triton path."""
    return _safe(x.detach(), active)


def _div0(num, den):
    """num / den, and 0 where den == 0."""
    ok = den != 0
    return torch.where(ok, num / torch.where(ok, den, 1.0), 0.0)


def _kl(logp, ref, estimator):
    """kl of the current policy against ref (float64), as the kernel forms it."""
    if estimator == "k1":
        return logp - ref
    if estimator == "k2":
        return 0.5 * (logp - ref) ** 2
    u = ref - logp
    if estimator == "low_var_kl":  # u and the estimate clamped (torch.clamp: no gradient beyond)
        u = torch.clamp(u, -20.0, 20.0)
        return torch.clamp((torch.exp(u) - 1.0) - u, -10.0, 10.0)
    return (torch.exp(u) - 1.0) - u


# ---- losses ----

def ratio_kl(logp, old_logp, ref_logp, mask_u8, kl_estimator, log_ratio_clamp):
    """(log_ratio, ratio, kl or None) fp32 [B, T]; same arguments as ops.rl_losses.ratio_kl_fwd."""
    active = torch.ones_like(logp, dtype=torch.bool) if mask_u8 is None else mask_u8 != 0
    lp = _safe(logp, active)
    lr = lp - _const(old_logp, active)
    if log_ratio_clamp is not None:
        lr = torch.clamp(lr, -log_ratio_clamp, log_ratio_clamp)  # gradient passes at the bounds
    out = [lr, torch.exp(lr)]
    out.append(None if ref_logp is None else _kl(lp, _const(ref_logp, active), kl_estimator))
    return tuple(None if x is None else torch.where(active, x, 0.0).to(torch.float32) for x in out)


def policy_loss(logp, old_logp, advantages, mask_u8, ref_logp, entropy, rollout_logp, normalizer_tensor,
                normalizer, loss_type, aggregation, clip_low, clip_high, dual_clip_c, kl_coef, kl_estimator,
                entropy_coef, tis_mode, tis_cap, tis_scope="loss", log_ratio_clamp=None):
    """(loss [], per_token_loss [B, T], diagnostics [6]) fp32; same arguments as ops.rl_losses.policy_loss_fwd
    (ref_logp / entropy / rollout_logp are None when their term is off; rollout_logp holds the weights
    in tis_mode "weights")."""
    active = mask_u8 != 0
    lp = _safe(logp, active)
    old = _const(old_logp, active)
    adv = _const(advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages, active)
    log_ratio = lp - old
    if log_ratio_clamp is not None:
        log_ratio = torch.clamp(log_ratio, -log_ratio_clamp, log_ratio_clamp)  # gradient passes at the bounds
    ratio = torch.exp(log_ratio)
    cr = torch.clamp(ratio, clip_low, clip_high)
    if loss_type == "cispo":
        weight = -(cr.detach() * adv)  # -sg(clip(r)) A: a constant weight on logp
        pg = weight * lp
        clipped = cr != ratio
    else:
        unclipped, clipped_term = -adv * ratio, -adv * cr
        clipped = clipped_term > unclipped
        pg = torch.where(clipped, clipped_term, unclipped)
        if dual_clip_c is not None:
            dual_term = -adv * dual_clip_c
            pg = torch.where((adv < 0) & (dual_term < pg), dual_term, pg)
    tis = None
    if tis_mode == "weights":
        tis = _const(rollout_logp, active)
    elif tis_mode != "none":
        w = torch.exp(old - _const(rollout_logp, active))
        if tis_mode == "truncate":
            tis = torch.clamp(w, max=tis_cap)
        else:  # mask: tokens whose weight exceeds the cap are dropped, as if masked
            active = active & (w <= tis_cap)
    if tis is not None and tis_scope == "pg":
        pg = pg * tis
    loss = pg
    if ref_logp is not None:
        loss = loss + kl_coef * _kl(lp, _const(ref_logp, active), kl_estimator)
    if entropy is not None:
        loss = loss - entropy_coef * _safe(entropy, active)
    if tis is not None and tis_scope != "pg":
        loss = loss * tis
    loss = torch.where(active, loss, 0.0)
    clipped = clipped & active

    n_row = active.sum(1).to(F64)  # integer counts: exact in any order
    row_sum = row_sums(loss)
    n_tokens, n_seqs = n_row.sum(), (n_row > 0).sum().to(F64)
    if normalizer_tensor is not None:
        den = normalizer_tensor.detach().reshape(()).to(F64)
        den = torch.where(torch.isfinite(den) & (den >= 0), den, torch.nan)  # as the kernel: poison, not a sign flip
    elif normalizer is not None:
        den = torch.tensor(float(normalizer), dtype=F64, device=logp.device)
    else:
        den = n_tokens if aggregation == "token-mean" else n_seqs
    if aggregation == "seq-mean-token-mean":
        num = batch_sum(_div0(row_sum, n_row))
    else:
        num = batch_sum(row_sum)
    total = _div0(num, den)

    with torch.no_grad():
        r = ratio.detach()
        u = -log_ratio.detach()
        k3 = (torch.exp(u) - 1.0) - u
        n_clip = clipped.sum().to(F64)
        diag = torch.stack([
            _div0(n_clip, n_tokens),
            _div0(batch_sum(row_sums(torch.where(active, k3, 0.0))), n_tokens),
            _div0(batch_sum(row_sums(torch.where(active, r, 0.0))), n_tokens),
            torch.where(n_tokens > 0, torch.where(active, r, torch.inf).amin() if r.numel() else n_tokens, 0.0),
            torch.where(n_tokens > 0, torch.where(active, r, -torch.inf).amax() if r.numel() else n_tokens, 0.0),
            _div0(batch_sum(row_sums(torch.where(active, u, 0.0))), n_tokens),
        ])
    return total.to(torch.float32), loss.to(torch.float32), diag.to(torch.float32)


def gspo_loss(logp, old_logp, advantages, mask_u8, ref_logp, entropy, rollout_logp, clip_low, clip_high, normalizer,
              kl_coef, kl_estimator, entropy_coef, tis_mode, tis_cap, aggregation="seq-mean-token-mean",
              tis_scope="loss"):
    """(loss [], sequence_loss [B], diagnostics [6]) fp32; same arguments as ops.gspo.gspo_loss_fwd
    (ref_logp / entropy / rollout_logp are None when their term is off; rollout_logp holds the weights
    in tis_mode "weights")."""
    active = mask_u8 != 0
    tis = None
    if tis_mode == "weights":
        tis = _const(rollout_logp, active)
    elif tis_mode != "none":
        w = torch.exp(_const(old_logp, active) - _const(rollout_logp, active))
        if tis_mode == "truncate":
            tis = torch.clamp(w, max=tis_cap)
        else:  # mask: tokens whose weight exceeds the cap are dropped, as if masked
            active = active & (w <= tis_cap)
    lp, old = _safe(logp, active), _const(old_logp, active)
    n = active.sum(1).to(F64)
    has = n > 0
    n1 = torch.clamp(n, min=1.0)
    lr_sum = row_sums(lp - old)
    s = torch.exp(lr_sum / n1)
    a = advantages.detach().to(F64)
    cs = torch.clamp(s, clip_low, clip_high)
    unclipped = -a * s >= -a * cs
    if tis is None:
        terms = torch.where(unclipped, -a * s, -a * cs)
    else:  # GSPO-token: s_it = sg(s_i) exp(logp_t - sg(logp_t)), each token's share weighted by tis_t
        s_tok = s.detach()[:, None] * torch.exp(lp - lp.detach())
        pg_tok = torch.where(unclipped[:, None], -a[:, None] * s_tok, -a[:, None] * torch.clamp(s_tok, clip_low, clip_high))
        terms = row_sums(torch.where(active, tis * pg_tok, 0.0)) / n1
    if ref_logp is not None or entropy is not None:
        extra = torch.zeros_like(lp)
        if ref_logp is not None:
            extra = extra + kl_coef * _kl(lp, _const(ref_logp, active), kl_estimator)
        if entropy is not None:
            extra = extra - entropy_coef * _safe(entropy, active)
        if tis is not None and tis_scope != "pg":
            extra = tis * extra
        terms = terms + row_sums(torch.where(active, extra, 0.0)) / n1
    terms = torch.where(has, terms, 0.0)
    seqs = has.sum().to(F64)
    if normalizer is not None:
        den = torch.tensor(float(normalizer), dtype=F64, device=logp.device)
    else:
        den = n.sum() if aggregation == "token-mean" else seqs
    f = terms if aggregation == "seq-mean-token-mean" else n * terms
    total = _div0(batch_sum(f), den)
    with torch.no_grad():
        sd = s.detach()
        u = old - lp.detach()
        k3 = (torch.exp(u) - 1.0) - u
        diag = torch.stack([
            _div0((has & (sd != cs.detach())).sum().to(F64), seqs),
            _div0(batch_sum(row_sums(torch.where(active, k3, 0.0))), n.sum()),
            _div0(batch_sum(torch.where(has, sd, 0.0)), seqs),
            torch.where(seqs > 0, torch.where(has, sd, torch.inf).amin() if sd.numel() else seqs, 0.0),
            torch.where(seqs > 0, torch.where(has, sd, -torch.inf).amax() if sd.numel() else seqs, 0.0),
            _div0(-batch_sum(lr_sum.detach()), n.sum()),
        ])
    return total.to(torch.float32), terms.to(torch.float32), diag.to(torch.float32)


# ---- rollout correction (constants to autograd) ----

@torch.no_grad()
def rollout_correction(old_logp, rollout_logp, mask_u8, is_level, is_mode, is_low, is_high, rs: dict,
                       log_ratio_clamp):
    """(weights [B, T] fp32 or None, keep [B, T] bool, rows [B, 4] fp32); same arguments as
    ops.rollout_correction.launch_rollout_correction. Float64, fixed-shape row sums."""
    import math

    active = mask_u8 != 0
    lr = _const(old_logp, active) - _const(rollout_logp, active)
    lrc = lr if log_ratio_clamp is None else torch.clamp(lr, -log_ratio_clamp, log_ratio_clamp)
    k1, k2 = -lrc, 0.5 * lrc * lrc
    k3 = torch.where(active, (torch.exp(lrc) - 1.0) - lrc, 0.0)
    n = active.sum(1).to(F64)
    n1 = torch.clamp(n, min=1.0)
    s1, s2, s3 = row_sums(k1), row_sums(k2), row_sums(k3)
    B = lr.shape[0]
    zero = torch.zeros(B, dtype=F64, device=lr.device)
    m2 = torch.where(active, k2, 0.0).amax(1) if lr.shape[1] else zero
    m3 = torch.where(active, k3, 0.0).amax(1) if lr.shape[1] else zero
    seq_stat = {"seq_sum_k1": s1, "seq_sum_k2": s2, "seq_sum_k3": s3, "seq_mean_k1": s1 / n1, "seq_mean_k2": s2 / n1,
                "seq_mean_k3": s3 / n1, "seq_max_k2": m2, "seq_max_k3": m3}
    tok_stat = {"token_k1": k1, "token_k2": k2, "token_k3": k3}
    seq_keep = torch.ones(B, dtype=torch.bool, device=lr.device)
    keep = active.clone()
    for name, spec in rs.items():
        stat = seq_stat[name] if name in seq_stat else tok_stat[name]
        if name.endswith("k1"):
            ok = (stat >= math.log(spec[0])) & (stat <= math.log(spec[1]))
        else:
            ok = stat <= spec
        if name in seq_stat:
            seq_keep = seq_keep & ok
        else:
            keep = keep & ok
    keep = keep & seq_keep[:, None]
    s_lr = row_sums(lr)
    big_l = s_lr if is_level == "sequence" else s_lr / n1
    if log_ratio_clamp is not None:
        big_l = torch.clamp(big_l, -log_ratio_clamp, log_ratio_clamp)
    weights = None
    if is_level is not None:
        w = torch.exp(lrc) if is_level == "token" else torch.exp(big_l)[:, None].expand_as(lr)
        if is_mode == "truncate":
            if is_low is not None:
                w = torch.clamp(w, min=is_low)
            w = torch.clamp(w, max=is_high)
        else:
            ok = w <= is_high
            if is_low is not None:
                ok = ok & (w >= is_low)
            w = torch.where(ok, w, 0.0)
        weights = torch.where(active, w, 0.0).to(torch.float32)
    rows = torch.stack([n, torch.where(n > 0, big_l, 0.0), seq_keep.to(F64), keep.sum(1).to(F64)], 1)
    return weights, keep, rows.to(torch.float32)


# ---- advantages (constants to autograd) ----

@torch.no_grad()
def gae(rewards, values, mask_u8, bootstrap, gamma: float, lam: float):
    """(advantages, returns) fp32 [B, T]; same arguments as ops.advantages.launch_gae."""
    B, T = rewards.shape
    active = mask_u8 != 0
    r, v = _safe(rewards, active), _safe(values, active)
    adv = torch.zeros((B, T), dtype=F64, device=rewards.device)
    a_next = torch.zeros(B, dtype=F64, device=rewards.device)
    v_next = bootstrap.to(F64)
    for t in range(T - 1, -1, -1):  # masked tokens are identity steps: the state passes through
        on = active[:, t]
        a = (r[:, t] + gamma * v_next - v[:, t]) + (gamma * lam) * a_next
        a_next = torch.where(on, a, a_next)
        v_next = torch.where(on, v[:, t], v_next)
        adv[:, t] = torch.where(on, a, 0.0)
    return adv.to(torch.float32), torch.where(active, adv + v, 0.0).to(torch.float32)


@torch.no_grad()
def group_stats(scores, group_ids, valid_u8, num_groups):
    """(mean, sum of squared deviations, count) per group over its valid members, float64 / int64.

    Each group's valid members, in member (batch) order, form one row of a [num_groups, width] matrix
    (width: the largest group, read with one host sync), reduced by row_sums.
    """
    dev = scores.device
    ok = valid_u8 != 0
    key = torch.where(ok, group_ids.long(), num_groups)  # invalid rows sort last
    order = torch.argsort(key, stable=True)
    count = torch.zeros(num_groups + 1, dtype=torch.int64, device=dev).scatter_add_(0, key, torch.ones_like(key))
    start = torch.cumsum(count, 0) - count
    k_sorted = key[order]
    rank = torch.arange(key.numel(), device=dev) - start[k_sorted]
    count = count[:num_groups]
    width = int(count.max()) if num_groups and key.numel() else 0  # the one host sync
    keep = k_sorted < num_groups
    members = torch.zeros((num_groups, width), dtype=F64, device=dev)
    present = torch.zeros((num_groups, width), dtype=torch.bool, device=dev)
    members[k_sorted[keep], rank[keep]] = scores[order][keep].to(F64)  # distinct cells: no accumulation
    present[k_sorted[keep], rank[keep]] = True
    n = count.to(F64)
    mean = _div0(row_sums(members), n)
    m2 = row_sums(torch.where(present, (members - mean[:, None]) ** 2, 0.0))  # second pass, no cancellation
    return mean, m2, count


@torch.no_grad()
def group_advantages(scores, group_ids, valid_u8, num_groups, mode: str, eps: float, singleton: str = "zero"):
    """fp32 [B]; same arguments as ops.advantages.launch_group_advantages (returns the advantages only)."""
    return group_advantages64(scores, group_ids, valid_u8, num_groups, mode, eps, singleton).to(torch.float32)


@torch.no_grad()
def masked_whiten(values, mask_u8, stats, shift_mean: bool, unbiased: bool, eps: float, eps_on_var: bool):
    """(whitened [B, T] fp32, stats [3] fp32 = mean, var, den); same arguments as
    ops.advantages.launch_masked_whiten. Float64 throughout, fixed-shape sums (row_sums, batch_sum)."""
    active = mask_u8 != 0
    v = _safe(values, active)
    if stats is None:
        n = active.sum().to(F64)
        mean = _div0(batch_sum(row_sums(v)), n)
        dev2 = torch.where(active, (v - mean) ** 2, 0.0)
        dof = n - 1.0 if unbiased else n
        var = torch.where(dof > 0, batch_sum(row_sums(dev2)) / torch.clamp(dof, min=1.0), 0.0)
        den = torch.sqrt(var + eps) if eps_on_var else torch.sqrt(var) + eps
        stats64 = torch.stack([mean, var, den])
    else:
        stats64 = stats.to(F64)
        mean, den = stats64[0], stats64[2]
    out = _div0(v - mean, den.expand_as(v))
    if not shift_mean:
        out = out + mean
    return torch.where(active, out, 0.0).to(torch.float32), stats64.to(torch.float32)


@torch.no_grad()
def group_advantages64(scores, group_ids, valid_u8, num_groups, mode: str, eps: float, singleton: str = "zero"):
    """The float64 advantages [B] (0 for invalid rows, and for groups of one unless singleton "raw")."""
    mean, m2, count = group_stats(scores, group_ids, valid_u8, num_groups)
    ok = valid_u8 != 0
    g = torch.where(ok, group_ids.long(), 0)
    if num_groups == 0:
        return torch.zeros_like(scores, dtype=F64)
    s = scores.to(F64)
    mu, n = mean[g], count[g].to(F64)
    several = n > 1
    if mode == "mean":
        adv = s - mu
    elif mode == "mean_std":
        # The float64 mean of equal fp32 scores is exact (their sums fit in 53 bits), so a group
        # without spread has exact zero deviations; std + eps == 0 (eps = 0) gives 0, not 0 / 0.
        std = torch.sqrt(m2[g] / torch.clamp(n - 1.0, min=1.0))
        adv = torch.where(several, _div0(s - mu, std + eps), 0.0)
    else:  # rloo: s minus the mean of the others
        adv = torch.where(several, (s - mu) * (n / torch.clamp(n - 1.0, min=1.0)), 0.0)
    if singleton == "raw":  # a group of one: baseline 0, std 1
        adv = torch.where(n == 1, s / (1.0 + eps) if mode == "mean_std" else s, adv)
    return torch.where(ok, adv, 0.0)
