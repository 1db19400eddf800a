"""The RL operators in the registry (rlk_triton/testing/rl_ops.py): descriptors, parity cases and judges,
row ops, probes, capabilities, the mode policy (float32 only) and the CLI."""
import json
import subprocess
import sys
import warnings

import pytest
import torch

from rlk_triton import policy, registry
from rlk_triton.errors import PolicyError, RlkFallbackWarning
from rlk_triton.ops import rl_torch
from rlk_triton.testing import RowOp, check_batch_invariance
from rlk_triton.testing import parity  # noqa: F401 - imported before the fixture patches _runtime.arch_of
from rlk_triton.testing.float64_checks import summation_order_bound
from rlk_triton.testing.harness import harness
from rlk_triton.testing.rl_ops import group_inputs

RL_OPS = {"ratio_kl": "rl_losses", "policy_loss": "rl_losses", "gspo_loss": "rl_losses", "gae": "advantages",
          "group_advantages": "advantages", "reinforce_pp_baseline": "advantages",
          "rollout_correction": "rl_losses", "masked_whiten": "advantages"}
AUTOGRAD = ("ratio_kl", "policy_loss", "gspo_loss")  # the others' outputs are constants to autograd
BACKENDS = ("triton", "torch_reference")


def test_the_rl_operators_are_registered():
    ops = {op.name: op for op in registry.operators()}
    assert set(RL_OPS) <= set(ops) and "selected_logp" in ops
    for name, contract in RL_OPS.items():
        op = ops[name]
        assert op.contract == contract
        assert [b.name for b in op.backends] == list(BACKENDS)
        assert all(b.dtypes == ("float32",) and b.backend_id == f"{name}.{b.name}" for b in op.backends)
        assert [b.backend_class for b in op.backends] == ["production", "reference"]
        assert all(b.autograd == (name in AUTOGRAD) for b in op.backends)


