"""GSPO (sequence-level clipped loss, with policy_loss's optional KL penalty, entropy bonus and
truncated importance sampling) against the float64 reference, judged by contracts/rl_losses.yaml;
the reference's gradients by finite differences; bitwise batch invariance; edge cases; typed errors.

The inputs, the error scales (gspo_sequence_loss, gspo_loss, gspo_ratio, the gradient sensitivities)
and the judge live in rlk_triton/testing/rl_ops.py (the comment above gspo_inputs), shared with the
registry's probe and scripts/measure_rl_losses.py.
"""
import numpy as np
import pytest
import torch

from rlk_triton import errors
from rlk_triton.losses import BACKENDS, gspo_loss
from rlk_triton.reference.losses import gspo_grad_reference, gspo_reference
from rlk_triton.testing import assert_batch_invariant
from rlk_triton.testing.float64_checks import assert_central_differences, product_roundings_bound
from rlk_triton.testing.rl_ops import (GSPO_FEATURES, NORMALIZER, TIS_CAP, _np, assert_unused_outputs_are_zeros,
                                       gspo_inputs, gspo_kwargs, gspo_row_op, judge_gspo, run_gspo)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def _assert_within(ratios, label):
    assert all(r <= 1.0 for r in ratios.values()), f"{label}: error / contract bound {ratios}"


# ---- parity ----

@pytest.mark.parametrize("B,T", ((1, 1), (4, 7), (3, 300), (5, 700)))
@pytest.mark.parametrize("spread", (1e-4, 1e-2, 1.0))
@pytest.mark.parametrize("normalizer", (None, 8.0))
def test_gspo_within_contract(B, T, spread, normalizer, device, backend):
    x = gspo_inputs(B, T, B * T, device, spread, empty_rows=(1,) if B > 2 else ())
    ratios = judge_gspo(x, {"normalizer": normalizer}, device, grad_rows_seed=None, backend=backend)
    _assert_within(ratios, (B, T, spread, normalizer))
    ours = run_gspo(x, {"normalizer": normalizer}, backend=backend)[0]
    assert torch.isfinite(ours["d_logp"]).all() and not ours["d_logp"][~x["mask"]].any()


@pytest.mark.parametrize("feature", sorted(GSPO_FEATURES))
@pytest.mark.parametrize("clip", ("paper", "ppo"))
def test_gspo_features_within_contract(feature, clip, device, backend):
    x = gspo_inputs(4, 33, len(feature) * 7 + len(clip), device, 1e-2 if clip == "paper" else 0.3, empty_rows=(2,))
    spec = {"clip": clip, "normalizer": 6.0 if clip == "ppo" else None, **GSPO_FEATURES[feature]}
    ratios = judge_gspo(x, spec, device, backend=backend)
    _assert_within(ratios, spec)
    assert ("d_entropy" in ratios) == ("entropy_coef" in spec)


def test_gspo_features_multi_tile(device, backend):
    x = gspo_inputs(3, 600, 5, device, 0.1)
    _assert_within(judge_gspo(x, {"clip": "ppo", **GSPO_FEATURES["everything"]}, device, backend=backend), "multi tile")
    _assert_within(judge_gspo(x, {"clip": "ppo", "tis_mode": "mask", "kl_coef": 0.1}, device, backend=backend), "mask")


# ---- the reference's gradients, by finite differences in float64 ----

def _fd_check(f, x, analytic):
    """|f'''| < 100 for these inputs, as in tests/test_rl_losses.py."""
    assert_central_differences(f, x, analytic, third_derivative=100.0)


@pytest.mark.parametrize("feature", ("plain", "kl_k1", "kl_k2", "kl_k3", "entropy", "tis_mask", "tis_truncate",
                                     "everything"))
