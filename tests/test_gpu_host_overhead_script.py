"""scripts/gpu_host_overhead.py's bookkeeping on the CPU, with the GPU parts stubbed (cases, device
time, wall time, the launch paths): a device call is scarce, so what the script computes from its
timings (targets, autograd's floor, the loops behind every wall) is checked here, not there."""
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import gpu_host_overhead as script  # noqa: E402

DEVICE_MS = 0.010  # every case's: target max(1.25 x 0.010, 0.010 + 0.030) = 0.040 ms
FLOOR_WALL_MS = 0.080


def _bound(wall_ms, torch_ms, elements=3):
    out, source = torch.ones(3), torch.zeros(elements)
    rlk = lambda: (out + source.reshape(-1)[:3], [out * 2])  # noqa: E731 - a call's nested outputs
    rlk.wall_ms = wall_ms
    eager = lambda: out  # noqa: E731
    eager.wall_ms = torch_ms
    return SimpleNamespace(rlk=rlk, baselines=[SimpleNamespace(kind="eager", fn=eager)])


@pytest.fixture
def run(monkeypatch, tmp_path):
    """Runs main() on stub cases: (report, [(path, loops) of every wall timed]). Keyword arguments set
    the forward quick case's wall and the named rms_norm row's (ms)."""
    walls, path = [], ["eager"]

    def wall_ms(fn, device="cuda", loops=1, **_):
        walls.append((path[0], loops))
        return getattr(fn, "wall_ms", FLOOR_WALL_MS)

    def case(op, name, wall, torch_ms, elements=3):
        return SimpleNamespace(op=op, name=name, build=lambda device, quick: _bound(wall, torch_ms, elements))

    monkeypatch.setattr(script, "header", lambda *a: {})
    monkeypatch.setattr(script, "device_ms", lambda fn, device: (DEVICE_MS, "device"))
    monkeypatch.setattr(script.timing, "wall_ms", wall_ms)
    monkeypatch.setattr(script, "_path", lambda name: path.__setitem__(0, name))
    monkeypatch.setattr(script.cases, "autograd_floor", lambda device: (lambda: None))
    for name in ("_policy_loss", "_selected_logp", "_matmul"):
        monkeypatch.setattr(script.cases, name, lambda *a: _bound(0.030, 0.100))
    monkeypatch.setattr(script, "_rmsnorm_chain", lambda N, H, k: _bound(0.030 * k, 0.100 * k))

    def go(*argv, fwd_wall=0.050, norm_wall=0.030):
        monkeypatch.setattr(script.cases, "_rmsnorm", lambda *a: _bound(norm_wall, 0.100))
        monkeypatch.setattr(script.cases, "select", lambda families, size: [
            case("swiglu", "fwd [4 x 8] bfloat16", fwd_wall, 0.060, elements=2_000_000),
            case("rope", "fwd+bwd [4 x 8] bfloat16", 0.100, 0.300, elements=2_000_000)])
        out = tmp_path / "host.json"
        monkeypatch.setattr(sys, "argv", ["gpu_host_overhead.py", "--json", str(out), *argv])
        assert script.main() == 0
        return json.loads(out.read_text()), walls
    return go


def test_every_timed_wall_is_the_median_of_the_loops_asked_for(run):
    report, walls = run("--loops", "3")
    warm_ups = [path for path, loops in walls if loops == 1]  # one loop per case before its timed paths
    assert report["wall_loops"] == 3 and warm_ups == ["eager"] * (len(report["rows"]) - 1)
    assert all(loops in (1, 3) for _, loops in walls)
    paths = {p for p, _ in walls}
    assert paths == {"eager", "no launch cache", "descriptors re-encoded", "tensors to the launcher", "no templates",
                     "dispatcher"}


def test_targets_and_autograd_floor(run):
    report, _ = run()
    floor, *rows = report["rows"]
    assert floor["op"] == "torch" and floor["torch_eager_wall_ms"] == FLOOR_WALL_MS
    by_case = {r["case"]: r for r in rows}
    target = max(1.25 * DEVICE_MS, DEVICE_MS + 0.030)
    fwd, bwd = by_case["fwd [4 x 8] bfloat16"], by_case["fwd+bwd [4 x 8] bfloat16"]
    assert fwd["target_ms"] == pytest.approx(target) and not fwd["meets_target"]  # 0.050 > 0.040
    assert "target_beyond_autograd_floor_ms" not in fwd and "wall_eager_backward_on_caller_ms" not in fwd
    assert bwd["target_beyond_autograd_floor_ms"] == pytest.approx(target + FLOOR_WALL_MS)
    assert not bwd["meets_target"] and bwd["meets_target_beyond_autograd_floor"]  # 0.100 <= 0.120
    assert bwd["torch_eager_wall_ms"] == 0.300 and bwd["backward_on_caller_bitwise"]
    chain = by_case["fwd+bwd [16384 x 4096], 8 chained, per call"]  # times per call of the step's 8
    assert chain["calls_per_step"] == 8 and chain["device_ms"] == pytest.approx(DEVICE_MS / 8)
    assert chain["wall_eager_ms"] == pytest.approx(0.030) and chain["meets_target"]
    assert chain["target_beyond_autograd_floor_ms"] == pytest.approx(chain["target_ms"] + FLOOR_WALL_MS / 8)
    assert all(r["launch_cache_bitwise"] for r in rows)



def test_elements_and_the_verdict_on_the_issues_targets(run):
    """A forward row of >= 1M elements over its target fails the verdict; the named rows are judged
    by their own targets (policy_loss against eager torch, rms_norm against 2x its device time)."""
    report, _ = run()
    by_case = {r["case"]: r for r in report["rows"]}
    assert by_case["fwd [4 x 8] bfloat16"]["elements"] == 2_000_000
    assert by_case["M=1 N=4096 K=4096 (a @ w.t())"]["elements"] == 3  # the stub touches 3-element tensors
    assert by_case["fwd [4 x 8] bfloat16"]["in_issue_scope"] and not by_case["M=1 N=4096 K=4096 (a @ w.t())"][
        "in_issue_scope"]
    assert all("in_issue_scope" not in r for r in report["rows"] if "bwd" in r["case"] or r["op"] == "torch")
    v = report["verdict"]
    assert v["forward_rows_in_scope"] == 1 and v["forward_rows_missing_target"] == ["swiglu fwd [4 x 8] bfloat16"]
    assert v["policy_loss_wall_over_eager_torch"] == pytest.approx(0.3)
    assert v["rmsnorm_wall_over_device"] == pytest.approx(3.0) and not v["meets"]
    assert run(fwd_wall=0.020, norm_wall=0.015)[0]["verdict"]["meets"]  # both within: 1.5x device
    assert not run(fwd_wall=0.020, norm_wall=0.030)[0]["verdict"]["meets"]  # rms_norm at 3x device