@pytest.mark.parametrize("name", sorted(RL_OPS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_parity_cases_pass_their_judge(name, backend, device):
    h = harness(name)
    cases = h.parity_cases(device == "cuda")
    assert cases and all(c.dtype == torch.float32 and c.label() for c in cases)
    for case in cases:
        ratios = h.judge(case, device, backend=backend)
        assert ratios and max(ratios.values()) <= 1.0, (case.label(), ratios)


@pytest.mark.parametrize("name", sorted(RL_OPS))
def test_row_ops_are_bitwise_batch_invariant(name, device):
    ops = harness(name).row_ops(device, device == "cuda")
    assert {o.name.split("[")[0] for o in ops} == {f"{name}.{b}" for b in BACKENDS}
    for row_op in ops:
        if device == "cpu" and row_op.name.startswith("gae.triton"):
            continue  # ~12 s of interpreted scans: tests/test_advantages.py checks the same kernel's rows
        rep = check_batch_invariance(row_op, probe_rows=2, batch_sizes=(3, 5))
        assert rep.passed, (row_op.name, [f"{r.axis}/{r.what}" for r in rep.failures()])


def test_the_group_row_op_can_fail(device):
    """The harness over groups catches a group that depends on the other groups (one pooled group)."""
    from rlk_triton.advantages import group_advantages

    def make_rows(n, gen):
        return (torch.randn(n, 4, generator=gen).to(device),)

    def pooled(s):  # every harness row in ONE group: each row's values depend on the whole batch
        n = s.shape[0]
        out = group_advantages(s.reshape(-1), torch.zeros(4 * n, dtype=torch.long, device=device), num_groups=1,
                               backend="torch_reference")
        return (out.view(n, 4),)

    assert not check_batch_invariance(RowOp("pooled", pooled, make_rows), probe_rows=2, batch_sizes=(3, 5)).passed


def test_the_reinforce_pp_row_op_can_fail(device):
    """Without token_mean / token_std the whitening statistics are the batch's: the harness sees a group's
    token advantages change with the other groups (so the registered row op's passing means something)."""
    from rlk_triton.advantages import reinforce_pp_baseline
    from rlk_triton.testing.rl_ops import reinforce_pp_row_op

    op = reinforce_pp_row_op(4, 5, device, backend="torch_reference")

    def batch_whitened(s, ok, m):
        n = s.shape[0]
        out = reinforce_pp_baseline(s.t().reshape(-1), torch.arange(n, device=s.device).repeat(4),
                                    m.transpose(0, 1).reshape(4 * n, 5), num_groups=n, valid=ok.t().reshape(-1),
                                    backend="torch_reference")
        return (out.view(4, n, 5).transpose(0, 1),)

    assert not check_batch_invariance(RowOp("batch-whitened", batch_whitened, op.make_rows), probe_rows=2,
                                      batch_sizes=(3, 5)).passed


def test_a_broken_gspo_backend_fails_its_probe(monkeypatch):
    """gspo_loss's probe judges every term: an entropy bonus applied at 1.001x is outside the contract."""
    real = rl_torch.gspo_loss

    def off(*args):
        args = list(args)
        args[12] = args[12] * 1.001  # entropy_coef
        return real(*args)

    registry.measure_availability.cache_clear()
    monkeypatch.setattr(rl_torch, "gspo_loss", off)
    try:
        ok, why = registry.measure_availability("gspo_loss", "torch_reference", "cpu")
        assert not ok and "outside the contract" in why
    finally:
        registry.measure_availability.cache_clear()


def test_a_broken_backend_fails_its_probe(monkeypatch):
    """Availability is measured against the contract: an error of 1e-5 relative makes the backend unavailable."""
    real = rl_torch.ratio_kl

    def off_by_a_little(*args):
        lr, r, kl = real(*args)
        return lr, r * (1 + 1e-5), kl

    registry.measure_availability.cache_clear()
    monkeypatch.setattr(rl_torch, "ratio_kl", off_by_a_little)
    try:
        ok, why = registry.measure_availability("ratio_kl", "torch_reference", "cpu")
        assert not ok and "outside the contract" in why
        assert registry.measure_availability("gae", "torch_reference", "cpu") == (True, None)
    finally:
        registry.measure_availability.cache_clear()


def test_capabilities_describe_the_rl_backends(device):
    caps = {c["backend_id"]: c for c in registry.capabilities(device)}
    json.dumps(list(caps.values()))
    for name in RL_OPS:
        for b in BACKENDS:
            c = caps[f"{name}.{b}"]
            assert c["available"], c["unavailable_reason"]
            assert set(c["contract_ids"]) == {"float32"} and c["dtypes"] == ["float32"]
            assert c["strict_eligible"] and c["batch_invariant"]
        if device == "cpu":
            assert not caps[f"{name}.triton"]["optimized"]  # the interpreter


@pytest.fixture
def on_a_gpu(monkeypatch):
    """The registry measures every backend available, on an sm90 arch (no GPU needed)."""
    import rlk_triton._runtime as rt

    monkeypatch.setattr(registry, "measure_availability", lambda op, b, dev: (True, None))
    monkeypatch.setattr(rt, "arch_of", lambda device: "sm90")
    monkeypatch.setattr(policy, "arch_of", lambda device: "sm90")


@pytest.mark.parametrize("name", sorted(RL_OPS))
def test_policy_picks_the_rl_backends_for_float32(name, on_a_gpu):
    d = policy.resolve(name, dtype=torch.float32, device="cuda", fast="strict", consistency="strict", env={})
    assert d.chosen == f"{name}.triton" and d.backend == "triton" and d.contract_id
    assert policy.resolve(name, dtype="float32", device="cuda", env={}).chosen == "native"


@pytest.mark.parametrize("name", sorted(RL_OPS))
def test_policy_on_this_machine_falls_back_to_the_reference(name, device):
    """Here (interpreter or GPU) auto/strict resolves to a backend that is contract-bound."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RlkFallbackWarning)
        d = policy.resolve(name, dtype=torch.float32, device=device, fast="auto", consistency="strict", env={})
    want = f"{name}.torch_reference" if device == "cpu" else f"{name}.triton"
    assert d.chosen == want and d.fallback["used"] == (device == "cpu")


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, "float64"))
def test_policy_rl_ops_are_float32_only(dtype, on_a_gpu):
    """Any other dtype: consistency fails closed, fast=strict raises, fast=auto goes native with a warning."""
    for consistency in ("audit", "strict"):
        with pytest.raises(PolicyError) as e:
            policy.resolve("policy_loss", dtype=dtype, device="cuda", fast="auto", consistency=consistency, env={})
        assert "contract row" in e.value.decision["error"] and "float32" in e.value.decision["error"]
    with pytest.raises(PolicyError) as e:
        policy.resolve("gae", dtype=dtype, device="cuda", fast="strict", env={})
    assert all("not supported (supports float32)" in c["reason"] for c in e.value.decision["candidates"])
    with pytest.warns(RlkFallbackWarning):
        d = policy.resolve("ratio_kl", dtype=dtype, device="cuda", fast="auto", env={})
    assert d.chosen == "native" and d.contract_id is None and d.fallback["used"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "rlk_triton.cli", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_resolve_rl_ops():
    ok = _cli("resolve", "group_advantages", "--dtype", "float32", "--fast", "auto", "--consistency", "strict")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["chosen"].startswith("group_advantages.")
    bad = _cli("resolve", "policy_loss", "--dtype", "bfloat16", "--consistency", "strict")
    assert bad.returncode == 1 and json.loads(bad.stdout)["status"] == "error"


def test_torch_reference_group_matrix_is_one_row_per_group(device):
    """The group statistics of the torch reference: members in member order, per group."""
    s, gid, ok = group_inputs(30, 4, 9, device)
    mean, m2, count = rl_torch.group_stats(s, gid.to(torch.int32), ok.to(torch.uint8), 6)
    for g in range(6):
        members = s[(gid == g) & ok].double()
        assert int(count[g]) == members.numel()
        if members.numel():
            # the same float64 sums in other orders; the squared deviations also carry the mean's error
            n, dev = members.numel(), members - members.mean()
            mean_bound = summation_order_bound(n, float(members.abs().sum())) / n
            m2_bound = summation_order_bound(n, float((dev ** 2).sum())) + 2 * mean_bound * float(dev.abs().sum())
            assert abs(float(mean[g]) - float(members.mean())) <= mean_bound
            assert abs(float(m2[g]) - float((dev ** 2).sum())) <= m2_bound
        else:
            assert mean[g] == 0 and m2[g] == 0
