"""rlk_triton.compat: each preset against a float64 transcription of the framework's own formula,
written here (the frameworks are not dependencies; sources: verl 0.8 trainer/ppo/core_algos.py and
rollout_corr_helper.py, TRL's GRPOTrainer._compute_loss and its vLLM importance sampling, slime's
backends/megatron_utils/loss.py and utils/ppo_utils.py).

Two steps per preset: (1) rlk's float64 reference (reference/losses.py) with the preset's arguments
equals the transcription, values and d logp, up to the frameworks' own epsilons (verl adds 1e-8 to
its masked-mean denominators: a relative 1e-8 / n); (2) the kernels, both backends, meet the
contract against that reference (rlk_triton.testing.rl_ops judges, contracts/rl_losses.yaml).
"""
import math

import numpy as np
import pytest
import torch

from rlk_triton import compat, contracts, errors
from rlk_triton.advantages import gae, group_advantages, masked_whiten, reinforce_pp_baseline
from rlk_triton.losses import BACKENDS, rollout_correction
from rlk_triton.reference.advantages import group_advantages_reference, masked_whiten_reference
from rlk_triton.reference.losses import (gspo_grad_reference, gspo_reference, policy_loss_grad_reference,
                                         policy_loss_reference, rollout_correction_reference)
from rlk_triton.testing.float64_checks import (denominator_eps_bound, loss_identity_bound,
                                               normalization_roundings_bound)
from rlk_triton.testing.rl_ops import (_np, gspo_loss_scales, judge_gspo, judge_policy, make_inputs,
                                       policy_loss_scales)

F64 = torch.float64


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


# ---- the transcriptions (float64 torch, autograd for d logp) ----

VERL_MEAN_EPS = 1e-8  # verl_F.masked_mean's denominator eps


def _masked_mean(x, m, axis=None):  # verl_F.masked_mean
    return (torch.where(m.bool(), x, 0.0) * m).sum(axis) / (m.sum(axis) + VERL_MEAN_EPS)


def _verl_agg(loss_mat, m, mode, loss_scale_factor=None):  # core_algos.agg_loss, one rank, no global info
    if mode == "token-mean":
        return (torch.where(m.bool(), loss_mat, 0.0) * m).sum() / m.sum()
    if mode == "seq-mean-token-sum":
        seq, sm = (loss_mat * m).sum(-1), (m.sum(-1) > 0).double()
        return (seq * sm).sum() / sm.sum()
    if mode == "seq-mean-token-mean":
        cnt = m.sum(-1)
        seq, sm = (loss_mat * m).sum(-1) / (cnt + VERL_MEAN_EPS), (cnt > 0).double()
        return (seq * sm).sum() / sm.sum()
    return (loss_mat * m).sum(-1).sum() / (loss_scale_factor or m.shape[-1])


