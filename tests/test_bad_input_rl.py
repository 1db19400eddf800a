"""Bad input to the RL ops, the mode policy and the contract lookups: a typed error naming the
argument, or a documented value; index views give the contiguous copy's bits; a non-finite value
stays in the rows (groups) it came from."""
import math
import warnings

import numpy as np
import pytest
import torch

from rlk_triton import contracts, errors, policy, registry
from rlk_triton._runtime import arch_of
from rlk_triton.advantages import BACKENDS, gae, group_advantages, reinforce_pp_baseline
from rlk_triton.losses import gspo_loss, policy_loss, ratio_kl
from rlk_triton.ops import advantages as adv_ops
from rlk_triton.reference.advantages import group_advantages_reference
from rlk_triton.testing import parity  # noqa: F401 - imported before the fixture patches _runtime.arch_of

MODES = ("mean", "mean_std", "rloo")
NONFINITE = (float("nan"), float("inf"), float("-inf"))


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _bound(output, device):
    return contracts.judgment("advantages", torch.float32, "forward_accuracy",
                              arch_of(torch.device(device)))["outputs"][output]


def _rl(device, B=4, T=37, seed=0):
    g = _gen(seed)
    lp = -3 * torch.rand(B, T, generator=g)
    x = dict(logp=lp, old_logp=lp + 0.05 * torch.randn(B, T, generator=g),
             ref_logp=lp + 0.05 * torch.randn(B, T, generator=g), entropy=4 * torch.rand(B, T, generator=g),
             advantages=torch.randn(B, generator=g), mask=torch.rand(B, T, generator=g) < 0.8)
    x["rollout_logp"] = x["old_logp"] + 0.01 * torch.randn(B, T, generator=g)
    x["mask"][:, 0] = True  # every row has an active token to spoil
    return {k: v.to(device) for k, v in x.items()}


def _rpp_case(device, B=12, T=5, groups=4, seed=3):
    g = _gen(seed)
    return (torch.randn(B, generator=g).to(device), torch.randint(0, groups, (B,), generator=g).to(device),
            (torch.rand(B, T, generator=g) < 0.7).to(device))


# ---- 1. eps = 0, and groups whose scores are all equal ----

def _flat_groups(n_groups=48, seed=5):
    """Groups of 2..16 copies of one score: many have an fp32 sum that is not n x (x + x + x rounds)."""
    g = _gen(seed)
    sizes = torch.randint(2, 17, (n_groups,), generator=g)
    values = torch.randn(n_groups, generator=g) * 10.0 ** torch.randint(-3, 4, (n_groups,), generator=g).float()
    scores = torch.cat([values[i].repeat(int(sizes[i])) for i in range(n_groups)])
    gid = torch.cat([torch.full((int(sizes[i]),), i) for i in range(n_groups)])
    return scores, gid


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("eps", (0.0, 1e-6))
def test_group_whose_scores_are_all_equal_gets_zero(mode, eps, device, backend):
    scores, gid = _flat_groups()
    perm = torch.randperm(scores.numel(), generator=_gen(6))  # members interleaved across the batch
    out = group_advantages(scores[perm].to(device), gid[perm].to(device), num_groups=48, mode=mode, eps=eps,
                           backend=backend)
    assert torch.equal(out.cpu(), torch.zeros_like(out.cpu()))  # documented: 0, never NaN


@pytest.mark.parametrize("mode", MODES)
def test_eps_zero_with_spread_is_the_formula(mode, device, backend):
    """eps=0 next to a flat group: the flat group gets 0, the other one (s - mean) / std (float64 formula)."""
    s = torch.tensor([0.3, 0.3, 0.3, 1.0, -2.0, 0.5, 4.0], device=device)
    gid = torch.tensor([0, 0, 0, 1, 1, 1, 1], device=device)
    out = group_advantages(s, gid, num_groups=2, mode=mode, eps=0.0, backend=backend).cpu()
    assert torch.equal(out[:3], torch.zeros(3))
    ref, scale = group_advantages_reference(s[3:].cpu().numpy(), gid[3:].cpu().numpy(), None, mode, eps=0.0)
    assert np.isfinite(ref).all()
    assert contracts.scaled_abs_ratio(out[3:], ref, scale, _bound("group_advantages", device)) <= 1.0