@pytest.mark.parametrize("normalizer", (None, 7.0))
def test_reference_gradients_by_finite_differences(feature, normalizer):
    x = {k: (_np(v) if v.dtype != torch.bool else v.numpy()) for k, v in gspo_inputs(3, 6, 17, "cpu", 0.2).items()}
    mask = x.pop("mask")
    mask[1, :] = False  # an empty sequence
    spec = {"clip": "ppo", "normalizer": normalizer, **GSPO_FEATURES[feature]}
    _, kw = gspo_kwargs({k: torch.from_numpy(v) for k, v in x.items()}, spec)
    g_rows = np.array([0.4, -1.1, 0.8])
    # Truncated IS weighs each token's share of the sequence term by its own tis_t (the GSPO paper's
    # token form): that is the derivative with the sequence ratio held at its stop-gradient point.
    frozen = {"sg_logp": x["logp"]} if spec.get("tis_mode") == "truncate" else {}

    def objective(logp=None, entropy=None):
        k = dict(kw, **frozen)
        if entropy is not None:
            k["entropy"] = entropy
        loss, terms, _ = gspo_reference(x["logp"] if logp is None else logp, x["old_logp"], x["advantages"], mask, **k)
        return 0.7 * loss + (g_rows * terms).sum()

    d_logp, d_ent = gspo_grad_reference(x["logp"], x["old_logp"], x["advantages"], mask, 0.7, g_rows, **kw)
    _fd_check(lambda v: objective(logp=v), x["logp"], d_logp)
    if "entropy" in kw:
        _fd_check(lambda v: objective(entropy=v), x["entropy"], d_ent)
    else:
        assert not d_ent.any()


def test_truncation_weighs_each_tokens_gradient_by_its_own_weight():
    """With tis = 1 everywhere the token form is plain GSPO; with truncation, token t's gradient is
    tis_t times the untruncated one (the sequence term's value uses the mean weight)."""
    x = {k: (_np(v) if v.dtype != torch.bool else v.numpy()) for k, v in gspo_inputs(3, 9, 4, "cpu", 0.2).items()}
    mask = x.pop("mask")
    args = (x["logp"], x["old_logp"], x["advantages"], mask)
    plain = gspo_grad_reference(*args, 1.0, eps_low=0.2, eps_high=0.28)[0]
    inf_cap = gspo_grad_reference(*args, 1.0, eps_low=0.2, eps_high=0.28, rollout_logp=x["old_logp"], tis_cap=9.0)[0]
    assert np.array_equal(plain, inf_cap)
    trunc = gspo_grad_reference(*args, 1.0, eps_low=0.2, eps_high=0.28, rollout_logp=x["rollout_logp"], tis_cap=TIS_CAP)[0]
    tis = np.minimum(np.exp(x["old_logp"] - x["rollout_logp"]), TIS_CAP)  # the reference's own tis, bit for bit
    # Both are row weight * tis * dpg / n of the same float64 numbers, three roundings each: the
    # reference's tis * dpg, / n, * weight and here dpg / n, * weight, * tis.
    bound = product_roundings_bound(6)
    assert (np.abs(trunc - plain * tis) <= bound * np.abs(plain * tis)).all()


# ---- edge cases ----

def test_fully_masked_batch_gives_zero(device, backend):
    x = gspo_inputs(3, 9, 1, device)
    x["logp"][0, :3] = float("-inf")  # padding may hold anything: it must not leak
    x["old_logp"][1, :3] = float("nan")
    x["mask"][:] = False
    kw, _ = gspo_kwargs(x, {"clip": "ppo", **GSPO_FEATURES["everything"]})
    logp = x["logp"].clone().requires_grad_(True)
    kw["entropy"] = kw["entropy"].clone().requires_grad_(True)
    loss, seq, diag = gspo_loss(logp, x["old_logp"], x["advantages"], mask=x["mask"], backend=backend, **kw)
    (loss + seq.sum()).backward()
    assert float(loss.detach()) == 0.0 and not seq.any() and all(float(v) == 0.0 for v in diag.values())
    assert not logp.grad.any() and not kw["entropy"].grad.any()


def test_tis_mask_drops_tokens_like_the_mask(device, backend):
    x = gspo_inputs(4, 40, 6, device, 0.1)
    w = torch.exp(x["old_logp"] - x["rollout_logp"])
    dropped = x["mask"] & (w > TIS_CAP)
    assert dropped.any()
    args = (x["old_logp"], x["advantages"])
    kw = dict(eps_low=0.2, eps_high=0.28, ref_logp=x["ref_logp"], kl_coef=0.1, backend=backend)
    la, lb = x["logp"].clone().requires_grad_(True), x["logp"].clone().requires_grad_(True)
    a = gspo_loss(la, *args, mask=x["mask"], rollout_logp=x["rollout_logp"], tis_cap=TIS_CAP, tis_mode="mask", **kw)
    b = gspo_loss(lb, *args, mask=x["mask"] & (w <= TIS_CAP), **kw)
    (a[0] + a[1].sum()).backward()
    (b[0] + b[1].sum()).backward()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(la.grad, lb.grad)
    assert all(torch.equal(a[2][k], b[2][k]) for k in a[2])


