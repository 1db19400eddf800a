"""rlk_triton.losses: parity with the float64 references judged by contracts/rl_losses.yaml, bitwise
batch invariance, empty and fully masked inputs, typed errors, torch.compile; for both backends
("triton", "torch_reference") where the test is about the contract.

The helpers (make_inputs, the error scales and sensitivities, judge_*, the row ops) live in
rlk_triton/testing/rl_ops.py, whose docstring defines the scales: rlk-triton check, the registry's
probes and scripts/measure_rl_losses.py use the same definitions.
"""
import numpy as np
import pytest
import torch

from rlk_triton import contracts, errors
from rlk_triton._runtime import arch_of
from rlk_triton.losses import AGGREGATIONS, BACKENDS, LOSS_TYPES, policy_loss, ratio_kl
from rlk_triton.reference.losses import (policy_loss_grad_reference, policy_loss_reference, ratio_kl_grad_reference,
                                         ratio_kl_reference)
from rlk_triton.testing import assert_batch_invariant
from rlk_triton.testing.float64_checks import assert_central_differences
from rlk_triton.testing.rl_ops import (CLAMP, DUAL_C, EPS_HIGH, EPS_LOW, FEATURES, NORMALIZER, OP, TIS_CAP,  # noqa: F401
                                       _norm_for, _np, assert_unused_outputs_are_zeros, judge_policy, judge_ratio_kl,
                                       make_inputs, policy_forward_scales, policy_grad_sensitivity, policy_kwargs,
                                       policy_row_op, ratio_kl_grad_sensitivity, ratio_kl_row_op, ratio_kl_scales,
                                       run_policy)


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Both backends meet the same contract rows: the tests that take this fixture run for each."""
    return request.param


def _assert_within(ratios, label):
    assert all(r <= 1.0 for r in ratios.values()), f"{label}: error / contract bound {ratios}"


# ---- parity ----

@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("kl", (False, True))
def test_policy_loss_within_contract(loss_type, aggregation, kl, device, backend):
    inputs = make_inputs(5, 40, seed=LOSS_TYPES.index(loss_type) * 10 + len(aggregation), empty_rows=(2,),
                         device=device)
    spec = {"loss_type": loss_type, "aggregation": aggregation, "normalizer": _norm_for(aggregation),
            "eps_high": EPS_HIGH if loss_type == "dapo" else None, "kl_coef": 0.1 if kl else 0.0}
    _assert_within(judge_policy(inputs, spec, device, backend=backend), spec)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_policy_loss_features_within_contract(feature, aggregation, device, backend):
    inputs = make_inputs(4, 33, seed=len(feature) + 100 * len(aggregation), empty_rows=(1,), device=device)
    loss_type = "cispo" if feature == "entropy" else "ppo"
    spec = {"loss_type": loss_type, "aggregation": aggregation, "normalizer": _norm_for(aggregation),
            **FEATURES[feature]}
    ratios = judge_policy(inputs, spec, device, backend=backend)
    _assert_within(ratios, spec)
    assert ("d_entropy" in ratios) == ("entropy_coef" in spec)


@pytest.mark.parametrize("case", ("per_seq_advantages", "multi_tile", "scalar_grad_only", "cispo_everything"))
def test_policy_loss_variants_within_contract(case, device, backend):
    B, T = (3, 600) if case == "multi_tile" else (4, 33)
    inputs = make_inputs(B, T, seed=7, adv_per_seq=case == "per_seq_advantages", empty_rows=(1,), device=device)
    spec = {"loss_type": "grpo", "aggregation": "seq-mean-token-mean", **FEATURES["everything"]}
    if case == "cispo_everything":
        spec.update(loss_type="cispo", dual_clip_c=None, tis_mode="mask")
    seed = None if case == "scalar_grad_only" else 3
    _assert_within(judge_policy(inputs, spec, device, token_grad_seed=seed, backend=backend), case)


@pytest.mark.parametrize("normalizer", (57, 57.0), ids=("int64", "float64"))
def test_normalizer_tensor_equals_the_number(normalizer, device, backend):
    """A device tensor (read on the device, no host sync) and the Python number give the same bits."""
    inputs = make_inputs(3, 20, seed=13, device=device)
    spec = {"aggregation": "token-mean", **FEATURES["everything"]}
    a = run_policy(inputs, dict(spec, normalizer=57.0), token_grad_seed=None, backend=backend)[0]
    b = run_policy(inputs, dict(spec, normalizer=torch.tensor(normalizer, device=device)), token_grad_seed=None,
                   backend=backend)[0]
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


@pytest.mark.parametrize("estimator", ("k1", "k2", "k3"))
@pytest.mark.parametrize("clamp", (None, CLAMP))
@pytest.mark.parametrize("with_ref,use_mask", ((True, True), (False, True), (True, False)))
def test_ratio_kl_within_contract(estimator, clamp, with_ref, use_mask, device, backend):
    inputs = make_inputs(4, 45, seed=len(estimator) + (clamp is None), empty_rows=(3,), device=device)
    _assert_within(judge_ratio_kl(inputs, device, with_ref=with_ref, use_mask=use_mask, estimator=estimator,
                                  clamp=clamp, backend=backend), (estimator, clamp, with_ref, use_mask))


def test_ratio_kl_masked_and_clamped_tokens(device, backend):
    inputs = make_inputs(3, 20, seed=5, device=device)
    args = (inputs["old_logp"], inputs["ref_logp"])
    logp = inputs["logp"].clone().requires_grad_(True)
    lr, r, kl = ratio_kl(logp, *args, mask=inputs["mask"], log_ratio_clamp=CLAMP, backend=backend)
    (lr + r + kl).sum().backward()
    off = ~inputs["mask"]
    assert (lr[off] == 0).all() and (r[off] == 0).all() and (kl[off] == 0).all() and (logp.grad[off] == 0).all()
    assert lr.abs().max() <= CLAMP
    clamped = inputs["mask"] & ((inputs["logp"] - inputs["old_logp"]).abs() > CLAMP)
    assert clamped.any()
    # beyond the clamp log_ratio and ratio pass no gradient: only kl's is left, bit for bit
    logp_kl = inputs["logp"].clone().requires_grad_(True)
    ratio_kl(logp_kl, *args, mask=inputs["mask"], log_ratio_clamp=CLAMP, backend=backend)[2].sum().backward()
    assert torch.equal(logp.grad[clamped], logp_kl.grad[clamped])


def test_ratio_kl_unused_outputs_get_no_zero_tensors(device, monkeypatch):
    """An output left out of the loss reaches the backward as None (no [B, T] of zeros materialized) and
    the kernel takes it as a zero tile: the bits of an explicit zero gradient."""
    from rlk_triton.ops import rl_losses as ops

    got_none, launch = [], ops.launch_ratio_kl_backward

    def spy(g_lr, g_ratio, g_kl, *rest):
        got_none.append((g_lr is None, g_ratio is None, g_kl is None))
        return launch(g_lr, g_ratio, g_kl, *rest)
    monkeypatch.setattr(ops, "launch_ratio_kl_backward", spy)
    inputs = make_inputs(3, 300, seed=9, device=device)
    args = (inputs["old_logp"], inputs["ref_logp"])
    assert_unused_outputs_are_zeros(lambda logp: ratio_kl(logp, *args, mask=inputs["mask"], kl_estimator="k3"),
                                    inputs["logp"], 3)
    assert got_none[0::2] == [tuple(i != used for i in range(3)) for used in range(3)], got_none


# ---- the references' gradients, by finite differences in float64 ----

def _fd_check(f, x, analytic):
    """|f'''| < 100 for these inputs (ratios < e^2, |A| < 5, weights <= 1)."""
    assert_central_differences(f, x, analytic, third_derivative=100.0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("loss_type", ("ppo", "cispo"))
def test_reference_gradients_by_finite_differences(loss_type, aggregation):
    inputs = make_inputs(3, 8, seed=11, empty_rows=(1,))
    spec = {"loss_type": loss_type, "aggregation": aggregation, "normalizer": _norm_for(aggregation),
            **FEATURES["everything"]}
    if loss_type == "cispo":
        spec["dual_clip_c"] = None
    _, kw = policy_kwargs(inputs, spec)
    x = {k: _np(v) for k, v in inputs.items() if k != "mask"}
    mask = inputs["mask"].numpy()
    g_tok = np.random.default_rng(0).standard_normal(mask.shape)

    def objective(logp=None, entropy=None):
        k = dict(kw, entropy=kw["entropy"] if entropy is None else entropy)
        old = x["old_logp"]
        if logp is not None and loss_type == "cispo":
            # cispo's stop-gradient on the clipped ratio: move old and rollout logp along with logp, which
            # holds the ratio (and the TIS weight) fixed while logp's own factor changes
            old = old + (logp - x["logp"])
            k["rollout_logp"] = kw["rollout_logp"] + (logp - x["logp"])
        loss, tok, _ = policy_loss_reference(x["logp"] if logp is None else logp, old, x["advantages"], mask, **k)
        return 0.7 * loss + (g_tok * tok).sum()

    d_logp, d_ent = policy_loss_grad_reference(x["logp"], x["old_logp"], x["advantages"], mask, 0.7, g_tok, **kw)
    _fd_check(lambda v: objective(logp=v), x["logp"], d_logp)
    _fd_check(lambda v: objective(entropy=v), x["entropy"], d_ent)


@pytest.mark.parametrize("estimator", ("k1", "k2", "k3"))
def test_ratio_kl_reference_gradient_by_finite_differences(estimator):
    inputs = make_inputs(3, 8, seed=12)
    x = {k: _np(v) for k, v in inputs.items() if k != "mask"}
    mask = inputs["mask"].numpy()
    g = np.random.default_rng(1).standard_normal((3,) + mask.shape)

    def objective(logp):
        lr, r, kl = ratio_kl_reference(logp, x["old_logp"], x["ref_logp"], mask, estimator, CLAMP)
        return (g[0] * lr + g[1] * r + g[2] * kl).sum()

    analytic = ratio_kl_grad_reference(x["logp"], x["old_logp"], x["ref_logp"], mask, g[0], g[1], g[2], estimator,
                                       CLAMP)
    _fd_check(objective, x["logp"], analytic)


# ---- empty sequences, fully masked batches ----

@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("normalizer", (None, 64.0))
def test_fully_masked_batch_gives_zero_loss_and_no_nan(aggregation, normalizer, device, backend):
    if aggregation == "seq-mean-token-sum-norm" and normalizer is None:
        normalizer = 64.0
    inputs = make_inputs(3, 17, seed=4, p_active=0.0, device=device)
    inputs["logp"][0, :3] = float("-inf")  # padding may hold anything: it must not leak
    inputs["old_logp"][1, :3] = float("nan")
    logp = inputs["logp"].clone().requires_grad_(True)
    ent = inputs["entropy"].clone().requires_grad_(True)
    loss, tok, diag = policy_loss(logp, inputs["old_logp"], inputs["advantages"], mask=inputs["mask"],
                                  aggregation=aggregation, normalizer=normalizer, ref_logp=inputs["ref_logp"],
                                  kl_coef=0.1, entropy=ent, entropy_coef=0.01, rollout_logp=inputs["rollout_logp"],
                                  tis_cap=TIS_CAP, backend=backend)
    (loss + tok.sum()).backward()
    assert loss.item() == 0.0 and torch.count_nonzero(tok) == 0
    assert all(v.item() == 0.0 for v in diag.values())
    assert torch.count_nonzero(logp.grad) == 0 and torch.count_nonzero(ent.grad) == 0


@pytest.mark.parametrize("shape", ((0, 5), (3, 0)))
def test_empty_shapes(shape, device, backend):
    x = torch.zeros(shape, device=device, requires_grad=True)
    mask = torch.ones(shape, dtype=torch.bool, device=device)
    loss, tok, diag = policy_loss(x, x.detach(), x.detach(), mask=mask, aggregation="seq-mean-token-mean",
                                  backend=backend)
    loss.backward()
    assert loss.item() == 0.0 and tok.shape == shape and x.grad.shape == shape
    assert all(v.item() == 0.0 for v in diag.values())
    lr, r, kl = ratio_kl(x, x.detach(), x.detach(), backend=backend)
    assert lr.shape == r.shape == kl.shape == shape


@pytest.mark.parametrize("aggregation", ("seq-mean-token-sum", "seq-mean-token-mean", "token-mean"))
def test_empty_sequences_do_not_count(aggregation, device, backend):
    """The loss of a batch with empty rows is the loss of its other rows (judged by the contract)."""
    inputs = make_inputs(4, 12, seed=9, empty_rows=(0, 2), device=device)
    loss, tok, _ = policy_loss(inputs["logp"], inputs["old_logp"], inputs["advantages"], mask=inputs["mask"],
                               aggregation=aggregation, backend=backend)
    assert (tok[[0, 2]] == 0).all()
    keep = {k: v[[1, 3]] for k, v in inputs.items()}
    ours, ref, (x, kw, terms, weights, _, _) = run_policy(keep, {"aggregation": aggregation}, backend=backend)
    bound = contracts.judgment(OP, torch.float32, "forward_accuracy", arch_of(torch.device(device)))["outputs"]
    scale = policy_forward_scales(x, kw, terms, weights)["loss"]
    assert contracts.scaled_abs_ratio(_np(loss), ref["loss"], scale, bound["loss"]) <= 1.0


def test_tis_mask_drops_tokens_like_the_mask(device, backend):
    inputs = make_inputs(3, 40, seed=6, device=device)
    w = torch.exp(inputs["old_logp"] - inputs["rollout_logp"])
    args = (inputs["logp"], inputs["old_logp"], inputs["advantages"])
    a = policy_loss(*args, mask=inputs["mask"], rollout_logp=inputs["rollout_logp"], tis_cap=TIS_CAP,
                    tis_mode="mask", aggregation="seq-mean-token-mean", backend=backend)
    b = policy_loss(*args, mask=inputs["mask"] & (w <= TIS_CAP), aggregation="seq-mean-token-mean", backend=backend)
    assert ((w > TIS_CAP) & inputs["mask"]).any()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(torch.equal(a[2][k], b[2][k]) for k in a[2])


def test_float_and_int_masks_equal_bool(device, backend):
    inputs = make_inputs(3, 20, seed=8, device=device)
    args = (inputs["logp"], inputs["old_logp"], inputs["advantages"])
    base = policy_loss(*args, mask=inputs["mask"], backend=backend)
    for m in (inputs["mask"].float(), inputs["mask"].to(torch.int64)):
        other = policy_loss(*args, mask=m, backend=backend)
        assert torch.equal(base[0], other[0]) and torch.equal(base[1], other[1])


# ---- bitwise batch invariance ----

@pytest.mark.parametrize("adv_per_seq", (False, True))
def test_policy_loss_per_token_batch_invariant(adv_per_seq, device, backend):
    assert_batch_invariant(policy_row_op(30, device, adv_per_seq=adv_per_seq, backend=backend), probe_rows=2,
                           batch_sizes=(3, 7))


def test_ratio_kl_batch_invariant(device, backend):
    assert_batch_invariant(ratio_kl_row_op(30, device, backend=backend), probe_rows=2, batch_sizes=(3, 7))


def _probe_grads(inputs, positions, spec, backend="triton"):
    """d logp (and d entropy) of the rows at `positions` from loss.backward() alone."""
    kw, _ = policy_kwargs(inputs, spec)
    logp = inputs["logp"].clone().requires_grad_(True)
    kw["entropy"] = kw["entropy"].clone().requires_grad_(True)
    loss, _, _ = policy_loss(logp, inputs["old_logp"], inputs["advantages"], mask=inputs["mask"], backend=backend,
                             **kw)
    loss.backward()
    return logp.grad[positions], kw["entropy"].grad[positions]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_scalar_loss_gradient_batch_invariant_with_a_normalizer(aggregation, device, backend):
    """With the normalizer given, d loss / d logp of a row depends on that row alone, for every aggregation."""
    spec = {"aggregation": aggregation, "normalizer": NORMALIZER, **FEATURES["everything"]}
    probe = make_inputs(2, 30, seed=21, device=device)
    base = _probe_grads(probe, torch.arange(2), spec, backend)
    for n, seed, where in ((5, 1, (0, 1)), (9, 2, (3, 8)), (9, 3, (8, 0)), (4, 4, (2, 3))):
        batch = make_inputs(n, 30, seed=seed, device=device)
        pos = torch.tensor(where)
        for k in batch:
            batch[k][pos] = probe[k]
        got = _probe_grads(batch, pos, spec, backend)
        assert torch.equal(got[0], base[0]) and torch.equal(got[1], base[1]), (n, where)


def test_padding_tokens_and_empty_rows_change_nothing(device, backend):
    """Padding T with masked tokens (across a tile edge) and appending empty rows give the same bits,
    scalar loss and diagnostics included: every block size is fixed, and padding adds exact zeros."""
    spec = {"aggregation": "seq-mean-token-mean", **FEATURES["everything"]}
    x = make_inputs(3, 40, seed=31, device=device)
    wide = make_inputs(5, 300, seed=32, p_active=0.0, device=device)
    for k in x:
        wide[k][:3, :40] = x[k]
    a = run_policy(x, spec, token_grad_seed=None, backend=backend)[0]
    b = run_policy(wide, spec, token_grad_seed=None, backend=backend)[0]
    assert torch.equal(a["loss"], b["loss"])
    for name in ("clipfrac", "approx_kl", "ratio_mean", "ratio_min", "ratio_max"):
        assert torch.equal(a[name], b[name]), name
    for name in ("per_token_loss", "d_logp", "d_entropy"):
        assert torch.equal(a[name], b[name][:3, :40]) and torch.count_nonzero(b[name][3:]) == 0, name


# ---- errors ----

def _valid(device):
    x = make_inputs(2, 6, seed=0, device=device)
    return x, (x["logp"], x["old_logp"], x["advantages"])


@pytest.mark.parametrize("change,error,argument", [
    (lambda a, k, x: a.__setitem__(0, a[0].double()), errors.DTypeError, "logp"),
    (lambda a, k, x: a.__setitem__(0, a[0].to(torch.bfloat16)), errors.DTypeError, "logp"),
    (lambda a, k, x: a.__setitem__(0, a[0][0]), errors.ShapeError, "logp"),
    (lambda a, k, x: a.__setitem__(1, a[1].to(torch.int64)), errors.DTypeError, "old_logp"),
    (lambda a, k, x: a.__setitem__(1, a[1][:, :3]), errors.ShapeError, "old_logp"),
    (lambda a, k, x: a.__setitem__(2, a[2][:, :3]), errors.ShapeError, "advantages"),
    (lambda a, k, x: a.__setitem__(2, a[2].half()), errors.DTypeError, "advantages"),
    (lambda a, k, x: k.update(mask=x["mask"][:1]), errors.ShapeError, "mask"),
    (lambda a, k, x: k.update(mask=[[1]]), errors.DTypeError, "mask"),
    (lambda a, k, x: k.update(loss_type="trpo"), errors.InputError, "loss_type"),
    (lambda a, k, x: k.update(aggregation="mean"), errors.InputError, "aggregation"),
    (lambda a, k, x: k.update(ref_logp=x["ref_logp"], kl_coef=0.1, kl_estimator="k4"), errors.InputError,
     "kl_estimator"),
    (lambda a, k, x: k.update(kl_coef=0.1), errors.InputError, "ref_logp"),
    (lambda a, k, x: k.update(entropy_coef=0.1), errors.InputError, "entropy"),
    (lambda a, k, x: k.update(entropy=x["entropy"][:, :2], entropy_coef=0.1), errors.ShapeError, "entropy"),
    (lambda a, k, x: k.update(eps_low=-0.1), errors.InputError, "eps_low"),
    (lambda a, k, x: k.update(eps_low=float("nan")), errors.InputError, "eps_low"),
    (lambda a, k, x: k.update(eps_high=-1.0), errors.InputError, "eps_high"),
    (lambda a, k, x: k.update(eps_low="0.2"), errors.InputError, "eps_low"),
    (lambda a, k, x: k.update(dual_clip_c=0.9), errors.InputError, "dual_clip_c"),
    (lambda a, k, x: k.update(aggregation="seq-mean-token-sum-norm"), errors.InputError, "normalizer"),
    (lambda a, k, x: k.update(normalizer=0.0), errors.InputError, "normalizer"),
    (lambda a, k, x: k.update(normalizer=torch.ones(2)), errors.ShapeError, "normalizer"),
    (lambda a, k, x: k.update(rollout_logp=x["rollout_logp"], tis_cap=0.0), errors.InputError, "tis_cap"),
    (lambda a, k, x: k.update(rollout_logp=x["rollout_logp"], tis_cap=-1.0), errors.InputError, "tis_cap"),
    (lambda a, k, x: k.update(rollout_logp=x["rollout_logp"]), errors.InputError, "tis_cap"),
    (lambda a, k, x: k.update(tis_cap=2.0), errors.InputError, "rollout_logp"),
    (lambda a, k, x: k.update(rollout_logp=x["rollout_logp"], tis_cap=2.0, tis_mode="clip"), errors.InputError,
     "tis_mode"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_policy_loss_typed_errors(change, error, argument, device):
    x, args = _valid(device)
    args, kw = list(args), {"mask": x["mask"]}
    policy_loss(*args, **kw)  # the valid call works
    change(args, kw, x)
    with pytest.raises(error) as e:
        policy_loss(*args, **kw)
    assert e.value.argument == argument


@pytest.mark.parametrize("kw,error,argument", [
    ({"kl_estimator": "k0"}, errors.InputError, "kl_estimator"),
    ({"log_ratio_clamp": 0.0}, errors.InputError, "log_ratio_clamp"),
    ({"mask": torch.ones(3, 6)}, errors.ShapeError, "mask"),
])
def test_ratio_kl_typed_errors(kw, error, argument, device):
    x, _ = _valid(device)
    kw = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in kw.items()}
    with pytest.raises(error) as e:
        ratio_kl(x["logp"], x["old_logp"], x["ref_logp"], **kw)
    assert e.value.argument == argument
    with pytest.raises(errors.ShapeError) as e:
        ratio_kl(x["logp"], x["old_logp"], x["ref_logp"][:1])
    assert e.value.argument == "ref_logp"


def test_device_errors(device):
    x, args = _valid(device)
    if device == "cuda":
        with pytest.raises(errors.DeviceError) as e:
            policy_loss(args[0], args[1].cpu(), args[2], mask=x["mask"])
        assert e.value.argument == "old_logp"
        with pytest.raises(errors.DeviceError) as e:
            policy_loss(*args, mask=x["mask"], normalizer=torch.tensor(3.0))
        assert e.value.argument == "normalizer"
    with pytest.raises(errors.DeviceError) as e:
        policy_loss(*args, mask=x["mask"].to("meta"))
    assert e.value.argument == "mask"
    with pytest.raises(errors.DeviceError) as e:
        ratio_kl(args[0].to("meta"), args[1].to("meta"))
    assert e.value.argument == "logp"


def test_cpu_tensors_without_the_interpreter_raise(monkeypatch):
    import rlk_triton.losses as losses

    monkeypatch.setattr(losses, "_INTERPRETED", False)
    x = torch.zeros(2, 3)
    with pytest.raises(errors.DeviceError) as e:
        losses.policy_loss(x, x, x, mask=x)
    assert e.value.argument == "logp" and "TRITON_INTERPRET" in str(e.value)


# ---- torch.compile ----

def test_under_torch_compile(device):
    inputs = make_inputs(3, 24, seed=41, device=device)
    spec = {"loss_type": "dapo", "aggregation": "seq-mean-token-mean", "eps_high": EPS_HIGH,
            **FEATURES["everything"]}
    kw, _ = policy_kwargs(inputs, spec)

    def f(logp, ent):
        loss, tok, diag = policy_loss(logp, inputs["old_logp"], inputs["advantages"], mask=inputs["mask"],
                                      **dict(kw, entropy=ent))
        lr, r, kl = ratio_kl(logp, inputs["old_logp"], inputs["ref_logp"], mask=inputs["mask"], log_ratio_clamp=CLAMP)
        return loss + 0.1 * tok.sum() + (r * kl).sum() + diag["clipfrac"]

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    la, ea = inputs["logp"].clone().requires_grad_(True), inputs["entropy"].clone().requires_grad_(True)
    lb, eb = inputs["logp"].clone().requires_grad_(True), inputs["entropy"].clone().requires_grad_(True)
    ya, yb = f(la, ea), compiled(lb, eb)
    ya.backward()
    yb.backward()
    assert torch.equal(ya, yb) and torch.equal(la.grad, lb.grad) and torch.equal(ea.grad, eb.grad)


# ---- heavier under the interpreter ----

@pytest.mark.slow
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_policy_loss_within_contract_long_rows(aggregation, device):
    inputs = make_inputs(16, 2000, seed=61, empty_rows=(3,), adv_per_seq=aggregation == "token-mean", device=device)
    spec = {"loss_type": "dapo", "aggregation": aggregation, "normalizer": _norm_for(aggregation),
            **FEATURES["everything"]}
    _assert_within(judge_policy(inputs, spec, device), spec)


@pytest.mark.slow
def test_batch_invariant_long_rows(device):
    assert_batch_invariant(policy_row_op(1000, device), probe_rows=3, batch_sizes=(5, 17))
    assert_batch_invariant(ratio_kl_row_op(1000, device), probe_rows=3, batch_sizes=(5, 17))


# ---- on the GPU: the same checks at [64 x 8192] ----

@pytest.mark.gpu
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("loss_type", ("ppo", "cispo"))
def test_policy_loss_within_contract_gpu(loss_type, aggregation):
    inputs = make_inputs(64, 8192, seed=51, empty_rows=(5, 63), device="cuda")
    spec = {"loss_type": loss_type, "aggregation": aggregation, "normalizer": _norm_for(aggregation),
            **FEATURES["everything"]}
    if loss_type == "cispo":
        spec.update(dual_clip_c=None, tis_mode="mask")
    _assert_within(judge_policy(inputs, spec, "cuda"), spec)


@pytest.mark.gpu
@pytest.mark.parametrize("estimator", ("k1", "k2", "k3"))
def test_ratio_kl_within_contract_gpu(estimator):
    inputs = make_inputs(64, 8192, seed=52, empty_rows=(7,), device="cuda")
    _assert_within(judge_ratio_kl(inputs, "cuda", estimator=estimator, clamp=CLAMP), estimator)


@pytest.mark.gpu
def test_batch_invariant_gpu():
    assert_batch_invariant(policy_row_op(8192, "cuda"), probe_rows=4, batch_sizes=(5, 64))
    assert_batch_invariant(ratio_kl_row_op(8192, "cuda"), probe_rows=4, batch_sizes=(5, 64))
    spec = {"aggregation": "seq-mean-token-mean", "normalizer": NORMALIZER, **FEATURES["everything"]}
    probe = make_inputs(4, 8192, seed=53, device="cuda")
    base = _probe_grads(probe, torch.arange(4), spec)
    batch = make_inputs(64, 8192, seed=54, device="cuda")
    pos = torch.tensor([0, 17, 40, 63])
    for k in batch:
        batch[k][pos] = probe[k]
    got = _probe_grads(batch, pos, spec)
    assert torch.equal(got[0], base[0]) and torch.equal(got[1], base[1])


def _inductor_case(device):
    inputs = make_inputs(3, 24, seed=43, device=device)
    spec = {"loss_type": "dapo", "aggregation": "seq-mean-token-mean", "eps_high": EPS_HIGH,
            **FEATURES["everything"]}
    kw, _ = policy_kwargs(inputs, spec)

    def f(logp, ent):  # the ops' outputs only: inductor may fuse surrounding torch arithmetic differently
        loss, tok, diag = policy_loss(logp, inputs["old_logp"], inputs["advantages"], mask=inputs["mask"],
                                      **dict(kw, entropy=ent))
        lr, r, kl = ratio_kl(logp, inputs["old_logp"], inputs["ref_logp"], mask=inputs["mask"], log_ratio_clamp=CLAMP)
        return loss, tok, diag["clipfrac"], lr, r, kl

    return inputs, f


def _check_inductor(device):
    inputs, f = _inductor_case(device)
    compiled = torch.compile(f, backend="inductor", fullgraph=True)
    la, ea = inputs["logp"].clone().requires_grad_(True), inputs["entropy"].clone().requires_grad_(True)
    lb, eb = inputs["logp"].clone().requires_grad_(True), inputs["entropy"].clone().requires_grad_(True)
    outs_a, outs_b = f(la, ea), compiled(lb, eb)
    assert all(torch.equal(a, b) for a, b in zip(outs_a, outs_b))
    outs_a[0].backward()
    outs_b[0].backward()
    assert torch.equal(la.grad, lb.grad) and torch.equal(ea.grad, eb.grad)


@pytest.mark.slow
def test_under_inductor_cpu(device):
    _check_inductor(device)


@pytest.mark.gpu
def test_under_inductor_gpu():
    # Was an InductorError on the H200 with torch 2.11: inductor could not lower the bool -> uint8
    # view of the mask (reproduced on CPU with torch 2.11; losses._check_mask copies when compiling).
    _check_inductor("cuda")


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_split_rows_path_gives_the_row_kernel_bits(aggregation, device, monkeypatch):
    """policy_loss's (row, tile) programs plus the in-order fold add the same tile sums in the same
    order as one program per row: loss, per-token loss, diagnostics and d logp are the same bits."""
    from rlk_triton import configs

    arch = configs.table_arch(arch_of(torch.device(device)), "rl_policy_loss_split")
    key = ("rl_policy_loss_split", arch, "float32", "any")
    block_t = configs.lookup_fixed("rl_policy_loss_rows", arch_of(torch.device(device))).block_v
    B, T = 5, 3 * block_t + 17  # several tiles and a partial one
    gen = torch.Generator().manual_seed(9)
    old = -3 * torch.rand(B, T, generator=gen)
    logp = old + 0.1 * torch.randn(B, T, generator=gen)
    ref, roll = (old + 0.05 * torch.randn(B, T, generator=gen) for _ in range(2))
    adv = torch.randn(B, T, generator=gen)
    mask = torch.rand(B, T, generator=gen) < 0.8
    mask[3] = False  # an empty sequence
    runs = []
    for split in (0, 1):
        monkeypatch.setitem(configs.LOCKED_CONFIGS, key, configs.LaunchConfig(split, 1, 1))
        x = logp.to(device).requires_grad_()
        loss, per_token, diag = policy_loss(x, old.to(device), adv.to(device), mask=mask.to(device),
                                            aggregation=aggregation, normalizer=NORMALIZER
                                            if aggregation == "seq-mean-token-sum-norm" else None,
                                            dual_clip_c=3.0, ref_logp=ref.to(device), kl_coef=0.1,
                                            rollout_logp=roll.to(device), tis_cap=2.0)
        (loss + 0.5 * per_token.sum()).backward()
        runs.append((loss.detach(), per_token.detach(), torch.stack(list(diag.values())), x.grad))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_an_unused_per_token_loss_costs_no_zeros_in_the_backward(device, monkeypatch):
    """Only the loss gets a gradient: the backward receives no per-token gradient (None, so the kernel's
    HAS_TOKEN_GRAD branch is off) instead of a materialized [B, T] of zeros, and the gradient is the
    one a zero per-token gradient gives."""
    from rlk_triton.ops import rl_losses

    g = torch.Generator().manual_seed(11)
    logp, old, adv = (torch.randn(3, 40, generator=g).to(device) for _ in range(3))
    mask = torch.rand(3, 40, generator=g).to(device) > 0.2
    seen, real = [], rl_losses.call_policy_loss_bwd

    def spy(*args):
        seen.append(args[1])
        return real(*args)

    monkeypatch.setattr(rl_losses, "call_policy_loss_bwd", spy)
    x = logp.clone().requires_grad_()
    loss, per_token, _ = policy_loss(x, old, adv, mask=mask)
    (alone,) = torch.autograd.grad(loss, x)
    assert seen == [None]
    x = logp.clone().requires_grad_()
    loss, per_token, _ = policy_loss(x, old, adv, mask=mask)
    (with_zero,) = torch.autograd.grad((loss, per_token), x, (torch.ones((), device=device), torch.zeros_like(per_token)))
    assert seen[1] is not None and torch.equal(alone, with_zero)