def test_reinforce_pp_without_spread_and_eps_zero_gets_zero(device, backend):
    mask = torch.rand(8, 5, generator=_gen(1)) < 0.7
    s, gid = torch.full((8,), 0.1), torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    for kw in ({}, {"token_mean": 0.0, "token_std": 0.0}):
        out = reinforce_pp_baseline(s.to(device), gid.to(device), mask.to(device), num_groups=3, eps=0.0,
                                    backend=backend, **kw)
        assert torch.equal(out.cpu(), torch.zeros(8, 5)), kw


@pytest.mark.parametrize("fn", ("group_advantages", "reinforce_pp_baseline"))
@pytest.mark.parametrize("eps", (float("nan"), float("inf"), -1.0, "0", True, None))
def test_bad_eps_is_named(fn, eps, device):
    s, gid, mask = _rpp_case(device)
    with pytest.raises(errors.InputError) as e:
        if fn == "group_advantages":
            group_advantages(s, gid, num_groups=4, eps=eps)
        else:
            reinforce_pp_baseline(s, gid, mask, num_groups=4, eps=eps)
    assert e.value.argument == "eps"


# ---- 2. a tensor normalizer ----

def _policy_call(x, normalizer, backend, **kw):
    logp = x["logp"].clone().requires_grad_()
    loss, tok, _ = policy_loss(logp, x["old_logp"], x["advantages"], mask=x["mask"], aggregation="token-mean",
                               normalizer=normalizer, backend=backend, **kw)
    loss.backward()
    return loss.detach(), tok.detach(), logp.grad


@pytest.mark.parametrize("bad", (float("nan"), -5.0, float("inf"), float("-inf")))
def test_bad_normalizer_tensor_is_named(bad, device, backend):
    x = _rl(device)
    with pytest.raises(errors.InputError) as e:
        _policy_call(x, torch.tensor(bad, device=device), backend)
    assert e.value.argument == "normalizer"
    with pytest.raises(errors.InputError) as e:  # the float path too
        _policy_call(x, bad, backend)
    assert e.value.argument == "normalizer"


@pytest.mark.parametrize("bad", (float("nan"), -5.0, float("inf")))
def test_bad_normalizer_tensor_without_validation_poisons_the_loss(bad, device, backend):
    """validate=False: no sync, and the loss and d logp are NaN, never a finite sign-flipped loss."""
    x = _rl(device)
    loss, tok, grad = _policy_call(x, torch.tensor(bad, device=device), backend, validate=False)
    good_loss, good_tok, _ = _policy_call(x, torch.tensor(5.0, device=device), backend, validate=False)
    assert math.isnan(loss.item())
    assert torch.isnan(grad[x["mask"]]).all() and not grad[~x["mask"]].any()
    assert torch.equal(tok, good_tok)  # the per-token losses do not depend on the normalizer
    want = float(good_tok.double().sum()) / 5.0  # the documented sum(l) / normalizer, float64
    assert good_loss.item() == pytest.approx(want, rel=1e-6, abs=0)


def test_normalizer_tensor_zero_and_validate_flag(device, backend):
    x = _rl(device)
    loss, _, grad = _policy_call(x, torch.tensor(0.0, device=device), backend)
    assert loss.item() == 0.0 and not grad.any()  # documented: a zero denominator gives loss 0
    checked = _policy_call(x, torch.tensor(7, device=device), backend)
    unchecked = _policy_call(x, torch.tensor(7, device=device), backend, validate=False)
    assert all(torch.equal(a, b) for a, b in zip(checked, unchecked))