def _verl_kl(logp, ref, kind):  # core_algos.kl_penalty_forward
    if kind in ("kl", "k1"):
        return logp - ref
    if kind in ("mse", "k2"):
        return 0.5 * (logp - ref).square()
    kl = torch.clamp(ref - logp, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def _verl_rollout_weights(old, roll, m, level, threshold):  # rollout_corr_helper.compute_rollout_correction_weights
    lr = old - roll
    if level == "token":
        w = torch.exp(torch.clamp(lr, -20.0, 20.0))
    else:
        w = torch.exp(torch.clamp((torch.where(m.bool(), lr, 0.0) * m).sum(-1, keepdim=True), -20.0, 20.0)).expand_as(lr)
    return (w * m).clamp(max=threshold)


def _verl_rejection(old, roll, m, options):  # compute_rollout_rejection_mask, the options used here
    lr = torch.clamp(old - roll, -20.0, 20.0)
    k1, k2, k3 = -lr, 0.5 * lr ** 2, torch.exp(lr) - 1.0 - lr
    keep = torch.ones_like(m)
    for name, spec in options.items():
        if name == "token_k1":
            ok = (k1 >= math.log(spec[0])) & (k1 <= math.log(spec[1]))
        elif name == "seq_mean_k3":
            ok = (_masked_mean(k3, m, -1) <= spec)[:, None].expand_as(m)
        elif name == "seq_max_k2":
            mx = k2.masked_fill(~m.bool(), float("-inf")).max(-1).values
            ok = (torch.where(mx == float("-inf"), 0.0, mx) <= spec)[:, None].expand_as(m)
        else:
            raise AssertionError(name)
        keep = keep * ok.double()
    return m * keep


def _verl_actor_loss(cfg, logp, old, adv, m, ref, ent, weights):
    """dp_actor's policy loss: compute_policy_loss_vanilla / _cispo / _gspo + entropy + KL, one micro-batch."""
    mode, agg = cfg["policy_loss"]["loss_mode"], cfg["loss_agg_mode"]
    low, high = cfg["clip_ratio_low"], cfg["clip_ratio_high"]
    if mode == "gspo":
        nak = logp - old
        seq = (nak * m).sum(-1) / m.sum(-1).clamp(min=1)
        lsr = torch.clamp(logp - logp.detach() + seq.detach()[:, None], max=10.0)
        s = torch.exp(lsr)
        pg = torch.maximum(-adv * s, -adv * torch.clamp(s, 1 - low, 1 + high))
    else:
        nak = torch.clamp(logp - old, min=-20.0, max=20.0)
        ratio = torch.exp(nak)
        if mode == "cispo":
            pg = -torch.clamp(ratio, 1 - low, 1 + high).detach() * adv * logp
        else:
            pg1, pg2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high)
            cp1 = torch.maximum(pg1, pg2)
            cp2 = torch.min(-adv * cfg["clip_ratio_c"], cp1)
            pg = torch.where(adv < 0, cp2, cp1)
    if weights is not None:
        pg = pg * weights
    loss = _verl_agg(pg, m, agg)
    if cfg.get("entropy_coeff"):
        loss = loss - _verl_agg(ent, m, agg) * cfg["entropy_coeff"]
    if cfg.get("use_kl_loss"):
        loss = loss + _verl_agg(_verl_kl(logp, ref, cfg["kl_loss_type"]), m, agg) * cfg["kl_loss_coef"]
    return loss


def _trl_loss(args, logp, old, adv, m, ref, is_ratio):
    """GRPOTrainer._compute_loss (one process, no gradient accumulation)."""
    lr = logp - old
    if args["importance_sampling_level"] == "token":
        lw = lr
    else:
        lw = ((lr * m).sum(-1) / m.sum(-1).clamp(min=1.0))[:, None]
    coef_1 = torch.exp(lw)
    a = adv[:, None]
    if args["loss_type"] == "cispo":
        per_token = -torch.clamp(coef_1, max=args["epsilon_high"]).detach() * a * logp
    else:
        coef_2 = torch.clamp(coef_1, 1 - args["epsilon"], 1 + args["epsilon_high"])
        if args.get("delta") is not None:
            coef_1 = torch.clamp(coef_1, max=args["delta"])
        per_token = -torch.min(coef_1 * a, coef_2 * a)
    if is_ratio is not None:
        per_token = per_token * is_ratio
    if args.get("beta"):
        per_token = per_token + args["beta"] * (torch.exp(ref - logp) - (ref - logp) - 1)
    lt = args["loss_type"]
    if lt == "grpo":
        return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if lt == "bnpo":
        return (per_token * m).sum() / m.sum().clamp(min=1.0)
    if lt == "dr_grpo":
        return (per_token * m).sum() / (per_token.size(0) * args["max_completion_length"])
    return (per_token * m).sum() / m.sum().clamp(min=1.0)  # dapo / cispo, num_items_in_batch = local tokens


def _trl_is_ratio(args, old, sampling, m):  # _generate_and_score_completions' vLLM importance sampling
    diff = (old - sampling) * m
    seq = args["vllm_importance_sampling_mode"].startswith("sequence")
    r = torch.exp(diff.sum(-1, keepdim=True) if seq else diff)
    lo, hi = args.get("vllm_importance_sampling_clip_min"), args.get("vllm_importance_sampling_clip_max")
    if args["vllm_importance_sampling_mode"].endswith("truncate"):
        return torch.clamp(r, min=lo, max=hi)
    bad = (r < (lo if lo is not None else -math.inf)) | (r > (hi if hi is not None else math.inf))
    return r.masked_fill(bad, 0.0)