def test_off_terms_change_nothing(device, backend):
    """kl_coef = 0 / entropy_coef = 0 with their tensors given is the plain loss, bit for bit."""
    x = gspo_inputs(3, 20, 8, device, 1e-2)
    args = (x["logp"], x["old_logp"], x["advantages"])
    base = gspo_loss(*args, mask=x["mask"], backend=backend)
    other = gspo_loss(*args, mask=x["mask"], ref_logp=x["ref_logp"], entropy=x["entropy"], backend=backend)
    assert torch.equal(base[0], other[0]) and torch.equal(base[1], other[1])


def test_diagnostics_are_policy_losss(device, backend):
    x = gspo_inputs(3, 20, 9, device, 0.3)
    _, _, diag = gspo_loss(x["logp"], x["old_logp"], x["advantages"], mask=x["mask"], eps_low=0.2, backend=backend)
    assert list(diag) == ["clipfrac", "approx_kl", "ratio_mean", "ratio_min", "ratio_max", "ppo_kl"]
    assert float(diag["approx_kl"]) > 0 and 0 < float(diag["clipfrac"]) <= 1


def test_unused_upstream_gradients_are_not_materialized(device, monkeypatch):
    """The loss alone, or the sequence terms alone, differentiated: the other upstream gradient reaches
    the backward as None (no zeros made and read) and the gradients are those of an explicit zero."""
    from rlk_triton.ops import gspo as ops

    got_none, launch = [], ops.call_gspo_loss_bwd

    def spy(g_loss, g_rows, *rest):
        got_none.append((g_loss is None, g_rows is None))
        return launch(g_loss, g_rows, *rest)
    monkeypatch.setattr(ops, "call_gspo_loss_bwd", spy)
    x = gspo_inputs(3, 40, 5, device, 0.1, empty_rows=(1,))
    kw = dict(gspo_kwargs(x, {"clip": "ppo", **GSPO_FEATURES["everything"]})[0], mask=x["mask"])
    assert_unused_outputs_are_zeros(lambda logp: gspo_loss(logp, x["old_logp"], x["advantages"], **kw), x["logp"], 2)
    assert got_none == [(False, True), (False, False), (True, False), (False, False)], got_none


# ---- bitwise batch invariance ----

def test_gspo_rows_are_batch_invariant(device, backend):
    """Every term on, a fixed normalizer: each sequence's term and its d logp / d entropy are its own."""
    assert_batch_invariant(gspo_row_op(30, device, backend=backend), probe_rows=2, batch_sizes=(3, 6))


def test_padding_tokens_and_empty_rows_change_nothing(device, backend):
    spec = {"clip": "ppo", **GSPO_FEATURES["everything"]}
    x = gspo_inputs(3, 40, 31, device, 0.1)
    wide = gspo_inputs(5, 300, 32, device, 0.1, p_active=0.0)
    for k in x:
        if k == "advantages":
            wide[k][:3] = x[k]
        else:
            wide[k][:3, :40] = x[k]
    a = run_gspo(x, spec, backend=backend)[0]
    b = run_gspo(wide, spec, backend=backend)[0]
    for name in ("gspo_loss", "clipfrac", "approx_kl", "ratio_mean", "ratio_min", "ratio_max"):
        assert torch.equal(a[name], b[name]), name
    assert torch.equal(a["gspo_sequence_loss"], b["gspo_sequence_loss"][:3])
    for name in ("d_logp", "d_entropy"):
        assert torch.equal(a[name], b[name][:3, :40]) and torch.count_nonzero(b[name][3:]) == 0, name


# ---- errors, torch.compile ----

