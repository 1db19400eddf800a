"""scripts/plot_native_report.py: the pairs it draws are the committed report's rows of one call on
both backends."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import plot_native_report as plot_report  # noqa: E402

H200 = ROOT / "docs/reports/h200-native-2026-12-06.json"


def test_pairs_are_one_call_on_both_backends():
    report = json.loads(H200.read_text())
    ps = plot_report.pairs(report)
    kinds = {p["kind"] for p in ps}
    assert kinds == {"launch", "backward launch", "public call"}
    for p in ps:
        t, n = p["triton"], p["native"]
        assert (t["op"], t["shape"]) == (n["op"], n["shape"]) == (p["op"], p["shape"])
        assert ("native" not in t["backend"] and "cuda_native" not in t["backend"]) and \
            ("native" in n["backend"])
        assert p["bare"] is None or (p["kind"] == "launch" and p["bare"]["backend"] == "bare extension call")
    # every Triton launch row of the report has its native partner
    launches = [r for r in report["rows"] if r["backend"] in ("triton launch", "triton backward launch")]
    assert len(launches) == sum(p["kind"] != "public call" for p in ps)


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "native.png"
    assert plot_report.main([str(H200), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
