"""asv's history pictures (rlk_triton/bench/history.py): results read in commit-date order, unmeasured
values left out, and the committed docs/asv/ generated from the committed asv_bench/results/."""
import json
import math
from pathlib import Path

import pytest

from rlk_triton.bench import history

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25",
           "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]


def _run(tmp, machine, sha, date_ms, values):
    row = [list(values.values()), [[repr(c) for c in values]], "v", 0, 1.0] + [None] * 8
    d = tmp / machine
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{sha[:8]}-existing.json").write_text(json.dumps({
        "commit_hash": sha, "date": date_ms, "result_columns": COLUMNS, "version": 2,
        "results": {"suite.Decode.track_device_ms": row, "suite.Empty.track_device_ms": [None, [], "v"] + [None] * 10}}))
    (d / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))


def test_load_orders_by_commit_date_and_drops_unmeasured(tmp_path):
    _run(tmp_path, "m", "b" * 40, 2_000, {"a": 2.0, "b": float("nan"), "c": None})
    _run(tmp_path, "m", "a" * 40, 1_000, {"a": 3.0, "b": 1.5, "c": None})
    h = history.load(tmp_path, "m")
    assert list(h) == ["suite.Decode.track_device_ms"]
    assert [(p.commit[0], p.value) for p in h["suite.Decode.track_device_ms"]["a"]] == [("a", 3.0), ("b", 2.0)]
    assert [p.value for p in h["suite.Decode.track_device_ms"]["b"]] == [1.5]
    assert "c" not in h["suite.Decode.track_device_ms"]
    assert [c for c, _ in history.commits_in_order(h)] == ["a" * 40, "b" * 40]
    md = history.markdown(h, history.commits_in_order(h), "m", {})
    assert "| a | 3 | 2 |" in md and "| b | 1.5 |  |" in md and "![suite.Decode.track_device_ms](Decode.png)" in md


def test_main_writes_a_chart_per_family(tmp_path):
    pytest.importorskip("matplotlib")
    _run(tmp_path, "m", "a" * 40, 1_000, {"x": 1.0})
    _run(tmp_path, "m", "b" * 40, 2_000, {"x": 0.5})
    assert history.main(["--results", str(tmp_path), "--machine", "m", "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "Decode.png").read_bytes()[:4] == b"\x89PNG"
    assert "## Decode" in (tmp_path / "out" / "index.md").read_text()


def test_committed_history_pages_match_the_committed_results():
    h = history.load(ROOT / "asv_bench" / "results", "h200")
    commits = history.commits_in_order(h)
    assert len(commits) >= 3, "docs/asv should show a trend over at least three commits measured on the H200"
    committed = (ROOT / "docs" / "asv" / "index.md").read_text()
    generated = history.markdown(h, commits, "h200", {})
    # the per-family tables (the commit list's subjects come from git, so compare from the first family on)
    assert committed[committed.index("\n## "):] == generated[generated.index("\n## "):]
    for bench in h:
        assert (ROOT / "docs" / "asv" / f"{history.family(bench)}.png").exists()
    assert all(math.isfinite(p.value) for cases in h.values() for pts in cases.values() for p in pts)