@pytest.mark.parametrize("bad", (float("nan"), -5.0, 0.0, float("inf"), "8", True))
def test_gspo_bad_normalizer_is_named(bad, device, backend):
    x = _rl(device)
    with pytest.raises(errors.InputError) as e:
        gspo_loss(x["logp"], x["old_logp"], x["advantages"], mask=x["mask"], normalizer=bad, backend=backend)
    assert e.value.argument == "normalizer"
    with pytest.raises(errors.InputError) as e:  # a tensor normalizer is not supported by gspo_loss
        gspo_loss(x["logp"], x["old_logp"], x["advantages"], mask=x["mask"],
                  normalizer=torch.tensor(4.0, device=device), backend=backend)
    assert e.value.argument == "normalizer"


# ---- 3. reinforce_pp_baseline's whitening statistics and mask ----

@pytest.mark.parametrize("name,bad", [("token_std", float("nan")), ("token_std", -1.0), ("token_std", float("inf")),
                                      ("token_std", "1"), ("token_mean", float("nan")), ("token_mean", float("-inf")),
                                      ("token_mean", "a"), ("token_mean", True)])
@pytest.mark.parametrize("partner", (True, False))
def test_bad_token_stats_are_named(name, bad, partner, device, backend):
    s, gid, mask = _rpp_case(device)
    kw = {name: bad}
    if partner:
        kw["token_mean" if name == "token_std" else "token_std"] = 1.0
    with pytest.raises(errors.InputError) as e:
        reinforce_pp_baseline(s, gid, mask, num_groups=4, backend=backend, **kw)
    assert e.value.argument == name


def test_token_stats_as_tensors(device, backend):
    s, gid, mask = _rpp_case(device)
    as_numbers = reinforce_pp_baseline(s, gid, mask, num_groups=4, token_mean=0.25, token_std=1.5, backend=backend)
    for validate in (True, False):
        as_tensors = reinforce_pp_baseline(s, gid, mask, num_groups=4, token_mean=torch.tensor(0.25, device=device),
                                           token_std=torch.tensor([1.5], device=device), validate=validate,
                                           backend=backend)
        assert torch.equal(as_numbers, as_tensors)
    for name, bad in (("token_std", -1.0), ("token_std", float("nan")), ("token_mean", float("inf"))):
        kw = {"token_mean": torch.tensor(0.25, device=device), "token_std": torch.tensor(1.5, device=device)}
        kw[name] = torch.tensor(bad, device=device)
        with pytest.raises(errors.InputError) as e:
            reinforce_pp_baseline(s, gid, mask, num_groups=4, backend=backend, **kw)
        assert e.value.argument == name
        out = reinforce_pp_baseline(s, gid, mask, num_groups=4, validate=False, backend=backend, **kw)
        assert torch.isnan(out[mask]).all() and not out[~mask].any()  # documented: NaN, never a sign flip
    with pytest.raises(errors.ShapeError) as e:
        reinforce_pp_baseline(s, gid, mask, num_groups=4, token_mean=torch.zeros(2, device=device), token_std=1.0)
    assert e.value.argument == "token_mean"
    with pytest.raises(errors.DTypeError) as e:
        reinforce_pp_baseline(s, gid, mask, num_groups=4, token_mean=0.0,
                              token_std=torch.tensor(True, device=device))
    assert e.value.argument == "token_std"


def test_reinforce_pp_mask_is_required(device, backend):
    s, gid, mask = _rpp_case(device)
    with pytest.raises(errors.DTypeError) as e:
        reinforce_pp_baseline(s, gid, None, num_groups=4, backend=backend)
    assert e.value.argument == "mask"
    for bad in (mask[0], mask[None]):
        with pytest.raises(errors.ShapeError) as e:
            reinforce_pp_baseline(s, gid, bad, num_groups=4, backend=backend)
        assert e.value.argument == "mask"


