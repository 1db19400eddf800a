"""scripts/plot_attention_report.py: the ratios it draws are the committed reports' timings."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import plot_attention_report as plot_report  # noqa: E402

H100 = ROOT / "docs/reports/h100-attention-2026-12-05.json"
H200 = ROOT / "docs/reports/h200-attention-2026-12-05.json"


def test_ratios_are_baseline_over_ours():
    report = json.loads(H100.read_text())
    shapes, by_pass = plot_report.ratios(report)
    assert len(shapes) == len({r["shape"] for r in report["varlen"]})
    for p in ("fwd", "fwd+bwd"):
        default = by_pass[p]["SDPA default (cudnn)"]
        rows = {r["shape"]: r for r in report["sdpa"] if r["pass"] == p}
        for shape, v in zip(shapes, default):
            if shape in rows:
                assert v == pytest.approx(rows[shape]["sdpa_default_ms"] / rows[shape]["rlk_ms"])
            else:  # the packed mixed batch: no SDPA row, only torch's varlen_attn
                assert v is None and "mixed" in shape
        varlen = {r["shape"]: r for r in report["varlen"] if r["pass"] == p}
        assert by_pass[p]["torch varlen_attn"] == [
            pytest.approx(varlen[s]["stock_varlen_ms"] / varlen[s]["rlk_ms"]) for s in shapes]


def test_plot_writes_both_report_formats(tmp_path):
    pytest.importorskip("matplotlib")
    for src in (H100, H200):  # "sdpa" and "varlen" rows; the older "rows_sdpa" without varlen
        out = tmp_path / f"{src.stem}.png"
        assert plot_report.main([str(src), "--out", str(out)]) == 0
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    h200 = json.loads(H200.read_text())
    shapes, by_pass = plot_report.ratios(h200)
    assert shapes == list(dict.fromkeys(r["shape"] for r in h200["rows_sdpa"]))
    assert "torch varlen_attn" not in by_pass["fwd"] and None not in by_pass["fwd"]["SDPA default (cudnn)"]