def _slime_tis(args, old, rollout):  # vanilla_tis_function / icepop_function's weights
    tis = torch.exp(old - rollout)
    if str(args.get("custom_tis_function_path", "")).endswith("icepop_function"):
        return torch.where((tis >= args["tis_clip_low"]) & (tis <= args["tis_clip"]), tis, torch.zeros_like(tis))
    return torch.clamp(tis, min=args["tis_clip_low"], max=args["tis_clip"])


def _slime_loss(args, logp, old, adv, m, ref, ent, rollout, weights=None):
    """policy_loss_function with sum_of_sample_mean over one micro-batch (then / normalizer); weights:
    the TIS weights as rlk computed them (checked against _slime_tis separately)."""
    ppo_kl = old - logp
    ratio = (-ppo_kl).exp()
    if args["advantage_estimator"] == "cispo":
        pg = -torch.clamp(ratio, 1 - args["eps_clip"], 1 + args["eps_clip_high"]).detach() * adv * logp
    else:
        pg1, pg2 = -ratio * adv, -ratio.clamp(1 - args["eps_clip"], 1 + args["eps_clip_high"]) * adv
        pg = torch.maximum(pg1, pg2)
        if args.get("eps_clip_c") is not None:
            pg = torch.where(adv < 0, torch.min(-args["eps_clip_c"] * adv, pg), pg)
    if args.get("use_tis"):
        pg = pg * (_slime_tis(args, old, rollout) if weights is None else weights)

    def reduce(x):
        if args.get("calculate_per_token_loss"):
            return (x * m).sum()
        return ((x * m).sum(-1) / m.sum(-1).clamp(min=1)).sum()

    loss = reduce(pg) - args.get("entropy_coef", 0.0) * reduce(ent)
    if args.get("use_kl_loss"):
        lr = logp - ref
        kt = args["kl_loss_type"]
        kl = {"k1": lambda: lr, "k2": lambda: lr ** 2 / 2.0}.get(kt, lambda: (-lr).exp() - 1 + lr)()
        if kt == "low_var_kl":
            kl = torch.clamp(kl, min=-10, max=10)
        loss = loss + args["kl_loss_coef"] * reduce(kl)
    return loss


# ---- helpers ----

def _t64(x):
    return x.detach().double().cpu()


def _preset_kwargs(preset, x, rc):
    """The preset's keyword arguments with the batch's tensors (and the normalizer it derives)."""
    kw = dict(preset)
    if "kl_coef" in kw:
        kw["ref_logp"] = x["ref_logp"]
    if "entropy_coef" in kw:
        kw["entropy"] = x["entropy"]
    if rc is not None and rc.weights is not None:
        kw["is_weights"] = rc.weights
    if kw.get("normalizer") is None and preset.normalizer_rule is not None:
        B, T = x["logp"].shape
        kw["normalizer"] = {"T": T, "B": B, "B x max_len": B * (preset.max_completion_length or T)}[preset.normalizer_rule]
    return kw


def _check(preset, x, mask, framework_loss, device, backend, adv_seq=False, denominator_eps=0.0):
    """Step 1 (identity in float64, up to the transcription's eps in its mean denominators) and step 2
    (the kernels within the contract)."""
    inputs = dict(x, mask=mask)
    rc = None
    if preset.rollout_correction is not None:
        rc = rollout_correction(x["old_logp"], x["rollout_logp"], mask, backend=backend, **preset.rollout_correction)
        inputs["mask"] = rc.keep
    kw = _preset_kwargs(preset, x, rc)
    ref_kw = {k: (_np(v) if torch.is_tensor(v) else v) for k, v in kw.items()}
    lp = _t64(x["logp"]).requires_grad_(True)
    fw = framework_loss(lp, rc)
    fw.backward()
    args = (_np(x["logp"]), _np(x["old_logp"]), _np(x["advantages"]), inputs["mask"].cpu().numpy())
    if preset.loss.__name__ == "gspo_loss":
        ours64 = gspo_reference(*args, **ref_kw)[0]
        grad64 = gspo_grad_reference(*args, 1.0, **ref_kw)[0]
        loss_scale, grad_scale = gspo_loss_scales(inputs, {"kwargs": kw})
        ratios = judge_gspo(inputs, {"kwargs": kw}, device, backend=backend)
    else:
        ours64 = policy_loss_reference(*args, **ref_kw)[0]
        grad64 = policy_loss_grad_reference(*args, 1.0, **ref_kw)[0]
        loss_scale, grad_scale = policy_loss_scales(inputs, {"kwargs": kw})
        ratios = judge_policy(inputs, {"kwargs": kw}, device, backend=backend)
    bound = loss_identity_bound(lp.numel(), denominator_eps)
    assert abs(ours64 - fw.item()) <= bound * loss_scale, (abs(ours64 - fw.item()), bound * loss_scale)
    gap = np.abs(grad64 - lp.grad.numpy())
    assert np.all(gap <= bound * grad_scale), (gap / (bound * grad_scale)).max()
    assert max(ratios.values()) <= 1.0, ratios


