"""Operators, their backends, and measured capabilities.

The descriptors (what each operator and backend claims) are rlk_triton/operators.py's; the registry
adds what it measures HERE: whether a backend is available (by running it on a small probe and
judging the result against its contract, never guessed from imports), the build fingerprint, the
contract ids per dtype, and what `rlk-triton check` found false in this process.

The probes are the test harness's (rlk_triton/testing/harness.py): it registers them by operator
name (register_probe). The registry never imports the harness; where no probe has been registered
it loads the one module named by HARNESS_MODULE, by name, once.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import asdict
from typing import Callable, Optional

import torch

from .operators import BACKEND_CLASSES, Backend, Operator, operators  # noqa: F401 - the registry's own table

HARNESS_MODULE = "rlk_triton.testing.harness"  # registers every probe (register_probes) when loaded
_PROBES: dict[str, Callable[[str, str], None]] = {}


def register_probe(op: str, probe: Callable[[str, str], None]) -> None:
    """Register op's availability probe: (backend name, device) -> None, raising if unusable."""
    _PROBES[op] = probe


def probe_of(op: str) -> Callable[[str, str], None]:
    if op not in _PROBES:
        importlib.import_module(HARNESS_MODULE).register_probes()
    return _PROBES[op]


def operator(name: str) -> Operator:
    for op in operators():
        if op.name == name:
            return op
    from .errors import InputError

    raise InputError("op", f"unknown operator {name!r} (have: {[o.name for o in operators()]})")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_str(device) -> str:
    """'cpu', 'cuda', 'cuda:1' from a string or a torch.device (DeviceError for anything else)."""
    from ._runtime import as_device

    return str(as_device(device))


def arch_here(device: str) -> tuple[Optional[str], Optional[str]]:
    """(arch, None), or (None, why) when this machine lacks the device: descriptors then say
    unavailable instead of raising. A device type rlk_triton never runs on still raises DeviceError."""
    from ._runtime import arch_of
    from .errors import DeviceError

    try:
        return arch_of(torch.device(device)), None
    except DeviceError as ex:
        if not device.startswith("cuda"):
            raise
        return None, str(ex).removeprefix(f"{ex.argument}: ")


@functools.lru_cache(maxsize=None)
def measure_availability(op_name: str, backend: str, device) -> tuple[bool, Optional[str]]:
    """Run the backend's probe on `device` once per process: (available, reason if not)."""
    from ._runtime import quiet_interpreter_noise

    op = operator(op_name)
    device = device_str(device)
    arch, why = arch_here(device)
    if arch is None:
        return False, why
    quiet_interpreter_noise()  # the probe may be the first kernel launch of the process
    try:
        probe_of(op.name)(backend, device)
    except Exception as ex:  # noqa: BLE001 - the reason is the measurement
        return False, f"probe failed on {device}: {type(ex).__name__}: {ex}"
    return True, None


# ---- what `rlk-triton check` found in this process ----
# (op, backend name, device) -> {property: detail}. A descriptor's claim is tested by `rlk-triton
# check`; when a check in this process contradicted it, the descriptor says so instead of repeating it.
_FAILED_HERE: dict = {}
# property a check tests -> the descriptor claims a failure of it contradicts
CLAIMS = {"contract_accuracy": ("strict_eligible",),
          "batch_invariant": ("batch_invariant", "strict_eligible"),
          "bitwise_deterministic": ("bitwise_deterministic", "batch_invariant", "strict_eligible")}


def record_check_failure(op: str, backend: str, prop: str, device, detail: str) -> None:
    """Record that a check found `prop` (a key of CLAIMS) false for op.backend on `device` in this process."""
    if prop not in CLAIMS:
        from .errors import InputError

        raise InputError("prop", f"{prop!r} is not one of {', '.join(CLAIMS)}")
    _FAILED_HERE.setdefault((op, backend, device_str(device)), {})[prop] = detail


def clear_check_failures() -> None:
    _FAILED_HERE.clear()


def build_fingerprint(device) -> dict:
    """Versions, arch and locked-config hash of the build that runs on `device` (arch and locked_configs
    are None when this machine lacks the device)."""
    import triton

    from . import __version__, configs

    arch, _ = arch_here(device_str(device))
    return {"rlk_triton": __version__, "torch": torch.__version__, "triton": triton.__version__,
            "arch": arch, "locked_configs": configs.fingerprint(arch) if arch else None}


def measured(backend: Backend, device) -> dict:
    """What this process measured of `backend` on `device`: available / unavailable_reason, and the
    claims that the device or a check here changes (strict_eligible, optimized, notes, the claims a
    failed check contradicts, failed_here). The policy chooses on this and the static descriptor;
    describe() adds the contract ids and the build fingerprint."""
    device = device_str(device)
    arch, no_device = arch_here(device)
    if backend.backend_class == "native":  # the admission record is the measurement (rlk_triton/native.py),
        from . import native                # read once per process, as the call path reads it

        available, reason = (False, no_device) if arch is None else native.usable(backend.op, device)
    else:
        available, reason = measure_availability(backend.op, backend.name, device)
    m = {"available": available, "unavailable_reason": reason, "optimized": backend.optimized,
         "notes": backend.notes,
         "strict_eligible": available if backend.backend_class == "native" else backend.strict_eligible}
    if arch == "interpreter" and backend.optimized:
        # Triton kernels under the interpreter compute the same function, but are not fast.
        m.update(optimized=False, notes=(backend.notes + " " if backend.notes else "")
                 + "runs under the Triton interpreter here: correct, not optimized")
    failed = dict(_FAILED_HERE.get((backend.op, backend.name, device), {}))
    for prop in failed:
        m.update({claim: False for claim in CLAIMS[prop]})
    if failed:
        m["notes"] = (m["notes"] + " " if m["notes"] else "") + "failed here in rlk-triton check: " + ", ".join(failed)
    m["failed_here"] = failed
    return m


def describe(backend: Backend, device) -> dict:
    """The JSON-serializable descriptor of a backend on `device`, availability measured.

    Its claims (strict_eligible, batch_invariant, ...) are tested by `rlk-triton check`; `failed_here`
    lists what a check in this process found false, and the claims it contradicts read False."""
    from . import contracts

    device = device_str(device)
    arch, _ = arch_here(device)
    d = asdict(backend)
    d.update(measured(backend, device))
    # no such device here: its arch, hence the arch overrides of the contract rows, are unknown
    d.update(backend_id=backend.backend_id, device=device,
             contract_ids={dt: contracts.contract_id(operator(backend.op).contract, dt, arch) if arch else None
                           for dt in backend.dtypes},
             build_fingerprint=build_fingerprint(device), claims_tested_by="rlk-triton check")
    d["dtypes"], d["parallel_modes"] = list(backend.dtypes), list(backend.parallel_modes)
    d["speed_rank_by_rows"] = list(d["speed_rank_by_rows"])
    return d


def capabilities(device=None) -> list[dict]:
    """Descriptors of every backend of every operator on `device` (default: cuda if present, else cpu)."""
    device = device_str(device or default_device())
    return [describe(b, device) for op in operators() for b in op.backends]
