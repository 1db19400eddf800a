"""backend= of the RL losses and advantages, the torch_reference backends' own properties, and
group_advantages' validate flag. (Contract parity of both backends: the backend-parametrized tests in
tests/test_rl_losses.py, tests/test_gspo.py and tests/test_advantages.py.)"""
import pytest
import torch

import rlk_triton.losses as losses
from rlk_triton import contracts, errors
from rlk_triton.advantages import gae, group_advantages, reinforce_pp_baseline
from rlk_triton.ops import rl_torch
from rlk_triton.testing.rl_ops import (FEATURES, gae_inputs, group_inputs, judge_group_advantages, make_inputs,
                                       policy_kwargs)


def _calls(device):
    """Each public RL function called with valid inputs, as f(backend) -> outputs."""
    x = make_inputs(3, 20, seed=1, device=device)
    r, v, m, boot = gae_inputs(3, 20, 2, device)
    s, gid, ok = group_inputs(12, 3, 3, device)
    tok_mask = torch.ones(12, 5, dtype=torch.bool, device=device)
    return {
        "ratio_kl": lambda b: losses.ratio_kl(x["logp"], x["old_logp"], x["ref_logp"], mask=x["mask"], backend=b),
        "policy_loss": lambda b: losses.policy_loss(x["logp"], x["old_logp"], x["advantages"], mask=x["mask"],
                                                    backend=b),
        "gspo_loss": lambda b: losses.gspo_loss(x["logp"], x["old_logp"], x["advantages"][:, 0], mask=x["mask"],
                                                backend=b),
        "gae": lambda b: gae(r, v, m, gamma=0.99, lam=0.95, bootstrap_values=boot, backend=b),
        "group_advantages": lambda b: group_advantages(s, gid, num_groups=3, valid=ok, backend=b),
        "reinforce_pp_baseline": lambda b: reinforce_pp_baseline(s, gid, tok_mask, num_groups=3, valid=ok, backend=b),
    }


CALLS = sorted(_calls("cpu"))


@pytest.mark.parametrize("fn", CALLS)
def test_unknown_backend_is_a_typed_error(fn, device):
    with pytest.raises(errors.BackendError) as e:
        _calls(device)[fn]("cuda_graphs")
    assert e.value.argument == "backend" and "torch_reference" in str(e.value)


