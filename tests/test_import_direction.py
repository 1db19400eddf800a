"""Imports point one way (../shared/DESIGN.md): ops <- operators <- registry / policy / audit <- models
<- testing <- cli. Nothing at runtime imports the test harness (rlk_triton.testing); the kernels in
ops/ import nothing above them. Checked on every module's source with ast, function-local imports
included; the registry reaches the harness's probes only by name (registry.HARNESS_MODULE)."""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "rlk_triton"
ABOVE_OPS = ("registry", "policy", "audit", "models", "testing", "cli", "drift", "probe", "operators", "bench")


def _module(path: Path) -> str:
    return ".".join(("rlk_triton",) + path.relative_to(PKG).with_suffix("").parts).removesuffix(".__init__")


def imported(source: str, module: str, is_package: bool = False) -> set:
    """Absolute names of every rlk_triton module `source` (the text of `module`) imports, anywhere in it."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[:len(base) - node.level + 1]
                name = ".".join(parent + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out |= {f"{name}.{a.name}" for a in node.names}  # `from . import testing` imports a module too
    return {n for n in out if n == "rlk_triton" or n.startswith("rlk_triton.")}


def _sources():
    for path in sorted(PKG.rglob("*.py")):
        yield _module(path), path.name == "__init__.py", path.read_text()


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


@pytest.mark.parametrize("module,is_package,source", list(_sources()), ids=lambda x: x if isinstance(x, str) and
                         x.startswith("rlk_triton") else "")
def test_runtime_never_imports_the_harness(module, is_package, source):
    if _layer(module) in ("testing", "cli"):
        return
    bad = sorted(n for n in imported(source, module, is_package) if n == "rlk_triton.testing"
                 or n.startswith("rlk_triton.testing."))
    assert not bad, f"{module} imports the test harness: {bad}"


@pytest.mark.parametrize("module,is_package,source", [s for s in _sources() if _layer(s[0]) == "ops"],
                         ids=lambda x: x if isinstance(x, str) and x.startswith("rlk_triton") else "")
def test_ops_import_nothing_above_them(module, is_package, source):
    bad = sorted(n for n in imported(source, module, is_package) if _layer(n) in ABOVE_OPS)
    assert not bad, f"{module} imports above ops/: {bad}"


def test_the_check_sees_every_kind_of_import():
    """The checker itself: absolute, relative, aliased and function-local imports of the harness."""
    src = """
import rlk_triton.testing.parity as p
def f():
    from .testing import harness
    from ..testing.rowwise import rmsnorm_harness
    from . import testing
"""
    names = imported(src, "rlk_triton.ops.x")
    assert {"rlk_triton.testing.parity", "rlk_triton.ops.testing", "rlk_triton.testing.rowwise",
            "rlk_triton.testing.rowwise.rmsnorm_harness"} <= names
    assert "rlk_triton.testing.harness" in imported(src, "rlk_triton.registry")
    assert "rlk_triton.testing" in imported("from . import testing", "rlk_triton.registry")
    assert imported("import torch\nfrom typing import Any", "rlk_triton.registry") == set()
