"""The benchmark suite (rlk_triton/bench): `rlk-triton bench --quick` runs every case on this machine
and writes the one report format; failures are recorded, not raised; asv's classes wrap the same
cases; scripts and docs name only scripts that exist (or the commit a removed one is at)."""
import datetime
import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

from rlk_triton import cli, configs
from rlk_triton._runtime import default_arch
from rlk_triton.bench import FAMILIES, FORMAT, SIZES, select
from rlk_triton.bench import cases as bench_cases
from rlk_triton.bench.asv import classes
from rlk_triton.bench.cases import BASELINE_KINDS, CEILINGS, Baseline, Bound, Case
from rlk_triton.bench.report import Rates, run_case

ROOT = Path(__file__).resolve().parents[1]
ROW_FIELDS = {"op": str, "case": str, "shape": str, "dtype": str, "rlk_ms": float, "rlk_wall_ms": float,
              "baseline": str, "baseline_kind": str, "baseline_ms": float, "ratio": float, "time": str}
needs_cpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (interpreter) run of the suite")


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    status = cli.main(["bench", "--quick", "--json", str(path)])
    return status, json.loads(path.read_text())


@needs_cpu
def test_quick_run_writes_the_report_format(quick_report):
    status, r = quick_report
    assert status == 0 and r["errors"] == []
    assert r["format"] == FORMAT and r["size"] == "tiny" and r["gpu_figures"] is False and r["note"]
    assert datetime.date.fromisoformat(r["date"]) and r["commit"]
    assert r["config_fingerprint"] == configs.fingerprint(default_arch()) and r["arch"] == default_arch()
    assert r["versions"]["torch"] == torch.__version__ and r["versions"]["triton"]
    assert r["ops"] == list(FAMILIES)
    assert r["ceilings"]["copy_gbps"] > 0 and all(v > 0 for v in r["ceilings"]["matmul_tflops"].values())
    for row in r["rows"]:
        for name, kind in ROW_FIELDS.items():
            assert isinstance(row[name], kind), (name, row)
        assert row["time"] == "cpu" and row["baseline_kind"] in BASELINE_KINDS
        assert row["ratio"] == pytest.approx(row["baseline_ms"] / row["rlk_ms"])
    # every case ran: one ceiling row each, and at least one baseline beside it
    want = {(c.op, c.case, c.shape, c.dtype) for c in select(None, "tiny")}
    ceilings = [r_ for r_ in r["rows"] if r_["baseline_kind"] == "ceiling"]
    assert sorted((c["op"], c["case"], c["shape"], c["dtype"]) for c in ceilings) == sorted(want)
    assert all(set(c["work"]) <= {"bytes", "flops"} and c["baseline"] in CEILINGS.values() for c in ceilings)
    assert {(x["op"], x["case"], x["shape"], x["dtype"]) for x in r["rows"] if x["baseline_kind"] != "ceiling"} == want
    # --quick leaves torch.compile out, and says so
    compiled = [s for s in r["skipped"] if s["baseline"].startswith("torch.compile")]
    assert compiled and all("--quick" in s["why"] for s in compiled)


@needs_cpu
def test_usage_errors_name_the_argument(capsys):
    assert cli.main(["bench", "--op", "nope"]) == 2
    assert "op: no benchmark family 'nope'" in capsys.readouterr().err
    assert cli.main(["bench", "--op", "rope"]) == 2  # full GPU shapes on the interpreter: refused
    assert "quick:" in capsys.readouterr().err


def test_every_family_has_cases_at_every_size_with_unique_names():
    for size in SIZES:
        for op in FAMILIES:
            names = [c.name for c in select([op], size)]
            assert names and len(names) == len(set(names)), (op, size)  # asv's params
    assert [c.op for c in select(["rope", "matmul", "rope"], "tiny")] == ["rope"] * 2 + ["matmul"] * 2


def test_a_full_run_adds_torch_compile_and_skips_absent_competitors():
    (case,) = [c for c in select(["rmsnorm"], "tiny") if c.name.startswith("fwd [") and "+residual" not in c.name]
    full, quick = case.build("cpu", False), case.build("cpu", True)
    assert "compile" in {b.kind for b in full.baselines} and "compile" not in {b.kind for b in quick.baselines}
    # a family's other shapes leave torch.compile out (each shape compiles anew), and say so
    other = bench_cases._rmsnorm(4, 64, False, "fwd", False, torch.bfloat16, "cpu", False)
    assert "compile" not in {b.kind for b in other.baselines}
    assert any("main shape" in why for label, why in other.skipped if label.startswith("torch.compile"))
    liger = importlib.util.find_spec("liger_kernel") is not None
    assert ("liger" in {b.kind for b in full.baselines}) == liger
    assert any(label.startswith("Liger") and "not importable" in why for label, why in full.skipped) != liger


def _boom():
    raise RuntimeError("boom")


def test_failures_are_recorded_and_the_run_goes_on():
    good = Bound(lambda: torch.ones(4).sum(), "copy", 16, torch.float32, [Baseline("raises", "eager", _boom)])
    bad_baseline = Case("x", "fwd", "[4]", "float32", lambda device, quick: good)
    rows, skipped, errors = run_case(bad_baseline, "cpu", True, Rates("cpu"))
    assert [r["baseline_kind"] for r in rows] == ["ceiling"] and skipped == []
    assert [(e["what"], "boom" in e["error"]) for e in errors] == [("raises", True)]
    broken = Case("x", "fwd", "[4]", "float32", lambda device, quick: _boom())
    assert run_case(broken, "cpu", True, Rates("cpu"))[2][0]["what"] == "build"


