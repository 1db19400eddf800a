"""scripts/plot_host_overhead_report.py: the committed report's rows split into forward and
forward + backward panels, the autograd floor row found and drawn in neither."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import plot_host_overhead_report as plot_report  # noqa: E402

H100 = ROOT / "docs/reports/h100-host-overhead-2026-12-06-92ea477.json"


def test_panels_split_the_rows_and_find_the_floor():
    report = json.loads(H100.read_text())
    fwd, bwd, floor = plot_report.panels(report)
    assert floor is not None and floor["op"] == "torch" and floor not in fwd + bwd
    assert len(fwd) + len(bwd) + 1 == len(report["rows"])
    assert all("bwd" not in r["case"] for r in fwd) and all("bwd" in r["case"] for r in bwd)
    # each fwd+bwd row's floor target is its target plus the floor per call of its timed step
    for r in bwd:
        per_step = r.get("calls_per_step", 1)
        assert r["target_beyond_autograd_floor_ms"] == pytest.approx(
            r["target_ms"] + floor["torch_eager_wall_ms"] / per_step, rel=1e-12)


def test_a_report_without_the_floor_is_refused(tmp_path):
    pytest.importorskip("matplotlib")
    report = json.loads(H100.read_text())
    report["rows"] = [r for r in report["rows"] if r["op"] != "torch"]
    with pytest.raises(ValueError, match="floor"):
        plot_report.plot(report, tmp_path / "x.png")


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "host.png"
    assert plot_report.main([str(H100), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rows_outside_the_targets_scope_are_hatched_and_the_verdict_titled(tmp_path, monkeypatch):
    """A forward row below 1M elements (in_issue_scope False) is drawn hatched; a report with a verdict
    says in its title whether the issue's targets are all met."""
    plt = pytest.importorskip("matplotlib.pyplot")
    report = json.loads(H100.read_text())
    fwd, _, _ = plot_report.panels(report)
    for i, r in enumerate(fwd):
        r["in_issue_scope"] = i != 0
    fig, ax = plt.subplots()
    plot_report._panel(ax, fwd, with_floor=False)
    assert [bar.get_hatch() for bar in ax.patches[:2]] == ["//", None]
    plt.close(fig)
    titles = []

    def finish(fig, rep, what, path):
        titles.append(what)
        plt.close(fig)
        return path
    monkeypatch.setattr(plot_report.report_figure, "finish", finish)
    for meets in (True, False):
        plot_report.plot(report | {"verdict": {"meets": meets}}, tmp_path / "x.png")
    assert titles == ["host overhead of eager calls (issue targets: all met)",
                      "host overhead of eager calls (issue targets: not all met)"]
