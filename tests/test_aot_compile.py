"""The kernels with changes not yet run on a GPU compile for the H200 (sm90) here, with their locked
configs, inside its shared memory (scripts/aot_compile_check.py; ptxas ships in the triton wheel).
Runs in a subprocess: it needs the real JIT functions, not the interpreter's.

It compiles with this environment's triton. The H200 runs triton 3.6, whose sm90 passes can refuse
what a newer one compiles (a branch in linear_logp's persistent forward did: docs/linear_logp.md), so
before a GPU session run it against that version too: RLK_AOT_TRITON=<a directory holding triton 3.6,
e.g. pip install --no-deps --target DIR triton==3.6.0> puts it first on the subprocess's path."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_changed_kernels_compile_for_sm90_within_shared_memory(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    out = tmp_path / "aot.json"
    env = dict(os.environ)
    if os.environ.get("RLK_AOT_TRITON"):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (os.environ["RLK_AOT_TRITON"], env.get("PYTHONPATH"))))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "aot_compile_check.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert out.exists(), proc.stderr[-2000:]
    report = json.loads(out.read_text())
    if os.environ.get("RLK_AOT_TRITON"):
        assert report["triton"].startswith("3.6"), report["triton"]  # the H200's compiler, not this one's
    rows = report["rows"]
    assert rows and all(r["fits_h200"] for r in rows), [r for r in rows if not r["fits_h200"]]
    assert proc.returncode == 0
    # saved="logits": the forward's store of the relative logits and the backward's load of them are
    # 16-byte vectors, as d logits' tile store is. An unspecialized column bound or offset (save_cols,
    # c0: the compiler cannot prove 8-column groups whole and aligned) made each one 2-byte access per
    # element, 8x the instructions (the store from e5210ae, the load from its start, to this test).
    by_label = {r["kernel"]: r for r in rows}
    for label, kind in (("linear_logp _tile_stats_kernel (descriptors, saved logits)", "st"),
                        ("linear_logp _dlogits_kernel (descriptors)", "st"),
                        ("linear_logp _dlogits_saved_kernel", "ld")):
        seen = by_label[label]["global_stores" if kind == "st" else "global_loads"]
        assert f"{kind}.global.v4.b32" in seen and f"{kind}.global.b16" not in seen, (label, seen)
