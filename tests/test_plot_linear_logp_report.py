"""scripts/plot_linear_logp_report.py: the speeds it draws are the committed reports' timings."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import plot_linear_logp_report as plot_report  # noqa: E402

H100 = ROOT / "docs/reports/h100-linear-logp-2026-12-05-first-range.json"
H100_PARTIAL = ROOT / "docs/reports/h100-linear-logp-2026-12-05.json"  # has saved_vocab rows too
H200 = ROOT / "docs/reports/h200-linear-logp-2026-12-04.json"


@pytest.mark.parametrize("src", (H100, H100_PARTIAL, H200))
def test_speeds_are_eager_over_ours_and_over_the_bound(src):
    report = json.loads(src.read_text())
    shapes, data = plot_report.speeds(report)
    rows = {(r["shape"], r["mode"]): r for r in report["rows"]}
    assert shapes == list(dict.fromkeys(r["shape"] for r in report["rows"]))
    for mode in ("recompute", "logits"):
        for s, speed, bound, gib in zip(shapes, data[mode]["speed"], data[mode]["bound_speed"],
                                        data[mode]["extra_gib"]):
            r = rows[(s, mode)]
            assert speed == pytest.approx(r["eager_ms"] / r["rlk_ms"]) == pytest.approx(r["vs_eager"])
            assert bound == pytest.approx(r["eager_ms"] / r["gemm_bound_ms"])
            assert gib == r["extra_gib"]
    assert data["eager"]["extra_gib"] == [rows[(s, "recompute")]["eager_extra_gib"] for s in shapes]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    for src in (H100, H200):
        out = tmp_path / f"{src.stem}.png"
        assert plot_report.main([str(src), "--out", str(out)]) == 0
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
