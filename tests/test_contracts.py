"""contracts/: schema, fail-closed lookups, overrides, and the judgments' arithmetic."""
import pytest
import torch

from rlk_triton import contracts
from rlk_triton.errors import ContractError, ContractSchemaError


def test_every_table_validates():
    assert "selected_logp" in contracts.available_ops()
    for op in contracts.available_ops():
        data = contracts.load(op)
        for dt in data["dtypes"]:
            for name in contracts.JUDGMENTS:
                assert contracts.judgment(op, dt, name)["kind"]


@pytest.mark.parametrize("op,dtype,name,missing", [
    ("no_such_op", torch.float32, "forward_accuracy", "no_such_op"),
    ("selected_logp", torch.float64, "forward_accuracy", "float64"),
    ("selected_logp", torch.bfloat16, "backward_accuracy", "backward_accuracy"),
])
def test_lookups_fail_closed_naming_what_is_missing(op, dtype, name, missing):
    with pytest.raises(ContractError) as e:
        contracts.judgment(op, dtype, name)
    assert missing in str(e.value)


def test_arch_override_replaces_only_its_row():
    base = contracts.judgment("selected_logp", torch.bfloat16, "gradient_accuracy")
    interp = contracts.judgment("selected_logp", torch.bfloat16, "gradient_accuracy", "interpreter")
    assert interp["rtol"] == 2 * base["rtol"]
    assert contracts.judgment("selected_logp", torch.bfloat16, "forward_accuracy", "interpreter") == \
        contracts.judgment("selected_logp", torch.bfloat16, "forward_accuracy")
    assert contracts.judgment("selected_logp", torch.float32, "gradient_accuracy", "sm90") == \
        contracts.judgment("selected_logp", torch.float32, "gradient_accuracy")
    assert contracts.contract_id("selected_logp", torch.bfloat16, "interpreter") != \
        contracts.contract_id("selected_logp", torch.bfloat16, "sm90")


def test_gradient_rtol_is_the_unit_roundoff():
    for dt, bits in ((torch.bfloat16, 8), (torch.float16, 11), (torch.float32, 24)):
        assert contracts.judgment("selected_logp", dt, "gradient_accuracy")["rtol"] == 2.0**-bits


def _table():
    row = {"kind": "scaled_abs", "outputs": {"logp": {"atol": 0.0, "rtol": 1e-7}}}
    grad = {"kind": "rounding_plus_sensitivity", "atol": 0.0, "rtol": 1e-3, "row_rtol": 1e-7}
    return {"schema_version": 1, "op": "x", "dtypes": {"float32": {
        "forward_accuracy": row, "forward_invariance": {"kind": "bitwise"},
        "gradient_accuracy": grad, "gradient_invariance": {"kind": "bitwise"}}}}


@pytest.mark.parametrize("breakage", [
    lambda t: t.update(schema_version=2),
    lambda t: t.update(op="y"),
    lambda t: t["dtypes"]["float32"].pop("gradient_invariance"),
    lambda t: t["dtypes"]["float32"]["forward_invariance"].update(kind="close"),
    lambda t: t["dtypes"]["float32"]["gradient_accuracy"].pop("row_rtol"),
    lambda t: t["dtypes"]["float32"]["forward_accuracy"]["outputs"]["logp"].update(rtol=-1),
    lambda t: t.update(arch_overrides={"sm90": {"float16": {"forward_invariance": {"kind": "bitwise"}}}}),
])
def test_schema_violations_are_rejected(breakage):
    contracts._validate("x", _table())
    t = _table()
    breakage(t)
    with pytest.raises(ContractSchemaError):
        contracts._validate("x", t)


def test_scaled_abs_ratio():
    b = {"atol": 0.0, "rtol": 1e-6}
    assert contracts.scaled_abs_ratio([1.0 + 5e-6], [1.0], [10.0], b) == pytest.approx(0.5)
    assert contracts.scaled_abs_ratio([float("nan")], [1.0], [10.0], b) == float("inf")
    assert contracts.scaled_abs_ratio([float("-inf")], [float("-inf")], [0.0], b) == 0.0


def test_rounding_plus_sensitivity_ratio():
    b = {"atol": 0.0, "rtol": 1e-3, "row_rtol": 1e-6}
    ref = [[1.0, 0.0]]
    assert contracts.rounding_plus_sensitivity_ratio([[1.0005, 0.0]], ref, [[0.0, 0.0]], b) == pytest.approx(0.5)
    assert contracts.rounding_plus_sensitivity_ratio([[1.0, 1e-6]], ref, [[0.0, 2.0]], b) == pytest.approx(0.5)
    assert contracts.rounding_plus_sensitivity_ratio([[1.0, 1e-6]], ref, [[0.0, 2.0]], b, [[1.0, 1e-6]]) == 0.0
