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


# ---- measured ranks for small eager calls (operators.RowsRank) ----

@pytest.fixture
def native_admitted(monkeypatch):
    """As on an H200 with admission records that match: the native backends are available."""
    from rlk_triton import native

    monkeypatch.setattr(native, "usable", lambda op, device: (True, None))


def _rows_rank(op):
    (rank,) = registry.operator(op).backends[-1].speed_rank_by_rows
    return rank


@pytest.mark.parametrize("op", ("selected_logp", "rmsnorm"))
def test_native_ranks_first_only_for_the_measured_small_eager_calls(op, situation, native_admitted):
    situation("gpu")
    triton, cuda = f"{op}.triton", f"{op}.cuda_native"
    limit = _rows_rank(op).max_rows

    def chosen(**kw):
        return policy.resolve(op, dtype="bfloat16", device="cpu", fast="auto", env={}, **kw)

    for rows in (1, limit):
        d = chosen(rows=rows)
        assert d.chosen == cuda and d.backend == "cuda_native"
        assert d.requested["rows"] == rows and d.requested["call"] == "eager"
        taken = next(c for c in d.candidates if c["taken"])
        assert f"at most {limit} rows" in taken["reason"] and "docs/reports/" in taken["reason"]
        assert json.loads(json.dumps(d.to_dict())) == d.to_dict()
        assert d.bits == triton  # admitted: the Triton kernel's bits, so rollout and trainer compare as one build
    assert chosen(rows=limit + 1).chosen == triton
    assert chosen().chosen == triton  # rows unknown: the plain ranks
    assert chosen(rows=1, call="cuda_graph").chosen == triton  # replayed: host time is not paid per call
    d = chosen(rows=1, call="compile")
    assert d.chosen == triton
    assert "eager only" in next(c for c in d.candidates if c["backend_id"] == cuda)["reason"]
    # strict modes: the admitted kernel is strict-eligible, so it is still the pick
    assert policy.resolve(op, dtype="bfloat16", device="cpu", fast="strict", consistency="strict", env={},
                          rows=1).chosen == cuda


def test_an_unadmitted_native_kernel_is_never_picked_for_small_calls(situation):
    situation("gpu")  # no admission record here: native.usable says why
    d = policy.resolve("selected_logp", dtype="bfloat16", device="cpu", fast="auto", env={}, rows=1)
    assert d.chosen == TRITON
    assert next(c for c in d.candidates if c["backend_id"] == "selected_logp.cuda_native")["reason"].startswith(
        "unavailable")


@pytest.mark.parametrize("kw,argument", [({"rows": -1}, "rows"), ({"rows": 2.0}, "rows"), ({"rows": True}, "rows"),
                                         ({"call": "graph"}, "call")])
def test_bad_rows_or_call_is_a_typed_error(kw, argument, situation):
    situation("gpu")
    with pytest.raises(InputError) as e:
        policy.resolve("selected_logp", dtype="bfloat16", device="cpu", fast="auto", env={}, **kw)
    assert e.value.argument == argument


def test_every_rows_rank_is_what_its_report_measured():
    """A RowsRank is a claim about a committed report: in its public-call rows the backend's eager call
    is faster than the Triton backend's at every measured size up to max_rows, and max_rows itself was
    measured (a threshold is a measured point, not an extrapolation)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    public = {"rmsnorm": "rms_norm", "selected_logp": "selected_logp"}  # op -> its public call in the report
    checked = 0
    for op in registry.operators():
        for b in op.backends:
            assert list(b.speed_rank_by_rows) == sorted(b.speed_rank_by_rows, key=lambda r: r.max_rows)
            for r in b.speed_rank_by_rows:
                assert r.rank < min(x.speed_rank for x in op.backends if x is not b)  # it reorders something
                rows = json.loads((root / r.report).read_text())["rows"]
                call = public[op.name]
                wall = {}
                for row in rows:
                    for name in (b.name, "triton"):
                        if row["backend"] == f"{call}(backend={name!r})":
                            wall.setdefault((row["op"], row["shape"]), {})[name] = row["wall_ms"]
                small = {k: v for k, v in wall.items() if int(k[1].split(" x ")[0]) <= r.max_rows}
                assert any(int(k[1].split(" x ")[0]) == r.max_rows for k in small), (b.backend_id, r.max_rows)
                for k, v in small.items():
                    assert v[b.name] < v["triton"], (b.backend_id, k, v)
                checked += len(small)
    assert checked >= 8


def test_a_decision_rehashes_no_table(situation, monkeypatch):
    """Frameworks may resolve per call (rows=): after the first decision none may rehash the locked
    configs or the contract tables (that made each decision cost ~23 ms on a CI-class CPU)."""
    from rlk_triton import configs, contracts

    situation("gpu")
    kw = dict(dtype="bfloat16", device="cpu", fast="auto", consistency="audit", env={})
    first = policy.resolve("selected_logp", rows=8, **kw)
    backend = registry.operator("selected_logp").backends[0]
    registry.describe(backend, "cpu")
    hashed = []
    monkeypatch.setattr(configs, "table_as_data", lambda: hashed.append("configs"))
    monkeypatch.setattr(contracts, "judgment", lambda *a, **k: hashed.append("contracts"))
    for rows in (1, 8, 64, 4096, None):
        d = policy.resolve("selected_logp", rows=rows, **kw)
        assert d.contract_id == first.contract_id
    registry.describe(backend, "cpu")
    assert hashed == []
