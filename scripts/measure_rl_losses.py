"""Measure the RL losses' error against float64 to set contracts/rl_losses.yaml.

For every output it prints the smallest bound the sweep needs (the contract takes it times a stated
margin):
  forward   rtol_needed = max err / scale                       (scaled_abs with atol = 0)
  gradient  row_rtol_needed = max (err - u |ref| - s) / sensitivity, u = 2^-24 (fp32 unit roundoff),
            s = 2^-149 (the smallest fp32 subnormal)
The scales, sensitivities, inputs and runners are rlk_triton/testing/rl_ops.py's (re-exported by
tests/test_rl_losses.py), so the contract and the tests share one definition. Run: python scripts/measure_rl_losses.py [--big] [--out F]
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
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    worst, where, n_cases = {}, {}, 0
    start = time.time()

    def record(label, m):
        for k, v in m.items():
            if v > worst.get(k, -1.0):
                worst[k], where[k] = v, label

    for si, (B, T) in enumerate(sizes(args.big)):
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
