"""reference/ and contracts/ ship in the wheel and load from an installed copy."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_carries_reference_and_contracts(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("rlk_triton-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for must in ("rlk_triton/reference/logp.py", "rlk_triton/contract_tables/selected_logp.yaml",
                 "rlk_triton/contract_tables/SCHEMA.md", "rlk_triton/ops/selected_logp.py",
                 "rlk_triton/bench/cases.py"):
        assert must in names, must
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    str(wheel)], check=True)
    probe = (
        "import rlk_triton, numpy as np\n"
        "assert rlk_triton.__file__.startswith(%r), rlk_triton.__file__\n"
        "from rlk_triton import contracts\n"
        "from rlk_triton.reference import selected_logp_reference\n"
        "print(contracts.judgment('selected_logp', 'bfloat16', 'forward_accuracy')['kind'])\n"
        "lp, ent = selected_logp_reference(np.zeros((1, 4)), np.array([2]))\n"
        "assert abs(lp[0] + np.log(4)) < 1e-15\n" % str(target)
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True,
                         env=env, cwd=tmp_path)
    assert out.stdout.strip() == "scaled_abs"