def _flat(out):
    if isinstance(out, dict):
        return [t for v in out.values() for t in _flat(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _flat(v)]
    return [] if out is None else [out]


@pytest.mark.parametrize("fn", CALLS)
def test_torch_reference_outputs_are_fp32_on_the_inputs_device(fn, device):
    outs = _flat(_calls(device)[fn]("torch_reference"))
    assert outs and all(t.dtype == torch.float32 and t.device.type == device for t in outs)
    triton_outs = _flat(_calls(device)[fn]("triton"))
    assert [t.shape for t in outs] == [t.shape for t in triton_outs]


@pytest.mark.parametrize("fn", CALLS)
def test_torch_reference_runs_without_triton_on_cpu(fn, monkeypatch):
    """The reference backend needs no interpreter and no GPU; the Triton one says why it cannot run."""
    monkeypatch.setattr(losses, "_INTERPRETED", False)
    call = _calls("cpu")[fn]
    assert _flat(call("torch_reference"))
    with pytest.raises(errors.DeviceError) as e:
        call("triton")
    assert "TRITON_INTERPRET" in str(e.value)


def test_torch_reference_rejects_other_devices():
    x = torch.zeros(2, 3, device="meta")
    with pytest.raises(errors.DeviceError) as e:
        losses.ratio_kl(x, x, backend="torch_reference")
    assert e.value.argument == "logp"
    with pytest.raises(errors.DeviceError) as e:
        gae(x, x, gamma=1.0, lam=1.0, backend="torch_reference")
    assert e.value.argument == "rewards"


def test_torch_reference_gradients_are_fp32_and_only_where_the_triton_path_has_them(device):
    x = make_inputs(3, 20, seed=4, device=device)
    kw, _ = policy_kwargs(x, {"aggregation": "seq-mean-token-mean", **FEATURES["everything"]})
    grads = {}
    for b in ("triton", "torch_reference"):
        logp = x["logp"].clone().requires_grad_(True)
        ent = x["entropy"].clone().requires_grad_(True)
        old = x["old_logp"].clone().requires_grad_(True)  # a constant of the loss, even when it asks for grad
        loss, tok, _ = losses.policy_loss(logp, old, x["advantages"], mask=x["mask"], backend=b, **dict(kw, entropy=ent))
        (loss + tok.sum()).backward()
        grads[b] = (logp.grad, ent.grad, old.grad)
    for b, (g_logp, g_ent, g_old) in grads.items():
        assert g_logp.dtype == g_ent.dtype == torch.float32 and g_old is None, b
    for b in ("triton", "torch_reference"):
        logp, old = x["logp"].clone().requires_grad_(True), x["old_logp"].clone().requires_grad_(True)
        ref, adv = x["ref_logp"].clone().requires_grad_(True), x["advantages"][:, 0].clone().requires_grad_(True)
        sum(o.sum() for o in losses.ratio_kl(logp, old, ref, mask=x["mask"], backend=b)).backward()
        losses.gspo_loss(logp, old, adv, mask=x["mask"], backend=b)[0].backward()
        assert logp.grad is not None and old.grad is None and ref.grad is None and adv.grad is None, b
    # advantages are constants to autograd on both backends
    r, v, m, boot = gae_inputs(2, 7, 5, device)
    assert not any(t.requires_grad for t in gae(r.requires_grad_(True), v, m, gamma=1.0, lam=1.0,
                                                backend="torch_reference"))


def test_row_sums_depend_on_the_row_only():
    """The fixed-shape row reduction of rl_torch: bitwise the same for a row alone, among 37 other rows
    at any position, and with trailing zero padding across a tile edge."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(3, 700, generator=g, dtype=torch.float64) * torch.logspace(-8, 8, 700, dtype=torch.float64)
    base = rl_torch.row_sums(rows)
    for n, at in ((40, 0), (40, 17), (40, 37), (5, 2)):
        batch = torch.randn(n, 700, generator=g, dtype=torch.float64) * 1e6
        batch[at:at + 3] = rows
        assert torch.equal(rl_torch.row_sums(batch)[at:at + 3], base), (n, at)
    padded = torch.cat([rows, torch.zeros(3, 300, dtype=torch.float64)], 1)
    assert torch.equal(rl_torch.row_sums(padded), base)
    assert torch.equal(rl_torch.batch_sum(torch.cat([base, torch.zeros(20, dtype=torch.float64)])),
                       rl_torch.batch_sum(base))


# ---- group_advantages(validate=...) ----

class _HostSync(Exception):
    pass


@pytest.mark.parametrize("backend", ("triton", "torch_reference"))
def test_validate_false_skips_the_host_syncing_checks(backend, device, monkeypatch):
    s, gid, ok = group_inputs(16, 4, 6, device)
    valid = ok.float()  # a float mask: validate checks it is 0 / 1 on the host too
    expected = group_advantages(s, gid, num_groups=4, valid=valid, backend=backend)

    def no_sync(self):
        raise _HostSync()

    monkeypatch.setattr(torch.Tensor, "__bool__", no_sync)
    with pytest.raises(_HostSync):
        group_advantages(s, gid, num_groups=4, valid=valid, backend=backend)
    if backend == "triton":  # the torch reference still sizes its group matrix with one int() sync
        out = group_advantages(s, gid, num_groups=4, valid=valid, validate=False, backend=backend)
        tok = reinforce_pp_baseline(s, gid, torch.ones(16, 3, device=device), num_groups=4, valid=valid,
                                    token_mean=0.0, token_std=1.0, validate=False, backend=backend)
        monkeypatch.undo()
        assert torch.equal(out, expected) and tok.shape == (16, 3)


@pytest.mark.parametrize("backend", ("triton", "torch_reference"))
def test_validate_false_treats_out_of_range_ids_as_invalid_rows(backend, device):
    s, gid, ok = group_inputs(40, 5, 7, device)
    bad = gid.clone()
    bad[[3, 11, 30]] = torch.tensor([5, -1, 1000], device=device)
    with pytest.raises(errors.InputError) as e:
        group_advantages(s, bad, num_groups=5, valid=ok, backend=backend)
    assert e.value.argument == "group_ids"
    out = group_advantages(s, bad, num_groups=5, valid=ok, validate=False, backend=backend)
    dropped = ok.clone()
    dropped[[3, 11, 30]] = False
    assert torch.equal(out, group_advantages(s, gid, num_groups=5, valid=dropped, backend=backend))
    assert not out[[3, 11, 30]].any() and torch.isfinite(out).all()
    ratios = judge_group_advantages(s, gid, dropped, 5, "mean_std", device, backend)
    assert ratios["group_advantages"] <= 1.0
    # a float `valid` is not checked for 0 / 1 either: nonzero counts as valid
    fuzzy = ok.float() * 0.5
    assert torch.equal(group_advantages(s, gid, num_groups=5, valid=fuzzy, validate=False, backend=backend),
                       group_advantages(s, gid, num_groups=5, valid=ok, backend=backend))
    with pytest.raises(errors.DTypeError):
        group_advantages(s, gid, num_groups=5, valid=fuzzy, backend=backend)


def test_the_contract_judges_fp32_only():
    """The RL ops are float32-only: their contracts have no other row (the policy relies on it)."""
    for op in ("rl_losses", "advantages"):
        assert sorted(contracts.load(op)["dtypes"]) == ["float32"]
        with pytest.raises(errors.ContractError):
            contracts.contract_id(op, torch.bfloat16)
