"""What a newcomer meets on a CPU-only machine: one line per usage error (exit 2), never a traceback;
dtype aliases; device handling at the root (_runtime / policy / registry); the check report."""
import io
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import rlk_triton
from rlk_triton import cli, policy, registry
from rlk_triton._runtime import as_device, as_dtype
from rlk_triton.errors import DeviceError, DTypeError, PolicyError
from rlk_triton.testing.harness import harness
from rlk_triton.testing.invariance import RowOp

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only behaviour")


def _run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- usage errors: one line, exit 2 ----

@pytest.mark.parametrize("argv,argument", [
    (("resolve", "nosuchop", "--dtype", "bfloat16"), "op:"),
    (("resolve", "selected_logp", "--dtype", "bfloat16", "--fast", "maybe"), "fast:"),
    (("resolve", "selected_logp", "--dtype", "bfloat16", "--consistency", "sometimes"), "consistency:"),
    (("resolve", "selected_logp", "--dtype", "bf17"), "dtype:"),
    (("resolve", "selected_logp", "--dtype", "bf16", "--device", "gpu"), "device:"),
    (("resolve", "selected_logp", "--dtype", "bf16", "--rows", "-3"), "rows:"),
    (("resolve", "selected_logp", "--dtype", "bf16", "--call", "graph"), "call:"),
    (("capabilities", "--device", "gpu"), "device:"),
])
def test_a_usage_error_is_one_line_and_exit_2(capsys, argv, argument):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == ""
    line = _one_line(err)
    assert line.startswith(f"rlk-triton {argv[0]}: {argument}"), line


def test_usage_errors_from_the_installed_command_have_no_traceback():
    for argv in (["resolve", "nosuchop", "--dtype", "bf16"], ["resolve", "selected_logp", "--dtype", "bf16",
                                                               "--fast", "maybe"]):
        p = subprocess.run([sys.executable, "-m", "rlk_triton.cli", *argv], capture_output=True, text=True)
        assert p.returncode == 2 and p.stdout == ""
        _one_line(p.stderr)


# ---- CUDA asked for on a CPU-only torch ----

@no_cuda
def test_capabilities_on_a_missing_cuda_device_say_why(capsys):
    rc, out, err = _run(capsys, "capabilities", "--device", "cuda", "--json")
    caps = json.loads(out)
    assert rc == 0 and caps and "Traceback" not in err
    for c in caps:
        assert not c["available"] and c["unavailable_reason"].startswith("no CUDA device")
        assert c["device"] == "cuda" and c["build_fingerprint"]["arch"] is None
    rc, out, _ = _run(capsys, "capabilities", "--device", "cuda")
    assert rc == 0 and "no CUDA device" in out and "tested by `rlk-triton check`" in out


def test_resolve_records_the_call_it_was_asked_about(capsys):
    rc, out, _ = _run(capsys, "resolve", "selected_logp", "--dtype", "bf16", "--device", "cpu", "--rows", "8",
                      "--call", "cuda_graph")
    d = json.loads(out)
    assert rc == 0 and (d["requested"]["rows"], d["requested"]["call"]) == (8, "cuda_graph")


@no_cuda
def test_resolve_on_a_missing_cuda_device(capsys):
    rc, out, err = _run(capsys, "resolve", "selected_logp", "--dtype", "bfloat16", "--device", "cuda")
    d = json.loads(out)
    assert rc == 0 and d["chosen"] == "native" and d["arch"] is None and "Traceback" not in err
    assert all("no CUDA device" in c["reason"] for c in d["candidates"])
    rc, out, err = _run(capsys, "resolve", "selected_logp", "--dtype", "bf16", "--device", "cuda", "--fast", "strict")
    assert rc == 1 and json.loads(out)["status"] == "error" and "no CUDA device" in _one_line(err)


@no_cuda
def test_policy_resolve_on_a_missing_cuda_device():
    d = policy.resolve("selected_logp", dtype=torch.bfloat16, device="cuda", env={})
    assert d.chosen == "native" and d.arch is None and d.contract_id is None
    with pytest.warns(rlk_triton.errors.RlkFallbackWarning):
        d = policy.resolve("selected_logp", dtype=torch.bfloat16, device=torch.device("cuda"), fast="auto", env={})
    assert all(c["reason"].startswith("unavailable: no CUDA device") for c in d.candidates)
    for kw in (dict(fast="strict"), dict(consistency="audit"), dict(consistency="strict")):
        with pytest.raises(PolicyError, match="no CUDA device"):
            policy.resolve("selected_logp", dtype="bf16", device="cuda", env={}, **kw)


@no_cuda
def test_arch_of_a_missing_cuda_device_is_a_device_error():
    from rlk_triton._runtime import arch_of

    for dev in ("cuda", torch.device("cuda", 0), "cuda:3"):
        with pytest.raises(DeviceError, match="no CUDA device") as e:
            arch_of(dev)
        assert e.value.argument == "device"


