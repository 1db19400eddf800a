"""The attention tile sweep (scripts/gpu_attention_tiles.py) runs end to end on the interpreter: the
candidate rows take effect at the launch, the gradients are compared, the table is restored."""
import json
from pathlib import Path

import pytest
import torch

from rlk_triton import configs

SCRIPTS = str(Path(__file__).resolve().parents[1] / "scripts")


@pytest.fixture
def script(monkeypatch):
    monkeypatch.syspath_prepend(SCRIPTS)
    import gpu_attention_tiles

    return gpu_attention_tiles


def test_attention_tiles_script_smoke(tmp_path, script):
    if torch.cuda.is_available():
        pytest.skip("the smoke mode is the CPU stand-in; on GPUs run the script itself")
    before = dict(configs.LOCKED_CONFIGS)
    out = tmp_path / "tiles.json"
    assert script.main(["--smoke", "--dims", "16", "--max-candidates", "1", "--confirm", "0", "--seqlen", "32",
                        "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["table_restored"] and configs.LOCKED_CONFIGS == before
    rows = report["dims"][0]["rows"]
    assert sorted(r["kernel"] for r in rows) == ["attention_bwd_dkdv", "attention_bwd_dq"]
    assert all(r["deterministic"] and r["agrees"] and r["bwd_ms"] > 0 for r in rows), rows
    assert report["dims"][0]["sdpa"]["bwd_ms"] > 0


def test_candidates_nearest_first_without_the_locked_tile(script):
    locked = configs.MatmulConfig(64, 64, 0, 1, 4, 2, split_min_len=2048)
    cands = script.candidates(locked, (32, 64, 128), (4, 8), (1, 2, 3), 128, 450.0)
    assert len(cands) == 3 * 3 * 2 * 3 - 1 and locked not in [c for c, _ in cands]
    assert all(c.split_min_len == 2048 for c, _ in cands)
    changed = [sum(getattr(c, f) != getattr(locked, f) for f in script.FIELDS) for c, _ in cands]
    assert changed == sorted(changed)
