"""Measure the RL losses' error against float64 to set contracts/rl_losses.yaml.

For every output it prints the smallest bound the sweep needs (the contract takes it times a stated
margin):
  forward   rtol_needed = max err / scale                       (scaled_abs with atol = 0)
  gradient  row_rtol_needed = max (err - u |ref| - s) / sensitivity, u = 2^-24 (fp32 unit roundoff),
            s = 2^-149 (the smallest fp32 subnormal)
The scales, sensitivities, inputs and runners are rlk_triton/testing/rl_ops.py's (re-exported by
tests/test_rl_losses.py), so the contract and the tests share one definition. GSPO (--ops gspo, or
all): gspo_loss over GSPO_FEATURES x both clip ranges x spreads 1e-4 .. 1 x with / without normalizer,
judged with rl_ops' GSPO scales (gspo_loss, gspo_sequence_loss, gspo_ratio, approx_kl, clipfrac, grad).
Run: python scripts/measure_rl_losses.py [--big] [--ops all|policy|gspo] [--out F]
(on CPU it runs the kernels under TRITON_INTERPRET=1; on a GPU it measures the compiled kernels;
--big adds [64 x 8192]).
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_rl_losses as t  # noqa: E402

from rlk_triton.reference.losses import ratio_kl_grad_reference, ratio_kl_reference  # noqa: E402

U32 = 2.0**-24
SUB32 = 2.0**-149


def _rtol(ours, ref, scale):
    err = np.abs(np.asarray(ours, np.float64) - np.asarray(ref, np.float64))
    if np.isnan(err).any():
        return float("inf")
    scale = np.broadcast_to(np.asarray(scale, np.float64), err.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(err == 0.0, 0.0, err / scale)
    return float(np.max(r)) if r.size else 0.0


def _row_rtol(ours, ref, sens):
    err = np.abs(np.asarray(ours, np.float64) - ref)
    if np.isnan(err).any():
        return float("inf")
    excess = np.maximum(err - U32 * np.abs(ref) - SUB32, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(excess > 0, excess / sens, 0.0)
    return float(np.max(r)) if r.size else 0.0


def measure_policy(inputs, spec):
    ours, ref, (x, kw, terms, weights, g, g_tok) = t.run_policy(inputs, spec, 1.3, token_grad_seed=5)
    scales = t.policy_forward_scales(x, kw, terms, weights)
    out = {name: _rtol(t._np(ours[name]), ref[name], scales[name]) for name in scales}
    s_logp, s_ent = t.policy_grad_sensitivity(x, kw, terms, weights, g, g_tok)
    out["grad"] = _row_rtol(t._np(ours["d_logp"]), ref["d_logp"], s_logp)
    if ours["d_entropy"] is not None:
        out["grad"] = max(out["grad"], _row_rtol(t._np(ours["d_entropy"]), ref["d_entropy"], s_ent))
    return out


def measure_ratio_kl(inputs, estimator, clamp, with_ref, use_mask):
    logp = inputs["logp"].detach().clone().requires_grad_(True)
    ref_t = inputs["ref_logp"] if with_ref else None
    mask = inputs["mask"] if use_mask else None
    outs = t.ratio_kl(logp, inputs["old_logp"], ref_t, mask=mask, kl_estimator=estimator, log_ratio_clamp=clamp)
    gen = torch.Generator().manual_seed(9)
    ups = [torch.randn(logp.shape, generator=gen) for _ in range(3)]
    sum((o * u.to(o.device)).sum() for o, u in zip(outs, ups) if o is not None).backward()
    x = {k: t._np(v) for k, v in inputs.items() if k != "mask"}
    m = None if mask is None else mask.cpu().numpy()
    r = x["ref_logp"] if with_ref else None
    ref_out = ratio_kl_reference(x["logp"], x["old_logp"], r, m, estimator, clamp)
    g = [u.double().numpy() for u in ups]
    ref_grad = ratio_kl_grad_reference(x["logp"], x["old_logp"], r, m, g[0], g[1], g[2] if with_ref else None,
                                       estimator, clamp)
    scales = t.ratio_kl_scales(x, estimator, clamp, ref_out)
    out = {name: _rtol(t._np(o), ro, scales[name])
           for name, o, ro in zip(("log_ratio", "ratio", "kl"), outs, ref_out) if o is not None}
    sens = t.ratio_kl_grad_sensitivity(x, estimator, clamp, g[0], g[1], g[2] if with_ref else None)
    out["grad"] = _row_rtol(t._np(logp.grad), ref_grad, sens)
    return out


def measure_gspo(inputs, spec):
    from rlk_triton.testing.rl_ops import _gspo_pieces, run_gspo

    ours, ref, (x, mask, kw, g_rows) = run_gspo(inputs, spec, 1.3, grad_rows_seed=5)
    p = _gspo_pieces(x, mask, kw)
    has, active = p["t"]["has"], p["t"]["active"]
    den = float(has.sum()) if kw.get("normalizer") is None else float(kw["normalizer"])
    w = 1.0 / den if den > 0 else 0.0
    r_ext = float(p["ratio"].max(initial=0.0))
    n_tok = max(int(active.sum()), 1)
    scales = {"gspo_loss": float(p["seq"].sum() * w), "gspo_sequence_loss": p["seq"],
              "clipfrac": 1.0, "approx_kl": float(np.where(active, p["k3_old"], 0.0).sum() / n_tok),
              "gspo_ratio_mean": float(p["ratio"].sum() / max(has.sum(), 1)), "gspo_ratio_min": r_ext,
              "gspo_ratio_max": r_ext}
    names = {"gspo_ratio_mean": "ratio_mean", "gspo_ratio_min": "ratio_min", "gspo_ratio_max": "ratio_max"}
    out = {k: _rtol(np.atleast_1d(t._np(ours[names.get(k, k)])), np.atleast_1d(ref[names.get(k, k)]), sc)
           for k, sc in scales.items()}
    up = (np.abs(1.3 * w * has) + np.abs(g_rows))[:, None]
    out["gspo_grad"] = _row_rtol(t._np(ours["d_logp"]), ref["d_logp"], up * p["d_logp"])
    if ours["d_entropy"] is not None:
        out["gspo_grad"] = max(out["gspo_grad"], _row_rtol(t._np(ours["d_entropy"]), ref["d_entropy"],
                                                           up * p["d_entropy"]))
    return out


def gspo_sweep(big, device, record):
    from rlk_triton.testing.rl_ops import GSPO_FEATURES, gspo_inputs

    n = 0
    gsizes = [(1, 1), (4, 7), (5, 40), (3, 300), (8, 1500)] + ([(64, 8192)] if big else [])
    for si, (B, T) in enumerate(gsizes):
        for fi, (feature, feat) in enumerate(GSPO_FEATURES.items()):
            for clip in ("paper", "ppo"):
                for spread in (1e-4, 1e-2, 1.0):
                    for normalizer in (None, 8.0):
                        seed = 10000 + 1000 * si + 100 * fi + 10 * (clip == "ppo") + 3 * (spread > 1e-3) + (normalizer is None)
                        x = gspo_inputs(B, T, seed, device, spread, empty_rows=(1,) if B > 2 else ())
                        spec = {"clip": clip, "normalizer": normalizer, **feat}
                        record(f"[{B}x{T}] gspo/{feature}/{clip}/spread={spread}/norm={normalizer}",
                               measure_gspo(x, spec))
                        n += 1
    return n


def policy_specs():
    features = {"plain": {}, **t.FEATURES}
    for loss_type in t.LOSS_TYPES:
        for aggregation in t.AGGREGATIONS:
            for name, feat in features.items():
                spec = {"loss_type": loss_type, "aggregation": aggregation,
                        "normalizer": t._norm_for(aggregation), **feat}
                if loss_type == "cispo" and spec.get("dual_clip_c"):
                    spec["dual_clip_c"] = None
                if loss_type == "dapo":
                    spec.setdefault("eps_high", t.EPS_HIGH)
                yield f"{loss_type}/{aggregation}/{name}", spec


def sizes(big):
    out = [(1, 1), (2, 5), (5, 40), (8, 300), (3, 1000)]
    return out + [(64, 8192)] if big else out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--big", action="store_true", help="also [64 x 8192]")
    ap.add_argument("--ops", choices=("all", "policy", "gspo"), default="all",
                    help="policy: policy_loss and ratio_kl; gspo: gspo_loss")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    worst, where, n_cases = {}, {}, 0
    start = time.time()

    def record(label, m):
        for k, v in m.items():
            if v > worst.get(k, -1.0):
                worst[k], where[k] = v, label

    if args.ops in ("all", "gspo"):
        n_cases += gspo_sweep(args.big, device, record)
    for si, (B, T) in enumerate(sizes(args.big) if args.ops != "gspo" else ()):
        for ci, (label, spec) in enumerate(policy_specs()):
            if (B * T > 2000 or B * T < 10) and ci % 7:  # a seventh of the specs at the extreme sizes
                continue
            for same_sign in (False, True):  # same-sign advantages: sums without cancellation
                inputs = t.make_inputs(B, T, seed=1000 * si + ci, empty_rows=(0,) if B > 2 else (),
                                       adv_per_seq=(ci + si) % 3 == 0, device=device)
                if same_sign:
                    inputs["advantages"] = inputs["advantages"].abs()
                record(f"[{B}x{T}] {label}{' A>0' if same_sign else ''}", measure_policy(inputs, spec))
                n_cases += 1
        for est in ("k1", "k2", "k3"):
            for clamp in (None, t.CLAMP):
                for with_ref, use_mask in ((True, True), (False, True), (True, False)):
                    inputs = t.make_inputs(B, T, seed=77 + si, device=device)
                    record(f"[{B}x{T}] ratio_kl/{est}/clamp={clamp}/ref={with_ref}/mask={use_mask}",
                           measure_ratio_kl(inputs, est, clamp, with_ref, use_mask))
                    n_cases += 1
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "interpreter",
              "torch": torch.__version__, "cases": n_cases, "seconds": round(time.time() - start, 1),
              "worst": worst, "where": where}
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
