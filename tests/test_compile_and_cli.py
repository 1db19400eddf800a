"""torch.compile sees the custom ops; the CLI runs; temperature is a runtime value."""
import json
import os
import subprocess
import sys

import pytest
import torch

from rlk_triton.logp import selected_logp
from rlk_triton.testing.parity import make_logits


def test_selected_logp_under_torch_compile(device):
    x = make_logits(4, 300, torch.float32, 3.0, torch.Generator().manual_seed(0), device)
    t = torch.randint(0, 300, (4,)).to(device)

    def f(x, t):
        lp, ent = selected_logp(x, t, temperature=0.8, return_entropy=True, validate=False)
        return (lp + 0.1 * ent).sum()

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    ya, yb = f(xa, t), compiled(xb, t)
    ya.backward()
    yb.backward()
    assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)


def test_cli_check_json():
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-m", "rlk_triton.cli", "check", "--json"], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    # a native backend is held to the Triton kernel's bits by its own gate: one "available" row for it
    assert report["passed"] and {r["check"] for r in report["rows"] if not r["backend"].endswith(".cuda_native")} == {
        "parity", "invariance"}
    assert {r["check"] for r in report["rows"] if r["backend"].endswith(".cuda_native")} == {"available"}
    assert report["total"] == len(report["rows"]) and report["failures"] == []
    assert {"python", "torch", "triton", "numpy", "blas", "cuda", "cpu"} <= set(report["versions"])
    assert report["fingerprint"] and all(r["results"] for r in report["rows"] if r["check"] == "invariance")
    from rlk_triton import registry

    ids = {b.backend_id: op.name for op in registry.operators() for b in op.backends}
    assert all(ids.get(r["backend"]) == r["op"] for r in report["rows"])  # one spelling: the registry's ids
    checked = {(r["op"], r["backend"], r["check"]) for r in report["rows"]}
    for op in ("selected_logp", "ratio_kl", "policy_loss", "gae", "group_advantages"):
        for backend in ("triton", "torch_reference"):
            assert {(op, f"{op}.{backend}", "parity"), (op, f"{op}.{backend}", "invariance")} <= checked


def test_cli_configs():
    out = subprocess.run([sys.executable, "-m", "rlk_triton.cli", "configs", "--json"], capture_output=True,
                         text=True, check=True)
    data = json.loads(out.stdout)
    assert len(data["fingerprint"]) == 16 and data["table"]


def _compiled_variants(kernel) -> int:
    """How many binaries Triton holds for a @triton.jit kernel (triton 3.x: device_caches)."""
    caches = getattr(kernel, "device_caches", None)
    assert caches is not None, "this Triton keeps no device_caches: update the probe"
    return sum(len(per_device[0]) for per_device in caches.values())


@pytest.mark.gpu
def test_changing_temperature_never_recompiles():
    from rlk_triton.ops.selected_logp import _bwd_kernel, _fwd_kernel, _fwd_merge_kernel

    kernels = (_fwd_kernel, _fwd_merge_kernel, _bwd_kernel)
    # V = 5000: one vocab chunk; V = 151936: the split forward and its merge kernel
    xs = [torch.randn(8, V, device="cuda", dtype=torch.bfloat16, requires_grad=True) for V in (5000, 151936)]
    ts = [torch.randint(0, x.shape[-1], (8,), device="cuda") for x in xs]
    for x, t in zip(xs, ts):
        selected_logp(x, t, temperature=1.0).sum().backward()
    before = tuple(_compiled_variants(k) for k in kernels)
    assert min(before) >= 1
    for T in (0.3, 0.7, 1.3, 2.0, 1, 16.0):
        for x, t in zip(xs, ts):
            selected_logp(x, t, temperature=T).sum().backward()
    assert tuple(_compiled_variants(k) for k in kernels) == before


@pytest.mark.gpu
def test_runs_on_the_current_stream():
    x = torch.randn(64, 32000, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, 32000, (64,), device="cuda")
    ref = selected_logp(x, t)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = selected_logp(x, t)
    s.synchronize()
    assert torch.equal(out, ref)


def test_cli_capabilities_json_and_table():
    out = subprocess.run([sys.executable, "-m", "rlk_triton.cli", "capabilities", "--json"], capture_output=True,
                         text=True, check=True)
    caps = json.loads(out.stdout)
    ids = {c["backend_id"] for c in caps}
    assert {"selected_logp.triton", "selected_logp.torch_reference", "policy_loss.torch_reference",
            "group_advantages.triton"} <= ids and all(c["available"] for c in caps if c["backend_class"] != "native")
    # native backends: available only with an admission on a GPU (tests/test_native.py), else they say why
    assert all(c["available"] == c["strict_eligible"] and (c["available"] or c["unavailable_reason"])
               for c in caps if c["backend_class"] == "native")
    table = subprocess.run([sys.executable, "-m", "rlk_triton.cli", "capabilities"], capture_output=True,
                           text=True, check=True).stdout
    assert "selected_logp.torch_reference" in table and "available" in table
    native = next(line for line in table.splitlines() if line.startswith("selected_logp.cuda_native"))
    assert "ranked first for eager calls of <= 64 rows" in native  # the measured small-call rank is shown


def test_cli_resolve_prints_the_record_and_fails_closed():
    ok = subprocess.run([sys.executable, "-m", "rlk_triton.cli", "resolve", "selected_logp", "--dtype", "bfloat16",
                         "--fast", "auto", "--consistency", "strict"], capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["chosen"].startswith("selected_logp.")
    bad = subprocess.run([sys.executable, "-m", "rlk_triton.cli", "resolve", "selected_logp", "--dtype", "float64",
                          "--consistency", "strict"], capture_output=True, text=True)
    assert bad.returncode == 1 and json.loads(bad.stdout)["status"] == "error"
