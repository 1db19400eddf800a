"""`rlk-triton drift` end to end on the embedded tiny model: rlk bitwise, the control group measured."""
import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")


def test_drift_command_reports_rlk_bitwise_and_the_control_group(tmp_path, capsys):
    from rlk_triton import cli

    out, chart = tmp_path / "drift.json", tmp_path / "drift.png"
    status = cli.main(["drift", "--num-prompts", "3", "--new-tokens", "3", "--max-num-seqs", "2",
                       "--chunk-size", "4", "--json", str(out), "--chart", str(chart)])
    report = json.loads(out.read_text())
    assert status == 0, capsys.readouterr().out
    rlk, control = report["rlk"], report["control"]
    assert rlk["bitwise"] is True and rlk["max_abs_dlogp"] == 0 and rlk["tokens"] == 9
    assert rlk["first_divergent_op"] is None
    assert control["tokens"] == 9 and control["max_abs_dlogp"] is not None
    for key in ("model", "device", "versions", "config_fingerprint", "seed"):
        assert key in report
    assert chart.stat().st_size > 10_000
    assert "rlk: every token's rollout logp equals its training logp" in capsys.readouterr().out
