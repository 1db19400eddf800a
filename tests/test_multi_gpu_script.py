"""The multi-GPU deliverable (scripts/multi_gpu_linear_logp.py) runs end to end on CPU processes."""
import json
from pathlib import Path

import pytest
import torch

SCRIPTS = str(Path(__file__).resolve().parents[1] / "scripts")


@pytest.fixture
def script(monkeypatch):
    monkeypatch.syspath_prepend(SCRIPTS)  # spawned ranks inherit sys.path and import it by name
    import multi_gpu_linear_logp

    return multi_gpu_linear_logp


def test_multi_gpu_script_smoke(tmp_path, script):
    if torch.cuda.is_available():
        pytest.skip("the smoke mode is the CPU stand-in; on GPUs run the script itself")
    out = tmp_path / "report.json"
    assert script.main(["--smoke", "--world-sizes", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    run = report["runs"]["2"]
    assert run["bitwise_all"] and run["unaligned_within_contract"]
    assert run["attention_cp_chained_bitwise"] and run["attention_cp_merged_within_contract"]
    assert [r["shard"][0] % r["chunk_v"] for r in run["ranks"]] == [0, 0]


def test_aligned_bounds_start_on_the_chunk_grid(script):
    b = script.aligned_bounds(151936, 4, 4096)
    assert b[0] == 0 and b[-1] == 151936 and all(s % 4096 == 0 for s in b[:-1]) and b == sorted(b)
