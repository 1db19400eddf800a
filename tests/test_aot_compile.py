"""The kernels with changes not yet run on a GPU compile for the H200 (sm90) here, with their locked
configs, inside its shared memory (scripts/aot_compile_check.py; ptxas ships in the triton wheel).
Runs in a subprocess: it needs the real JIT functions, not the interpreter's."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_changed_kernels_compile_for_sm90_within_shared_memory(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    out = tmp_path / "aot.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "aot_compile_check.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r["fits_h200"] for r in rows), [r for r in rows if not r["fits_h200"]]
    assert proc.returncode == 0