def _rl_bound(device):
    from rlk_triton._runtime import arch_of

    return contracts.judgment("rl_losses", torch.float32, "forward_accuracy", arch_of(torch.device(device)))["outputs"]


def _mask64(x):
    return x["mask"].double().cpu()


# ---- verl ----

VERL_BASE = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
             "policy_loss": {"loss_mode": "vanilla"}, "use_kl_loss": True, "kl_loss_coef": 0.1,
             "kl_loss_type": "low_var_kl", "entropy_coeff": 0.01}


@pytest.mark.parametrize("agg", ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"))
@pytest.mark.parametrize("mode", ("vanilla", "cispo"))
def test_verl_actor_loss(agg, mode, device, backend):
    cfg = dict(VERL_BASE, loss_agg_mode=agg, policy_loss={"loss_mode": mode})
    x = make_inputs(4, 33, seed=71 + len(agg), empty_rows=(1,), device=device)
    p = compat.verl(cfg)
    assert p.loss.__name__ == "policy_loss" and p["log_ratio_clamp"] == 20.0
    m = _mask64(x)
    _check(p, x, x["mask"], lambda lp, rc: _verl_actor_loss(cfg, lp, _t64(x["old_logp"]), _t64(x["advantages"]), m,
                                                             _t64(x["ref_logp"]), _t64(x["entropy"]), None),
           device, backend, denominator_eps=VERL_MEAN_EPS)


@pytest.mark.parametrize("level", ("token", "sequence"))
def test_verl_rollout_correction(level, device, backend):
    """rollout_is weights on the policy term only (KL and entropy unweighted), rollout_rs rejection as the
    mask of every term: verl's dp_actor with algorithm.rollout_correction."""
    cfg = dict(VERL_BASE, loss_agg_mode="token-mean")
    bounds = ((0.4, 2.5), 0.06, 0.35) if level == "token" else ((0.988, 1.0122), 2.3e-5, 9.4e-5)
    rc_cfg = {"rollout_is": level, "rollout_is_threshold": 2.0 if level == "token" else 1e9,
              "rollout_rs": "token_k1,seq_mean_k3,seq_max_k2",
              "rollout_rs_threshold": "{}_{},{},{}".format(*bounds[0], *bounds[1:])}
    x = make_inputs(6, 33, seed=73, empty_rows=(2,), device=device)
    if level == "sequence":  # sequence products near 1: a small rollout mismatch
        x["rollout_logp"] = x["old_logp"] + 0.02 * (x["rollout_logp"] - x["old_logp"])
    p = compat.verl(cfg, rollout_correction=rc_cfg)
    assert p["tis_scope"] == "pg" and p.rollout_correction["rejection"]["token_k1"] == bounds[0]
    old, roll, m = _t64(x["old_logp"]), _t64(x["rollout_logp"]), _mask64(x)
    keep = _verl_rejection(old, roll, m, dict(zip(("token_k1", "seq_mean_k3", "seq_max_k2"), bounds)))
    w = _verl_rollout_weights(old, roll, m, level, rc_cfg["rollout_is_threshold"])
    rc = rollout_correction(x["old_logp"], x["rollout_logp"], x["mask"], backend=backend, **p.rollout_correction)
    assert torch.equal(rc.keep.cpu(), keep.bool()), "the rejection mask"
    assert 0 < keep.sum() < m.sum()
    _, _, _, scale = rollout_correction_reference(_np(x["old_logp"]), _np(x["rollout_logp"]), x["mask"].cpu().numpy(),
                                                  **{k: v for k, v in p.rollout_correction.items() if k != "rejection"})
    assert contracts.scaled_abs_ratio(rc.weights.cpu(), w.numpy(), scale, _rl_bound(device)["is_weights"]) <= 1.0
    # the loss, given those weights (the transcription multiplies by the same fp32 weights)
    _check(p, x, x["mask"], lambda lp, rc_: _verl_actor_loss(cfg, lp, old, _t64(x["advantages"]), keep,
                                                              _t64(x["ref_logp"]), _t64(x["entropy"]),
                                                              _t64(rc_.weights)),
           device, backend, denominator_eps=VERL_MEAN_EPS)


def test_verl_gspo(device, backend):
    cfg = dict(VERL_BASE, loss_agg_mode="token-mean", policy_loss={"loss_mode": "gspo"}, clip_ratio_low=3e-4,
               clip_ratio_high=4e-4)
    x = make_inputs(4, 33, seed=75, adv_per_seq=True, empty_rows=(3,), device=device)
    x["logp"] = x["old_logp"] + 0.01 * (x["logp"] - x["old_logp"])
    p = compat.verl(cfg)
    assert p.loss.__name__ == "gspo_loss" and p["aggregation"] == "token-mean"
    m = _mask64(x)
    adv = _t64(x["advantages"])[:, None].expand_as(m)
    _check(p, x, x["mask"], lambda lp, rc: _verl_actor_loss(cfg, lp, _t64(x["old_logp"]), adv, m,
                                                             _t64(x["ref_logp"]), _t64(x["entropy"]), None),
           device, backend, denominator_eps=VERL_MEAN_EPS)


# ---- TRL ----

TRL_CASES = {
    "grpo_seq_mask": {"loss_type": "grpo", "vllm_importance_sampling_mode": "sequence_mask",
                      "vllm_importance_sampling_clip_max": 3.0},
    "dapo_token_truncate_beta_delta": {"loss_type": "dapo", "beta": 0.04, "delta": 2.0, "epsilon_high": 0.28,
                                       "vllm_importance_sampling_mode": "token_truncate",
                                       "vllm_importance_sampling_clip_max": 2.0},
    "bnpo_icepop": {"loss_type": "bnpo", "vllm_importance_sampling_mode": "token_mask",
                    "vllm_importance_sampling_clip_min": 0.5, "vllm_importance_sampling_clip_max": 2.0},
    "dr_grpo": {"loss_type": "dr_grpo", "max_completion_length": 40, "vllm_importance_sampling_correction": False},
    "cispo": {"loss_type": "cispo", "epsilon_high": 5.0, "vllm_importance_sampling_mode": "token_truncate"},
    "gspo_grpo": {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4,
                  "epsilon_high": 4e-4, "vllm_importance_sampling_mode": "sequence_truncate",
                  "vllm_importance_sampling_clip_max": 1e9},
}


@pytest.mark.parametrize("case", sorted(TRL_CASES))
def test_trl(case, device, backend):
    args = {"epsilon": 0.2, "epsilon_high": 0.2, "importance_sampling_level": "token", "beta": 0.0,
            "vllm_importance_sampling_clip_max": 3.0,
            "vllm_importance_sampling_correction": True, **TRL_CASES[case]}
    x = make_inputs(5, 33, seed=77 + len(case), adv_per_seq=True, empty_rows=(1,), device=device)
    if "seq" in args.get("vllm_importance_sampling_mode", "") or args["importance_sampling_level"] == "sequence":
        x["rollout_logp"] = x["old_logp"] + 0.02 * (x["rollout_logp"] - x["old_logp"])
        x["logp"] = x["old_logp"] + 0.01 * (x["logp"] - x["old_logp"])
    p = compat.trl(args)
    m = _mask64(x)
    old, adv = _t64(x["old_logp"]), _t64(x["advantages"])
    isr = None
    if args["vllm_importance_sampling_correction"]:
        isr = _trl_is_ratio(args, old, _t64(x["rollout_logp"]), m)
        rc = rollout_correction(x["old_logp"], x["rollout_logp"], x["mask"], backend=backend, **p.rollout_correction)
        _, _, _, scale = rollout_correction_reference(_np(x["old_logp"]), _np(x["rollout_logp"]),
                                                      x["mask"].cpu().numpy(), **p.rollout_correction)
        want = (isr * m).expand_as(m).numpy()
        assert contracts.scaled_abs_ratio(rc.weights.cpu(), want, scale, _rl_bound(device)["is_weights"]) <= 1.0
    _check(p, x, x["mask"], lambda lp, rc: _trl_loss(args, lp, old, adv, m, _t64(x["ref_logp"]),
                                                     None if rc is None else _t64(rc.weights)), device, backend)


def test_trl_rejects_what_it_cannot_reproduce():
    with pytest.raises(errors.InputError) as e:
        compat.trl({"loss_type": "grpo", "delta": 1.1, "epsilon_high": 0.28})
    assert e.value.argument == "delta"
    with pytest.raises(errors.InputError) as e:
        compat.trl({"loss_type": "sapo"})
    assert e.value.argument == "loss_type"
    with pytest.raises(errors.InputError) as e:
        compat.verl({"policy_loss": {"loss_mode": "vanilla"}, "use_kl_loss": True, "kl_loss_type": "k3+"})
    assert e.value.argument == "kl_loss_type"


# ---- slime ----

SLIME_CASES = {
    "grpo_tis_kl": {"advantage_estimator": "grpo", "eps_clip_c": 3.0, "use_tis": True, "tis_clip": 2.0,
                    "tis_clip_low": 0.3, "use_kl_loss": True, "kl_loss_coef": 0.05, "kl_loss_type": "low_var_kl",
                    "entropy_coef": 0.01},
    "icepop_per_token": {"advantage_estimator": "grpo", "use_tis": True, "tis_clip": 2.0, "tis_clip_low": 0.5,
                         "custom_tis_function_path": "slime.backends.megatron_utils.loss.icepop_function",
                         "calculate_per_token_loss": True, "use_kl_loss": True, "kl_loss_coef": 0.05,
                         "kl_loss_type": "k3"},
    "cispo": {"advantage_estimator": "cispo", "eps_clip_high": 4.0},
}


@pytest.mark.parametrize("case", sorted(SLIME_CASES))
def test_slime(case, device, backend):
    args = {"eps_clip": 0.2, "eps_clip_high": 0.28, **SLIME_CASES[case]}
    x = make_inputs(4, 33, seed=81 + len(case), empty_rows=(2,), device=device)
    p = compat.slime(args)
    m = _mask64(x)
    B = m.shape[0]
    n = float(m.sum()) if args.get("calculate_per_token_loss") else float(B)  # slime's global count, one rank
    p["normalizer"] = n
    _check(p, x, x["mask"], lambda lp, rc: _slime_loss(args, lp, _t64(x["old_logp"]), _t64(x["advantages"]), m,
                                                        _t64(x["ref_logp"]), _t64(x["entropy"]), _t64(x["rollout_logp"]),
                                                        None if rc is None else _t64(rc.weights)) / n,
           device, backend)
    if p.rollout_correction is not None:  # the weights themselves against slime's formula
        rc = rollout_correction(x["old_logp"], x["rollout_logp"], x["mask"], backend=backend, **p.rollout_correction)
        want = _slime_tis(args, _t64(x["old_logp"]), _t64(x["rollout_logp"])) * m
        _, _, _, scale = rollout_correction_reference(_np(x["old_logp"]), _np(x["rollout_logp"]),
                                                      x["mask"].cpu().numpy(), **p.rollout_correction)
        assert contracts.scaled_abs_ratio(rc.weights.cpu(), want.numpy(), scale, _rl_bound(device)["is_weights"]) <= 1.0


# ---- advantages: verl's loop estimators ----

def _verl_group(scores, index, kind, eps=1e-6):
    """compute_grpo_outcome_advantage / compute_rloo_outcome_advantage / the REINFORCE++ baseline's mean."""
    groups = {}
    for i, g in enumerate(index):
        groups.setdefault(g, []).append(scores[i])
    out = scores.clone()
    for i, g in enumerate(index):
        vals = torch.stack(groups[g])
        n = len(vals)
        mean, std = (torch.tensor(0.0, dtype=F64), torch.tensor(1.0, dtype=F64)) if n == 1 else (vals.mean(), vals.std())
        if kind == "grpo":
            out[i] = (scores[i] - mean) / (std + eps)
        elif kind == "rloo":
            out[i] = scores[i] * n / (n - 1) - mean * n / (n - 1) if n > 1 else scores[i]
        else:
            out[i] = scores[i] - mean
    return out


def _verl_whiten(values, m):  # verl_F.masked_whiten
    mean = _masked_mean(values, m)
    var = _masked_mean((values - mean) ** 2, m) * (m.sum() / (m.sum() - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def _adv_bound(device):
    from rlk_triton._runtime import arch_of

    return contracts.judgment("advantages", torch.float32, "forward_accuracy",
                              arch_of(torch.device(device)))["outputs"]


@pytest.mark.parametrize("kind", ("grpo", "rloo"))
def test_verl_group_advantages(kind, device, backend):
    g = torch.Generator().manual_seed(5)
    scores = torch.randn(14, generator=g)
    gid = torch.tensor([0, 0, 0, 1, 2, 2, 3, 4, 4, 4, 4, 5, 6, 6])  # groups 1, 3, 5 have one member
    p = compat.verl(VERL_BASE)
    mode = {"grpo": "mean_std", "rloo": "rloo"}[kind]
    ours = group_advantages(scores.to(device), gid.to(device), num_groups=7, mode=mode, backend=backend,
                            **p.advantages[kind]).cpu()
    fw = _verl_group(scores.double(), gid.tolist(), kind)
    ref, scale = group_advantages_reference(scores.numpy(), gid.numpy(), mode=mode, **p.advantages[kind])
    sizes = np.bincount(gid.numpy())[gid.numpy()]  # each score's group size
    bound = np.array([normalization_roundings_bound(int(n)) for n in sizes]) * scale
    assert np.all(np.abs(ref - fw.numpy()) <= bound), np.abs(ref - fw.numpy()) / bound
    assert contracts.scaled_abs_ratio(ours, fw.numpy(), scale, _adv_bound(device)["group_advantages"]) <= 1.0


def test_verl_reinforce_pp_baseline_and_gae_whitening(device, backend):
    g = torch.Generator().manual_seed(6)
    scores = torch.randn(8, generator=g)
    gid = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3])
    mask = torch.rand(8, 20, generator=g) < 0.8
    p = compat.verl(VERL_BASE)
    ours = reinforce_pp_baseline(scores.to(device), gid.to(device), mask.to(device), num_groups=4, backend=backend,
                                 **p.advantages["reinforce_plus_plus_baseline"]).cpu()
    m = mask.double()
    base = _verl_group(scores.double(), gid.tolist(), "mean")
    fw = _verl_whiten(base[:, None].expand_as(m) * m, m) * m
    bound = _adv_bound(device)["whitened"]
    _, scale = masked_whiten_reference((base[:, None] * m).numpy(), mask.numpy())
    assert contracts.scaled_abs_ratio(ours, fw.numpy(), scale, bound) <= 1.0
    # GAE: verl whitens its advantages over the response mask (masked_whiten(gae(...)[0], mask))
    r, v = torch.randn(3, 30, generator=g), torch.randn(3, 30, generator=g)
    gm = torch.rand(3, 30, generator=g) < 0.9
    adv, _ = gae(r.to(device), v.to(device), gm.to(device), gamma=0.99, lam=0.95, backend=backend)
    white = masked_whiten(adv, gm.to(device), backend=backend, **p.advantages["gae"]["whiten"]).cpu()
    ref, scale = masked_whiten_reference(adv.double().cpu().numpy(), gm.numpy())
    fw = _verl_whiten(adv.double().cpu(), gm.double())
    n = int(gm.sum())
    gap = np.abs(np.where(gm.numpy(), ref - fw.numpy(), 0.0))
    assert np.all(gap <= (normalization_roundings_bound(n) + denominator_eps_bound(VERL_MEAN_EPS, n)) * scale), \
        gap.max()
    assert contracts.scaled_abs_ratio(white, np.where(gm.numpy(), fw.numpy(), 0.0), scale, bound) <= 1.0
