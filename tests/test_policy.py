"""The mode policy: every (fast, consistency) pair in every availability situation, and its records."""
import json
import warnings

import pytest
import torch

from rlk_triton import policy, registry
from rlk_triton.testing import parity  # noqa: F401 - imported before the fixture patches _runtime.arch_of
from rlk_triton.errors import InputError, PolicyError, RlkFallbackWarning

TRITON, REF, NATIVE = "selected_logp.triton", "selected_logp.torch_reference", "native"


@pytest.fixture
def situation(monkeypatch):
    """situation(name) makes the registry measure one of: gpu, gpu_triton_broken, cpu_interpreter, nothing."""
    import rlk_triton._runtime as rt

    def set_(name):
        avail = {
            "gpu": {"triton": (True, None), "torch_reference": (True, None)},
            "gpu_triton_broken": {"triton": (False, "probe failed: simulated"), "torch_reference": (True, None)},
            "cpu_interpreter": {"triton": (True, None), "torch_reference": (True, None)},
            "nothing": {"triton": (False, "simulated"), "torch_reference": (False, "simulated")},
        }[name]
        monkeypatch.setattr(registry, "measure_availability", lambda op, b, dev: avail[b])
        arch = "interpreter" if name == "cpu_interpreter" else "sm90"
        monkeypatch.setattr(rt, "arch_of", lambda device: arch)
        monkeypatch.setattr(policy, "arch_of", lambda device: arch)
    return set_


# (fast, consistency) -> expected chosen backend (or "error") per situation; straight from the table
# in rlk_triton/policy.py.
EXPECTED = {
    ("off", "off"): dict(gpu=NATIVE, gpu_triton_broken=NATIVE, cpu_interpreter=NATIVE, nothing=NATIVE),
    ("auto", "off"): dict(gpu=TRITON, gpu_triton_broken=NATIVE, cpu_interpreter=NATIVE, nothing=NATIVE),
    ("strict", "off"): dict(gpu=TRITON, gpu_triton_broken="error", cpu_interpreter="error", nothing="error"),
    ("off", "audit"): dict(gpu=NATIVE, gpu_triton_broken=NATIVE, cpu_interpreter=NATIVE, nothing=NATIVE),
    ("off", "strict"): dict(gpu=NATIVE, gpu_triton_broken=NATIVE, cpu_interpreter=NATIVE, nothing=NATIVE),
    ("auto", "audit"): dict(gpu=TRITON, gpu_triton_broken=NATIVE, cpu_interpreter=NATIVE, nothing=NATIVE),
    ("auto", "strict"): dict(gpu=TRITON, gpu_triton_broken=REF, cpu_interpreter=REF, nothing="error"),
    ("strict", "strict"): dict(gpu=TRITON, gpu_triton_broken="error", cpu_interpreter="error", nothing="error"),
}
CASES = [(f, c, s, want) for (f, c), per in EXPECTED.items() for s, want in per.items()]


@pytest.mark.parametrize("fast,consistency,where,want", CASES)
def test_mode_table(fast, consistency, where, want, situation):
    situation(where)
    log = policy.DecisionLog()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if want == "error":
            with pytest.raises(PolicyError) as e:
                policy.resolve("selected_logp", dtype=torch.bfloat16, device="cpu", fast=fast,
                               consistency=consistency, env={}, log=log)
            record = e.value.decision
            assert record["status"] == "error" and record["error"]
            assert all(not c["taken"] for c in record["candidates"])
            assert log.records()[-1] == record
            return
        d = policy.resolve("selected_logp", dtype=torch.bfloat16, device="cpu", fast=fast,
                           consistency=consistency, env={}, log=log)
    assert d.chosen == want
    rec = json.loads(json.dumps(d.to_dict()))  # JSON-serializable
    assert rec == log.records()[-1]
    assert {c["backend_id"] for c in rec["candidates"]} == {TRITON, REF, "selected_logp.cuda_native"}
    assert all(c["reason"] for c in rec["candidates"])
    assert sum(c["taken"] for c in rec["candidates"]) == (0 if want == NATIVE else 1)
    assert rec["diagnostics"] == (consistency != "off")
    assert rec["contract_checks_required"] == (consistency == "strict")
    assert rec["contract_id"]
    fell_back = (fast != "off" and want == NATIVE) or want == REF
    assert rec["fallback"]["used"] == fell_back
    assert any(issubclass(w.category, RlkFallbackWarning) for w in caught) == fell_back  # never silent
    if want != NATIVE:
        assert d.backend == want.split(".")[1]