def test_policy_takes_a_torch_device():
    a = policy.resolve("selected_logp", dtype="bf16", device=torch.device("cpu"), env={})
    b = policy.resolve("selected_logp", dtype=torch.bfloat16, device="cpu", env={})
    assert a.to_dict() == b.to_dict() and a.device == "cpu"
    assert registry.capabilities(torch.device("cpu"))[0]["device"] == "cpu"


@pytest.mark.parametrize("bad", ["gpu", "", "mps", 1.5, -1], ids=["word", "empty", "mps", "float", "negative"])
def test_a_device_that_is_not_one_is_a_device_error(bad):
    with pytest.raises(DeviceError) as e:
        policy.resolve("selected_logp", dtype="bf16", device=bad, env={})
    assert e.value.argument == "device"
    with pytest.raises(DeviceError, match="^logits:"):
        as_device(bad if bad != "mps" else None, "logits")


# ---- dtype strings: one parser, the usual aliases ----

ALIASES = {
    torch.bfloat16: ["bfloat16", "bf16", "BF16", "torch.bfloat16", " bfloat16 "],
    torch.float16: ["float16", "fp16", "half", "torch.float16", "torch.half"],
    torch.float32: ["float32", "fp32", "float", "torch.float32", "f32"],
}


@pytest.mark.parametrize("want,name", [(w, n) for w, names in ALIASES.items() for n in names])
def test_dtype_aliases(want, name, capsys):
    assert as_dtype(name) is want and as_dtype(want) is want
    assert policy.resolve("selected_logp", dtype=name, device="cpu", env={}).dtype == str(want)[6:]
    rc, out, _ = _run(capsys, "resolve", "selected_logp", "--dtype", name, "--device", "cpu")
    assert rc == 0 and json.loads(out)["dtype"] == str(want)[6:]


@pytest.mark.parametrize("bad", ["bf17", "float33", "torch.nothing", "int 8", 16, None])
def test_a_dtype_that_is_not_one_is_a_dtype_error(bad):
    with pytest.raises(DTypeError) as e:
        policy.resolve("selected_logp", dtype=bad, device="cpu", env={})
    assert e.value.argument == "dtype"
    with pytest.raises(DTypeError, match="^logits:"):
        as_dtype(bad, "logits")


def test_a_real_dtype_without_a_contract_row_still_fails_closed():
    with pytest.raises(PolicyError, match="float64"):
        policy.resolve("selected_logp", dtype="fp64", device="cpu", consistency="strict", env={})


# ---- pipes, --help, --version, --json help ----