def test_gae_mask_none_means_all_active(device, backend):
    g = _gen(2)
    r, v = torch.randn(3, 9, generator=g).to(device), torch.randn(3, 9, generator=g).to(device)
    a = gae(r, v, None, gamma=0.99, lam=0.95, backend=backend)
    b = gae(r, v, torch.ones(3, 9, dtype=torch.bool, device=device), gamma=0.99, lam=0.95, backend=backend)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---- 4. the allowlist ----

@pytest.fixture
def gpu_here(monkeypatch):
    """The registry measures a GPU with every backend available (as tests/test_policy.py's situation)."""
    import rlk_triton._runtime as rt

    monkeypatch.setattr(registry, "measure_availability", lambda op, b, dev: (True, None))
    monkeypatch.setattr(rt, "arch_of", lambda device: "sm90")
    monkeypatch.setattr(policy, "arch_of", lambda device: "sm90")


TRITON, NATIVE = "selected_logp.triton", "native"


def _resolve(**kw):
    kw.setdefault("env", {})
    return policy.resolve("selected_logp", dtype="bfloat16", device="cpu", **kw)


@pytest.mark.parametrize("allowlist", ("selected_logp", " selected_logp ", "ratio_kl, selected_logp", "*", "",
                                       ("selected_logp",), ["*"]))
def test_allowlist_string_is_a_name_or_a_comma_list(allowlist, gpu_here):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a valid allowlist warns about nothing
        d = _resolve(fast="strict", allowlist=allowlist)
    assert d.chosen == TRITON
    assert "allowlist_unknown" not in d.requested
    want = None if allowlist in ("*", "", ["*"]) else sorted(x.strip() for x in "".join(allowlist).split(","))
    assert d.requested["allowlist"] == want
    d = _resolve(fast="strict", env={"RLK_OPS": allowlist} if isinstance(allowlist, str) else {})
    assert d.chosen == TRITON


@pytest.mark.parametrize("where", ("argument", "env"))
@pytest.mark.parametrize("allowlist", ("selected_logpp", "selected_logp,selected_logpp", "s,e,l"))
def test_unknown_allowlist_entry_under_strict_raises(where, allowlist, gpu_here):
    kw = {"allowlist": allowlist} if where == "argument" else {"env": {"RLK_OPS": allowlist}}
    with pytest.raises(errors.InputError) as e:
        _resolve(fast="strict", **kw)
    assert e.value.argument == ("allowlist" if where == "argument" else "RLK_OPS")
    if where == "argument":
        with pytest.raises(errors.InputError) as e:
            _resolve(fast="strict", allowlist=[allowlist])
        assert e.value.argument == "allowlist"
    with pytest.raises(errors.InputError):  # fast from the environment: the same
        _resolve(**{**kw, "env": {**kw.get("env", {}), "RLK_FAST": "strict"}})