@pytest.mark.parametrize("change,error,arg", [
    (dict(advantages="short"), errors.ShapeError, "advantages"),
    (dict(advantages="double"), errors.DTypeError, "advantages"),
    (dict(eps_low=2.0), errors.InputError, "eps_low"),
    (dict(normalizer=0.0), errors.InputError, "normalizer"),
    (dict(kl_coef=0.1), errors.InputError, "ref_logp"),
    (dict(ref_logp="ref", kl_coef=0.1, kl_estimator="k4"), errors.InputError, "kl_estimator"),
    (dict(ref_logp="short"), errors.ShapeError, "ref_logp"),
    (dict(entropy_coef=0.1), errors.InputError, "entropy"),
    (dict(entropy="short", entropy_coef=0.1), errors.ShapeError, "entropy"),
    (dict(rollout_logp="roll"), errors.InputError, "tis_cap"),
    (dict(rollout_logp="roll", tis_cap=0.0), errors.InputError, "tis_cap"),
    (dict(tis_cap=2.0), errors.InputError, "rollout_logp"),
    (dict(rollout_logp="roll", tis_cap=2.0, tis_mode="clip"), errors.InputError, "tis_mode"),
    (dict(kl_coef="0.1", ref_logp="ref"), errors.InputError, "kl_coef"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_typed_errors(change, error, arg, device):
    x = gspo_inputs(2, 5, 0, device)
    named = {"short": x["logp"][:, :3], "double": x["advantages"].double(), "ref": x["ref_logp"],
             "roll": x["rollout_logp"]}
    call = {k: named[v] if k in ("advantages", "ref_logp", "entropy", "rollout_logp") else v for k, v in change.items()}
    if change.get("advantages") == "short":
        call["advantages"] = x["advantages"][:1]
    adv = call.pop("advantages", x["advantages"])
    gspo_loss(x["logp"], x["old_logp"], x["advantages"], mask=x["mask"])  # the valid call works
    with pytest.raises(error) as e:
        gspo_loss(x["logp"], x["old_logp"], adv, mask=x["mask"], **call)
    assert e.value.argument == arg


def test_under_torch_compile(device):
    x = gspo_inputs(3, 24, 41, device, 0.1)
    kw, _ = gspo_kwargs(x, {"clip": "ppo", "normalizer": 5.0, **GSPO_FEATURES["everything"]})

    def f(logp, ent):
        loss, seq, diag = gspo_loss(logp, x["old_logp"], x["advantages"], mask=x["mask"], **dict(kw, entropy=ent))
        return loss + 0.1 * seq.sum() + diag["approx_kl"]

    compiled = torch.compile(f, backend="inductor" if device == "cuda" else "aot_eager", fullgraph=True)
    la, ea = x["logp"].clone().requires_grad_(True), x["entropy"].clone().requires_grad_(True)
    lb, eb = x["logp"].clone().requires_grad_(True), x["entropy"].clone().requires_grad_(True)
    ya, yb = f(la, ea), compiled(lb, eb)
    ya.backward()
    yb.backward()
    assert torch.equal(ya, yb) and torch.equal(la.grad, lb.grad) and torch.equal(ea.grad, eb.grad)


@pytest.mark.gpu
@pytest.mark.parametrize("feature", ("plain", "everything", "tis_mask"))
def test_gspo_at_scale_gpu(feature):
    x = gspo_inputs(64, 8192, 5, "cuda", 1e-2, empty_rows=(3,))
    _assert_within(judge_gspo(x, {"clip": "ppo", "normalizer": NORMALIZER, **GSPO_FEATURES[feature]}, "cuda"), feature)


@pytest.mark.parametrize("B,T", ((4, 300), (3, 0), (0, 5)))
def test_every_output_is_written(B, T, device, nan_filled_buffers):
    """The forward's buffers get no zero fill where its kernels run: with every new float buffer
    pre-filled with NaN, the outputs keep their bits; rows of no tokens and an empty
    batch still give zeros."""
    spec = {"clip": "ppo", **GSPO_FEATURES["everything"]}
    x = gspo_inputs(max(B, 1), max(T, 1), 41, device, 0.1)
    x = {k: (v[:B] if k == "advantages" else v[:B, :T]) for k, v in x.items()}
    ref = run_gspo(x, spec)[0]
    nan_filled_buffers()
    got = run_gspo(x, spec)[0]
    for name in ref:
        assert torch.equal(ref[name], got[name]), name