def test_modes_come_from_the_environment_and_arguments_win(situation):
    situation("gpu")
    env = {"RLK_FAST": "auto", "RLK_CONSISTENCY": "audit"}
    d = policy.resolve("selected_logp", dtype="bfloat16", device="cpu", env=env)
    assert d.chosen == TRITON and d.requested["source"] == {"fast": "env RLK_FAST", "consistency": "env RLK_CONSISTENCY"}
    d = policy.resolve("selected_logp", dtype="bfloat16", device="cpu", fast="off", env=env)
    assert d.chosen == NATIVE and d.requested["source"]["fast"] == "argument"
    assert policy.resolve("selected_logp", dtype="bfloat16", device="cpu", env={}).requested["fast"] == "off"


def test_bad_mode_is_a_typed_error(situation):
    situation("gpu")
    with pytest.raises(InputError) as e:
        policy.resolve("selected_logp", dtype="bfloat16", device="cpu", env={"RLK_FAST": "turbo"})
    assert e.value.argument == "RLK_FAST"
    with pytest.raises(InputError) as e:
        policy.resolve("selected_logp", dtype="bfloat16", device="cpu", consistency="maybe", env={})
    assert e.value.argument == "consistency"


def test_allowlist_keeps_other_ops_native(situation):
    situation("gpu")
    d = policy.resolve("selected_logp", dtype="bfloat16", device="cpu", fast="strict", env={"RLK_OPS": "linear_logp"})
    assert d.chosen == NATIVE and d.requested["allowlist"] == ["linear_logp"]
    assert "allowlist" in d.candidates[0]["reason"]
    assert policy.resolve("selected_logp", dtype="bfloat16", device="cpu", fast="strict",
                          env={"RLK_OPS": "selected_logp"}).chosen == TRITON


@pytest.mark.parametrize("consistency", ("audit", "strict"))
def test_missing_contract_row_fails_closed(consistency, situation):
    situation("gpu")
    with pytest.raises(PolicyError) as e:
        policy.resolve("selected_logp", dtype=torch.float64, device="cpu", consistency=consistency, env={})
    assert "float64" in e.value.decision["error"]


def test_unknown_dtype_without_consistency_follows_fast(situation):
    situation("gpu")
    with pytest.warns(RlkFallbackWarning):
        d = policy.resolve("selected_logp", dtype=torch.float64, device="cpu", fast="auto", env={})
    assert d.chosen == NATIVE and "float64 not supported" in d.candidates[0]["reason"]
    with pytest.raises(PolicyError):
        policy.resolve("selected_logp", dtype=torch.float64, device="cpu", fast="strict", env={})


def test_unknown_op_is_a_typed_error():
    with pytest.raises(InputError) as e:
        policy.resolve("no_such_op", dtype="bfloat16", env={})
    assert e.value.argument == "op"


def test_real_capabilities_on_this_machine(device):
    """Measured, not assumed: here every backend runs its probe."""
    caps = [c for c in registry.capabilities(device) if c["op"] == "selected_logp"]  # RL ops: test_rl_registry.py
    json.dumps(caps)
    by = {c["backend_id"]: c for c in caps}
    assert set(by) == {TRITON, REF, "selected_logp.cuda_native"}
    assert by[REF]["available"] and by[REF]["strict_eligible"] and by[REF]["backend_class"] == "reference"
    native = by["selected_logp.cuda_native"]
    assert native["backend_class"] == "native"
    if device == "cpu":  # no CUDA here: listed, with why it is not available
        assert not native["available"] and not native["strict_eligible"] and native["unavailable_reason"]
    if device == "cpu":
        assert by[TRITON]["available"], by[TRITON]["unavailable_reason"]
        assert not by[TRITON]["optimized"]  # the interpreter
        assert by[TRITON]["build_fingerprint"]["arch"] == "interpreter"
    for c in caps:
        assert set(c["contract_ids"]) == {"bfloat16", "float16", "float32"}
        assert c["build_fingerprint"]["locked_configs"]


def test_triton_on_cpu_without_interpreter_is_unavailable_with_a_reason(monkeypatch):
    import rlk_triton.logp as logp_mod

    registry.measure_availability.cache_clear()
    monkeypatch.setattr(logp_mod, "_INTERPRETED", False)
    try:
        ok, why = registry.measure_availability("selected_logp", "triton", "cpu")
        assert not ok and "TRITON_INTERPRET" in why
        assert registry.measure_availability("selected_logp", "torch_reference", "cpu") == (True, None)
    finally:
        registry.measure_availability.cache_clear()