def test_unknown_allowlist_entry_under_auto_warns_and_is_recorded(gpu_here):
    log = policy.DecisionLog()
    with pytest.warns(errors.RlkFallbackWarning, match="selected_logpp"):
        d = _resolve(fast="auto", allowlist=["selected_logpp"], log=log)
    assert d.chosen == NATIVE and d.requested["allowlist_unknown"] == ["selected_logpp"]
    assert log.records()[-1]["requested"]["allowlist_unknown"] == ["selected_logpp"]
    with pytest.warns(errors.RlkFallbackWarning):  # a known entry next to it still works
        d = _resolve(fast="auto", env={"RLK_OPS": "selected_logp,selected_logpp"})
    assert d.chosen == TRITON and d.requested["allowlist_unknown"] == ["selected_logpp"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = _resolve(fast="off", allowlist="selected_logpp")  # recorded; off runs nothing of ours anyway
    assert d.chosen == NATIVE and d.requested["allowlist_unknown"] == ["selected_logpp"]


@pytest.mark.parametrize("bad", (5, [1, 2], ["selected_logp", None], torch.zeros(2)))
def test_allowlist_that_is_not_names_is_named(bad, gpu_here):
    with pytest.raises(errors.InputError) as e:
        _resolve(fast="auto", allowlist=bad)
    assert e.value.argument == "allowlist"


# ---- 5. the device argument ----

@pytest.mark.parametrize("bad", ("tpu", "meta", torch.device("meta"), "", 1.5, ["cpu"]))
def test_device_that_rlk_does_not_run_on_is_named(bad):
    with pytest.raises(errors.DeviceError) as e:
        policy.resolve("selected_logp", dtype="bfloat16", device=bad, env={})
    assert e.value.argument == "device"


def test_torch_device_is_the_same_as_its_string(gpu_here):
    for fast in ("off", "auto", "strict"):
        a = _resolve(fast=fast).to_dict()
        b = policy.resolve("selected_logp", dtype="bfloat16", device=torch.device("cpu"), fast=fast, env={}).to_dict()
        assert a == b and b["device"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
@pytest.mark.parametrize("dev", ("cuda", "cuda:0", torch.device("cuda")))
def test_cuda_device_without_cuda_resolves_or_fails_closed(dev):
    d = policy.resolve("selected_logp", dtype="bfloat16", device=dev, fast="off", env={})
    assert d.chosen == NATIVE and d.arch is None
    assert all(not c["available"] and "no CUDA device" in c["reason"] for c in d.candidates)
    for kw in ({"fast": "strict"}, {"consistency": "audit"}, {"fast": "auto", "consistency": "strict"}):
        with pytest.raises(errors.PolicyError) as e:
            policy.resolve("selected_logp", dtype="bfloat16", device=dev, env={}, **kw)
        assert "no CUDA device" in e.value.decision["error"]


# ---- 6. contract lookups ----

@pytest.mark.parametrize("call,argument", [
    (lambda: contracts.judgment(["selected_logp"], torch.float32, "forward_accuracy"), "op"),
    (lambda: contracts.judgment(("selected_logp",), torch.float32, "forward_accuracy"), "op"),
    (lambda: contracts.judgment(None, torch.float32, "forward_accuracy"), "op"),
    (lambda: contracts.judgment("selected_logp", torch.float32, ["forward_accuracy"]), "name"),
    (lambda: contracts.judgment("selected_logp", torch.float32, "forward_accuracy", ["sm90"]), "arch"),
    (lambda: contracts.contract_id(["selected_logp"], torch.float32), "op"),
    (lambda: contracts.contract_id("selected_logp", torch.float32, {"sm90"}), "arch"),
    (lambda: contracts.load(["selected_logp"]), "op"),
])
def test_contract_lookup_with_a_key_that_is_not_a_name(call, argument):
    with pytest.raises(errors.InputError) as e:
        call()
    assert e.value.argument == argument


def test_contract_op_is_a_name_not_a_path():
    with pytest.raises(errors.ContractError) as e:
        contracts.judgment("../contracts/selected_logp", torch.float32, "forward_accuracy")
    assert "no contract table" in str(e.value)
    assert contracts.judgment("selected_logp", "float32", "forward_accuracy", None)["kind"] == "scaled_abs"


# ---- 7. index and mask views ----

def _strided(x):
    """The same values as a non-contiguous view: every other element of a twice-longer first dim."""
    wide = torch.zeros((2 * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    wide[::2] = x
    view = wide[::2]
    assert not view.is_contiguous() and torch.equal(view, x)
    return view


@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("validate", (True, False))
def test_strided_group_ids_give_the_contiguous_bits(dtype, validate, device, backend):
    s, gid, mask = _rpp_case(device, B=20, groups=5)
    gid = gid.to(dtype)
    valid = torch.rand(20, generator=_gen(4)).to(device) > 0.2
    for mode in MODES:
        a = group_advantages(s, _strided(gid), num_groups=5, mode=mode, valid=_strided(valid), validate=validate,
                             backend=backend)
        b = group_advantages(s, gid, num_groups=5, mode=mode, valid=valid, validate=validate, backend=backend)
        assert torch.equal(a, b), mode
    a = reinforce_pp_baseline(_strided(s), _strided(gid), _strided(mask), num_groups=5, validate=validate,
                              backend=backend)
    b = reinforce_pp_baseline(s, gid, mask, num_groups=5, validate=validate, backend=backend)
    assert torch.equal(a, b)


def test_launcher_reads_index_views_as_their_contiguous_copy(device):
    """The root: the kernels index flat, so the launcher takes views itself (not only the public wrapper)."""
    s, gid, _ = _rpp_case(device, B=20, groups=5)
    gid, ok = gid.to(torch.int32), torch.ones(20, dtype=torch.uint8, device=device)
    for mode in MODES:
        a = adv_ops.launch_group_advantages(_strided(s), _strided(gid), _strided(ok), 5, mode, 1e-6)[0]
        b = adv_ops.launch_group_advantages(s, gid, ok, 5, mode, 1e-6)[0]
        assert torch.equal(a, b), mode


@pytest.mark.parametrize("mask_dtype", (torch.bool, torch.uint8, torch.int64))
def test_strided_masks_and_advantages_give_the_contiguous_bits(mask_dtype, device, backend):
    x = _rl(device)
    m = x["mask"].to(mask_dtype)
    r = [ratio_kl(x["logp"], x["old_logp"], x["ref_logp"], mask=mm, backend=backend) for mm in (m, _strided(m))]
    assert all(torch.equal(a, b) for a, b in zip(*r))
    p = [policy_loss(x["logp"], x["old_logp"], aa, mask=mm, backend=backend)
         for aa, mm in ((x["advantages"], m), (_strided(x["advantages"]), _strided(m)))]
    assert torch.equal(p[0][0], p[1][0]) and torch.equal(p[0][1], p[1][1])
    q = [gspo_loss(x["logp"], x["old_logp"], aa, mask=mm, backend=backend)
         for aa, mm in ((x["advantages"], m), (_strided(x["advantages"]), _strided(m)))]
    assert torch.equal(q[0][0], q[1][0]) and torch.equal(q[0][1], q[1][1])
    g = [gae(x["logp"], x["old_logp"], mm, gamma=0.99, lam=0.95, bootstrap_values=bb, backend=backend)
         for mm, bb in ((m, x["advantages"]), (_strided(m), _strided(x["advantages"])))]
    assert torch.equal(g[0][0], g[1][0]) and torch.equal(g[0][1], g[1][1])


# ---- 8. a non-finite value stays in its row (or group) ----

SPOILABLE = ("logp", "old_logp", "ref_logp", "rollout_logp", "entropy", "advantages")


def _spoil(x, name, value, row=1):
    y = {k: v.clone() for k, v in x.items()}
    if y[name].dim() == 1:
        y[name][row] = value
    else:
        y[name][row, 0] = value  # an active token (_rl keeps token 0 active)
    return y


def _assert_rows_kept(run, x, names, row=1):
    clean = run(x)
    for name in names:
        for value in NONFINITE:
            dirty = run(_spoil(x, name, value, row))
            keep = [i for i in range(x["logp"].shape[0]) if i != row]
            for i, (c, d) in enumerate(zip(clean, dirty)):
                assert torch.equal(c[keep], d[keep]), (name, value, i)


def _ratio_kl_run(backend):
    def run(x):
        logp = x["logp"].clone().requires_grad_()
        out = ratio_kl(logp, x["old_logp"], x["ref_logp"], mask=x["mask"], log_ratio_clamp=5.0, backend=backend)
        (out[0].sum() + out[1].sum() + out[2].sum()).backward()
        return [*(o.detach() for o in out), logp.grad]
    return run


def test_ratio_kl_nonfinite_stays_in_its_row(device, backend):
    _assert_rows_kept(_ratio_kl_run(backend), _rl(device), ("logp", "old_logp", "ref_logp"))


@pytest.mark.parametrize("loss_type", ("ppo", "cispo"))
@pytest.mark.parametrize("split", (0, 1))
def test_policy_loss_nonfinite_stays_in_its_row(loss_type, split, device, backend, monkeypatch):
    from rlk_triton import configs

    arch = configs.table_arch(arch_of(torch.device(device)), "rl_policy_loss_split")
    monkeypatch.setitem(configs.LOCKED_CONFIGS, ("rl_policy_loss_split", arch, "float32", "any"),
                        configs.LaunchConfig(split, 1, 1))

    def run(x):
        logp, ent = x["logp"].clone().requires_grad_(), x["entropy"].clone().requires_grad_()
        loss, tok, _ = policy_loss(logp, x["old_logp"], x["advantages"], mask=x["mask"], loss_type=loss_type,
                                   dual_clip_c=3.0 if loss_type == "ppo" else None, ref_logp=x["ref_logp"],
                                   kl_coef=0.1, entropy=ent, entropy_coef=0.01, rollout_logp=x["rollout_logp"],
                                   tis_cap=2.0, aggregation="seq-mean-token-mean", normalizer=4.0, backend=backend)
        tok.sum().backward()  # per-token upstream gradients: each row's own
        return [tok.detach(), logp.grad, ent.grad]

    _assert_rows_kept(run, _rl(device), SPOILABLE)


def test_gspo_loss_nonfinite_stays_in_its_row(device, backend):
    def run(x):
        logp, ent = x["logp"].clone().requires_grad_(), x["entropy"].clone().requires_grad_()
        _, seq, _ = gspo_loss(logp, x["old_logp"], x["advantages"], mask=x["mask"], ref_logp=x["ref_logp"],
                              kl_coef=0.1, entropy=ent, entropy_coef=0.01, rollout_logp=x["rollout_logp"],
                              tis_cap=2.0, normalizer=4.0, backend=backend)
        seq.sum().backward()
        return [seq.detach(), logp.grad, ent.grad]

    _assert_rows_kept(run, _rl(device), SPOILABLE)


def test_gae_nonfinite_stays_in_its_row(device, backend):
    def run(x):
        return list(gae(x["logp"], x["old_logp"], x["mask"], gamma=0.99, lam=0.95,
                        bootstrap_values=x["advantages"], backend=backend))

    _assert_rows_kept(run, _rl(device), ("logp", "old_logp", "advantages"))  # rewards, values, bootstrap


def test_group_ops_nonfinite_stays_in_its_group(device, backend):
    s, gid, mask = _rpp_case(device, B=20, groups=5)
    bad_row = 3
    others = gid != gid[bad_row]
    runs = [lambda s_: group_advantages(s_, gid, num_groups=5, mode=m, backend=backend) for m in MODES]
    runs.append(lambda s_: reinforce_pp_baseline(s_, gid, mask, num_groups=5, token_mean=0.25, token_std=1.5,
                                                 backend=backend))
    for run in runs:
        clean = run(s)
        for value in NONFINITE:
            spoiled = s.clone()
            spoiled[bad_row] = value
            dirty = run(spoiled)
            assert torch.equal(clean[others], dirty[others]), value


@pytest.mark.parametrize("kw,argument", [({"env": "RLK_FAST=auto"}, "env"), ({"env": ["RLK_FAST"]}, "env"),
                                         ({"log": 5}, "log"), ({"fast": ["auto"]}, "fast"),
                                         ({"consistency": 1}, "consistency")])
def test_other_resolve_arguments_are_named(kw, argument, gpu_here):
    with pytest.raises(errors.InputError) as e:
        policy.resolve("selected_logp", dtype="bfloat16", device="cpu", **{"env": {}, **kw})
    assert e.value.argument == argument
    with pytest.raises(errors.InputError) as e:
        policy.resolve(["selected_logp"], dtype="bfloat16", device="cpu", env={})
    assert e.value.argument == "op"