def test_a_closed_pipe_exits_quietly():
    p = subprocess.Popen([sys.executable, "-m", "rlk_triton.cli", "configs", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()  # what `| head -1` does; the output is larger than a pipe's buffer
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert err == "" and p.returncode in (0, 1)


def test_broken_pipe_in_process(capsys, monkeypatch):
    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())
    assert cli.main(["configs"]) == 1
    assert capsys.readouterr().err == ""


def test_version(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    # the installed distributions' versions (the CLI reads metadata, importing neither): a CUDA wheel's
    # metadata says "2.13.0" where its torch.__version__ says "2.13.0+cu130", a CPU wheel's both "+cpu"
    for name, version in (("rlk-triton", rlk_triton.__version__), ("torch", metadata.version("torch")),
                          ("triton", metadata.version("triton"))):
        assert f"{name} {version}" in out, (name, version, out)


def test_every_json_flag_has_help():
    import argparse

    parser = cli._parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0]
    seen = 0
    for name, sub in subs.choices.items():
        for action in sub._actions:
            if "--json" in action.option_strings:
                seen += 1
                assert action.help and action.help != argparse.SUPPRESS, name
    assert seen >= 3


def test_docgen_help_and_root(tmp_path):
    from rlk_triton import docgen

    p = subprocess.run([sys.executable, "-m", "rlk_triton.docgen", "--help"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert p.returncode == 0 and "usage" in p.stdout and "Traceback" not in p.stderr
    assert not (tmp_path / "--help").exists() and not list(tmp_path.iterdir())
    with pytest.raises(SystemExit) as e:
        docgen.main([str(tmp_path / "nowhere")])
    assert e.value.code == 2
    (tmp_path / "docs").mkdir()
    assert docgen.main([str(tmp_path)]) == 0
    assert all((tmp_path / rel).read_text() == fn() for rel, fn in docgen.GENERATED.items())


# ---- the interpreter's NumPy noise stays in triton's interpreter ----

USER_SCRIPT = """
import os, warnings
os.environ["TRITON_INTERPRET"] = "1"
import torch
from rlk_triton.logp import selected_logp
x = torch.randn(4, 257) * 3
x[0, 5:] = float("-inf")  # masked lanes of -inf: the interpreter computes inf - inf and 0 * inf
lp, ent = selected_logp(x.requires_grad_(), torch.tensor([1, 2, 3, 4]), return_entropy=True)
(lp.sum() + ent.sum()).backward()
warnings.warn("the user's own RuntimeWarning", RuntimeWarning)
"""


@no_cuda
def test_interpreter_warnings_are_filtered_for_that_module_only():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    p = subprocess.run([sys.executable, "-c", USER_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "the user's own RuntimeWarning" in p.stderr
    assert "interpreter.py" not in p.stderr and "invalid value" not in p.stderr, p.stderr[-2000:]


# ---- rlk-triton check: counter, failures repeated, backend ids, JSON, capabilities told ----

def test_invariance_rows_use_the_registry_backend_ids():
    for op in registry.operators():
        ids = {b.backend_id for b in op.backends}
        for row_op in harness(op.name).row_ops("cpu", False):
            assert cli._row_backend_id(op, row_op) in ids, row_op.name


def _small_plan():
    """One failing parity case (a judge reporting twice the bound), one non-invariant row op (it
    subtracts the batch mean), one invariant one."""
    op = registry.operator("selected_logp")
    triton = [b for b in op.backends if b.name == "triton"][0]
    case = harness("selected_logp").parity_cases(False)[0]

    def rows(n, gen):
        return (torch.randn(n, 8, generator=gen),)

    bad = RowOp("selected_logp.triton[batch mean]", lambda x: (x - x.mean(0, keepdim=True),), rows, grad_inputs=(0,))
    good = RowOp("selected_logp.triton[twice]", lambda x: (2 * x,), rows, grad_inputs=(0,))
    return [("parity", op, triton, case), ("invariance", op, triton, bad), ("invariance", op, triton, good)]


@pytest.fixture
def small_check(monkeypatch):
    monkeypatch.setattr(cli, "_plan", lambda device, on_gpu: _small_plan())
    monkeypatch.setattr(cli, "_judge", lambda op: lambda case, device, backend: {"logp": 0.5, "grad": 2.0})
    registry.clear_check_failures()
    yield
    registry.clear_check_failures()


def test_check_report_is_actionable(capsys, small_check):
    rc, out, _ = _run(capsys, "check")
    lines = out.splitlines()
    assert rc == 1
    assert "3 checks: 1 parity, 2 invariance" in out
    assert [ln.split()[0:2] for ln in lines if ln.startswith("[")][:3] == [["[1/3]", "FAIL"], ["[2/3]", "FAIL"],
                                                                          ["[3/3]", "PASS"]]
    tail = lines[lines.index(next(ln for ln in lines if ln.startswith("2 failed"))):]
    looks = [ln.strip() for ln in tail if ln.strip().startswith("look at:")]
    assert len(looks) == 2
    assert "grad: error / bound 2" in looks[0] and "contracts/selected_logp.yaml" in looks[0]
    assert looks[1].startswith("look at: batch_size/") or looks[1].startswith("look at: ")
    assert any("max |diff|" in ln for ln in tail)
    assert re.fullmatch(r"1 passed, 2 failed  \(\d+\.\d s\)", lines[-1]), lines[-1]
    # capabilities in this process no longer claim what check found false here
    desc = {c["backend_id"]: c for c in registry.capabilities("cpu")}["selected_logp.triton"]
    assert set(desc["failed_here"]) == {"contract_accuracy", "batch_invariant"}
    assert not desc["strict_eligible"] and not desc["batch_invariant"] and "failed here" in desc["notes"]
    assert desc["claims_tested_by"] == "rlk-triton check"


def test_check_json_carries_versions_fingerprint_and_every_diff(capsys, small_check):
    rc, out, _ = _run(capsys, "check", "--json")
    report = json.loads(out)
    assert rc == 1 and not report["passed"] and report["total"] == len(report["rows"]) == 3
    assert {"python", "torch", "triton", "numpy", "blas", "cuda", "cpu"} <= set(report["versions"])
    assert report["versions"]["blas"] and report["versions"]["cpu"]
    assert len(report["fingerprint"]) == 16
    assert [(f["check"], f["property"]) for f in report["failures"]] == [("parity", "contract_accuracy"),
                                                                         ("invariance", "batch_invariant")]
    assert report["failures"][0]["worst_ratio"] == 2.0 and report["failures"][1]["max_abs_diff"] > 0
    for row in report["rows"]:
        assert row["backend"] == "selected_logp.triton"
        if row["check"] == "invariance":
            assert row["results"] and all("max_abs_diff" in r and "equal" in r for r in row["results"])