def test_asv_classes_wrap_the_same_cases():
    times, ratio = classes("rmsnorm", size="tiny")
    names = [c.name for c in select(["rmsnorm"], "tiny")]
    assert (times.__name__, ratio.__name__) == ("Rmsnorm", "RmsnormRatio")
    assert times.params == [names] and ratio.params == [names, list(BASELINE_KINDS)]
    t = times()
    t.setup(names[0])
    assert t.track_device_ms(names[0]) > 0 and t.track_wall_ms(names[0]) > 0
    r = ratio()
    for kind in ("eager", "ceiling"):
        r.setup(names[0], kind)
        assert r.track_ratio(names[0], kind) > 0
    residual = [n for n in names if "+residual" in n][0]
    with pytest.raises(NotImplementedError):  # no Liger baseline with a fused residual: asv shows n/a
        r.setup(residual, "liger")


@needs_cpu
def test_asv_suite_covers_every_family_and_skips_without_a_gpu():
    spec = importlib.util.spec_from_file_location("suite", ROOT / "asv_bench" / "benchmarks" / "suite.py")
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    wrapped = {name for name, obj in vars(suite).items() if isinstance(obj, type) and not name.startswith("_")}  # as asv
    assert wrapped == {n + s for n in ("".join(p.title() for p in op.split("_")) for op in FAMILIES) for s in ("", "Ratio")}
    with pytest.raises(NotImplementedError):
        suite.Matmul().setup(suite.Matmul.params[0][0])


def test_the_device_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_run.sh")], check=True)


def test_named_scripts_exist_or_name_their_commit():
    """A doc, script or module that names scripts/X names one that exists, or the commit it is at
    ("scripts/X at <sha>"): removed scripts stay findable in git. docs/reports are history, not checked."""
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "scripts").iterdir(),
             *(ROOT / "rlk_triton").rglob("*.py"), *(ROOT / "contracts").glob("*.yaml"), *(ROOT / "tests").glob("*.py")]
    ref = re.compile(r"scripts/([\w.]+\.(?:py|sh))(\s+at\s+[0-9a-f]{7,40})?")
    dangling = [(f.relative_to(ROOT).as_posix(), m.group(1)) for f in files if f.is_file()
                for m in ref.finditer(f.read_text()) if not (ROOT / "scripts" / m.group(1)).exists() and not m.group(2)]
    assert not dangling, dangling
    gone = "scripts/" + "gone.py"  # split: this file is among those checked
    assert ref.search(f"see {gone}").group(2) is None and ref.search(f"see {gone} at b0aabeb").group(2)


def test_bracketed_ratios_cancel_a_drift_that_a_single_pair_does_not():
    """A machine that slows by 1% a timing (the H100 at its power limit): fn takes 10 ms and the
    baseline 9.7 when fresh. Each bracket's ratio is the fresh 0.97; one baseline-then-fn pair is not."""
    from rlk_triton.bench.timing import bracketed_ratios

    calls = []

    def timer(f):
        calls.append(f)
        return f() * (1 + 0.01 * (len(calls) - 1))

    fn, baseline = (lambda: 10.0), (lambda: 9.7)
    r = bracketed_ratios(fn, baseline, 3, timer)
    assert calls == [baseline, fn, baseline, fn, baseline, fn, baseline]
    assert len(r["ratios"]) == 3 and all(abs(x - 0.97) < 1e-12 for x in r["ratios"])
    assert r["median"] == sorted(r["ratios"])[1] and (r["min"], r["max"]) == (min(r["ratios"]), max(r["ratios"]))
    assert abs(timer(baseline) / timer(fn) - 0.97) > 0.005  # the single pair's bias the brackets remove
    jumped = iter([9.7, 10.0, 9.7, 12.0, 9.7, 10.0, 9.7])  # one bracket hit by a jump: the median skips it
    r = bracketed_ratios(fn, baseline, 3, lambda f: next(jumped))
    assert r["median"] == 0.97 and r["min"] < 0.81
    with pytest.raises(ValueError, match="k"):
        bracketed_ratios(fn, baseline, 0, timer)


def test_wall_ms_with_loops_sets_an_interrupted_loop_aside(monkeypatch):
    """Three loops of 4 calls on a fake clock; the second is slowed tenfold (the machine busy
    elsewhere): the median of the loops is the undisturbed 1 ms a call, one loop alone is what it hit."""
    from rlk_triton.bench import timing

    clock, count = [0.0], [0]

    def fn():  # call 1 warms up; calls 2-5, 6-9, 10-13 are the loops
        count[0] += 1
        clock[0] += 0.010 if 6 <= count[0] <= 9 else 0.001

    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    assert timing.wall_ms(fn, n=4, warmup=1, device="cpu", loops=3) == pytest.approx(1.0)
    assert count[0] == 13
    count[0] = 4  # the next loop starts at call 6: the slowed one
    assert timing.wall_ms(fn, n=4, warmup=1, device="cpu") == pytest.approx(10.0)
    with pytest.raises(ValueError, match="loops"):
        timing.wall_ms(fn, n=4, device="cpu", loops=0)
