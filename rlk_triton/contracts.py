"""The contracts: per op, per dtype, the judgments that define "aligned". Lookups fail closed.

The tables are the YAML files in contracts/ (installed as rlk_triton.contract_tables); their schema
is contracts/SCHEMA.md. This module loads them, resolves per-arch overrides, and evaluates the
judgments. There is never a default: a missing op, dtype or judgment raises ContractError; a key
that is not a name at all (op=["selected_logp"], arch=["sm90"]) raises InputError naming it.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
from importlib import resources

import numpy as np
import torch
import yaml

from .errors import ContractError, ContractSchemaError, InputError

SCHEMA_VERSION = 1
JUDGMENTS = ("forward_accuracy", "forward_invariance", "gradient_accuracy", "gradient_invariance")
KINDS = {
    "forward_accuracy": ("scaled_abs",),
    "gradient_accuracy": ("rounding_plus_sensitivity", "not_differentiable"),
    "forward_invariance": ("bitwise",),
    "gradient_invariance": ("bitwise", "not_differentiable"),
}


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else str(dtype)


def available_ops() -> list[str]:
    files = resources.files("rlk_triton.contract_tables")
    return sorted(f.name[:-5] for f in files.iterdir() if f.name.endswith(".yaml"))


def _check_key(argument: str, value, optional: bool = False) -> None:
    """Lookup keys are names: anything else (a list, a dtype object for op, ...) is bad input naming
    the argument, not a lookup miss (and not an unhashable-key TypeError from the cache)."""
    if not (isinstance(value, str) or (optional and value is None)):
        raise InputError(argument, f"must be a name (str{' or None' if optional else ''}), "
                                   f"got {type(value).__name__} {value!r}")


def _load(op: str) -> dict:
    _check_key("op", op)
    return _load_table(op)


@functools.lru_cache(maxsize=None)
def _load_table(op: str) -> dict:
    if op not in available_ops():  # a name, never a path ("../x")
        raise ContractError(op, f"no contract table for op {op!r} (have: {available_ops()})")
    f = resources.files("rlk_triton.contract_tables") / f"{op}.yaml"
    data = yaml.safe_load(f.read_text())
    _validate(op, data)
    return data


def load(op: str) -> dict:
    """The whole table of an op (a copy)."""
    return copy.deepcopy(_load(op))


def _validate(op: str, data) -> None:
    if not isinstance(data, dict):
        raise ContractSchemaError(op, "top level must be a mapping")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ContractSchemaError(op, f"schema_version must be {SCHEMA_VERSION}")
    if data.get("op") != op:
        raise ContractSchemaError(op, f"field op is {data.get('op')!r}, file is {op}.yaml")
    dtypes = data.get("dtypes")
    if not isinstance(dtypes, dict) or not dtypes:
        raise ContractSchemaError(op, "dtypes must be a non-empty mapping")
    for dt, rows in dtypes.items():
        for name in JUDGMENTS:
            if name not in rows:
                raise ContractSchemaError(f"{op}/{dt}", f"missing judgment {name}")
            _validate_row(f"{op}/{dt}/{name}", name, rows[name])
    for arch, per_dtype in (data.get("arch_overrides") or {}).items():
        for dt, rows in per_dtype.items():
            if dt not in dtypes:
                raise ContractSchemaError(f"{op}/{arch}/{dt}", "override of a dtype the table lacks")
            for name, row in rows.items():
                if name not in JUDGMENTS:
                    raise ContractSchemaError(f"{op}/{arch}/{dt}", f"unknown judgment {name}")
                _validate_row(f"{op}/{arch}/{dt}/{name}", name, row)


def _validate_row(where: str, name: str, row) -> None:
    if not isinstance(row, dict) or row.get("kind") not in KINDS[name]:
        raise ContractSchemaError(where, f"kind must be one of {KINDS[name]}")
    if row["kind"] == "scaled_abs":
        outs = row.get("outputs")
        if not isinstance(outs, dict) or not outs:
            raise ContractSchemaError(where, "scaled_abs needs outputs: {name: {atol, rtol}}")
        for o, t in outs.items():
            _need_numbers(f"{where}/{o}", t, ("atol", "rtol"))
    elif row["kind"] == "rounding_plus_sensitivity":
        _need_numbers(where, row, ("atol", "rtol", "row_rtol"))


def _need_numbers(where, row, keys):
    for k in keys:
        v = row.get(k) if isinstance(row, dict) else None
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise ContractSchemaError(where, f"{k} must be a number >= 0")


def judgment(op: str, dtype, name: str, arch: str | None = None) -> dict:
    """One judgment row, with the arch's override applied. Fails closed on anything missing; a key
    that is not a name (op, name, arch: str; arch may be None) raises InputError naming it."""
    _check_key("name", name)
    _check_key("arch", arch, optional=True)
    data = _load(op)
    dt = dtype_name(dtype)
    if name not in JUDGMENTS:
        raise ContractError(f"{op}/{dt}/{name}", f"unknown judgment (known: {JUDGMENTS})")
    rows = data["dtypes"].get(dt)
    if rows is None:
        raise ContractError(f"{op}/{dt}", f"no row for dtype {dt} (have: {sorted(data['dtypes'])})")
    row = rows[name]
    if arch is not None:
        row = (data.get("arch_overrides") or {}).get(arch, {}).get(dt, {}).get(name, row)
    return copy.deepcopy(row)


def contract_id(op: str, dtype, arch: str | None = None) -> str:
    """Hash of the rows that judge (op, dtype) on arch: names the law a result was held to."""
    _check_key("op", op)
    _check_key("arch", arch, optional=True)
    return _contract_id(op, dtype_name(dtype), arch)


@functools.lru_cache(maxsize=None)
def _contract_id(op: str, dt: str, arch: str | None) -> str:
    # the tables are loaded once (_load_table), so their hash is too: every policy decision asks
    rows = {n: judgment(op, dt, n, arch) for n in JUDGMENTS}
    payload = json.dumps({"op": op, "dtype": dt, "rows": rows}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# ---- evaluating judgments: the ratio of the error to what the row allows; <= 1 passes ----

def scaled_abs_ratio(ours, ref, row_scale, bound: dict) -> float:
    """max |ours - ref| / (atol + rtol * row_scale); row_scale broadcasts against the values.

    row_scale (testing.parity.row_scale) is max |logits / T| + log V over the row's finite values:
    the size of the numbers the fp32 arithmetic handles, which its rounding error grows with.
    """
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if ours.size == 0:
        return 0.0
    if np.isnan(ours).any():
        return float("inf")
    err = np.where(ours == ref, 0.0, np.abs(ours - ref))  # equal infinities are no error
    allowed = bound["atol"] + bound["rtol"] * np.asarray(row_scale, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0.0, 0.0, err / allowed)
    return float(np.max(ratio))


def rounding_plus_sensitivity_ratio(ours, ref, sensitivity, bound: dict, ref_flushed=None) -> float:
    """max |ours - ref| / (atol + rtol * |ref| + row_rtol * sensitivity), elementwise.

    rtol is the rounding of each output element to its dtype (the unit roundoff: 2^-8 bf16,
    2^-11 fp16, 2^-24 fp32); atol the spacing of subnormals. row_rtol scales the first-order
    sensitivity of the element to fp32 rounding in the kernel's arithmetic, which the op's parity
    module computes (testing.parity.logp_grad_sensitivity for selected_logp).
    ref_flushed: the reference with fp32-subnormal intermediates flushed to zero, as GPU fp32
    arithmetic may do; an element is judged against whichever reference it is closer to.
    """
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if ours.size == 0:
        return 0.0
    if np.isnan(ours).any():
        return float("inf")
    allowed = bound["atol"] + bound["rtol"] * np.abs(ref) + bound["row_rtol"] * np.asarray(sensitivity)
    err = np.abs(ours - ref)
    if ref_flushed is not None:
        err = np.minimum(err, np.abs(ours - np.asarray(ref_flushed, np.float64)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0.0, 0.0, err / allowed)
    return float(np.max(ratio))
