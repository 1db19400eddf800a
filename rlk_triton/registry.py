"""Operators, their backends, and measured capabilities.

Every operator has stable backend ids "<op>.<backend>" (for selected_logp: "selected_logp.triton",
"selected_logp.torch_reference"; native ones later). A backend's descriptor states what it claims
(dtypes, devices, autograd, invariance, determinism), the contract that judges it (contract ids per
dtype), the build it belongs to (fingerprint), and whether it is available HERE: availability is
measured by running the backend on a small probe and judging the result against its contract, never
guessed from imports.

`rlk-triton check` also reads this module: each operator names its parity cases, judge and row ops.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

BACKEND_CLASSES = ("production", "reference", "deterministic")


@dataclass(frozen=True)
class Backend:
    op: str
    name: str  # the backend's id inside its op; the stable id is f"{op}.{name}"
    implementation: str
    backend_class: str  # production | reference | deterministic
    strict_eligible: bool  # meets every judgment of its contract, invariance included
    optimized: bool  # counts as an optimized backend for fast=auto/strict
    speed_rank: int  # lower is faster (from docs/reports); orders candidates
    dtypes: tuple
    devices: str
    autograd: bool
    parallel_modes: tuple
    shape_ranges: dict
    batch_invariant: bool
    bitwise_deterministic: bool
    notes: str = ""

    @property
    def backend_id(self) -> str:
        return f"{self.op}.{self.name}"


@dataclass(frozen=True)
class Operator:
    name: str
    contract: str
    backends: tuple
    parity_cases: Callable[[bool], list]  # (on_gpu) -> cases
    judge: Callable  # (case, device, backend=...) -> {name: error / bound}
    row_ops: Callable[[str, bool], list]  # (device, on_gpu) -> [RowOp]
    probe: Callable[[str, str], None] = field(default=None)  # (backend name, device): raises if unusable


def _selected_logp() -> Operator:
    from .testing import parity

    def cases(on_gpu):
        # the float64 reference on the host dominates the time: few rows even on a GPU
        rows, big = (32, (1, 3, 1000, 32000, 50257, 151936, 262144)) if on_gpu else (4, (1, 3, 1000, 50257))
        out = []
        for i, dtype in enumerate((torch.bfloat16, torch.float16, torch.float32)):
            for V in big:
                for T, layout in (("rows", "contiguous"), (0.7, "slice3d")):
                    out.append(parity.LogpCase(rows, V, dtype, T, 3.0, layout, seed=i * 1000 + V))
        return out

    def row_ops(device, on_gpu):
        Vs = (1000, 151936) if on_gpu else (1000,)
        return [parity.selected_logp_row_op(V, dt, device, backend=b) for b in ("triton", "torch_reference")
                for V in Vs for dt in (torch.bfloat16, torch.float16, torch.float32)]

    def probe(backend, device):
        for dt in (torch.bfloat16, torch.float32):
            ratios = parity.judge_selected_logp(parity.LogpCase(4, 257, dt, "rows", 3.0, "contiguous", seed=1),
                                                device, backend=backend)
            if max(ratios.values()) > 1.0:
                raise AssertionError(f"probe result outside the contract: error / bound {ratios}")

    dtypes = ("bfloat16", "float16", "float32")
    shapes = {"V": [1, 262144], "leading_dims": "any (up to two without a copy)", "rows": "any"}
    backends = (
        Backend("selected_logp", "triton", "Triton kernels, rlk_triton/ops/selected_logp.py", "production",
                strict_eligible=True, optimized=True, speed_rank=0, dtypes=dtypes,
                devices="cuda (tuned for sm90); cpu only under the Triton interpreter", autograd=True,
                parallel_modes=("data",), shape_ranges=shapes, batch_invariant=True, bitwise_deterministic=True),
        Backend("selected_logp", "torch_reference", "float64 torch, rlk_triton/ops/selected_logp_torch.py",
                "reference", strict_eligible=True, optimized=False, speed_rank=100, dtypes=dtypes,
                devices="any torch device", autograd=True, parallel_modes=("data",), shape_ranges=shapes,
                batch_invariant=True, bitwise_deterministic=True,
                notes="slow; fixed 16-row chunks make every row's reductions one shape"),
    )
    return Operator("selected_logp", "selected_logp", backends, cases, parity.judge_selected_logp, row_ops, probe)


def operators() -> list[Operator]:
    from .testing.attention_parity import attention_operator
    from .testing.linear_parity import linear_logp_operator
    from .testing.matmul_parity import matmul_operator
    from .testing.positional import embedding_operator, rope_operator
    from .testing.rl_ops import rl_operators as _rl_operators
    from .testing.rowwise import rmsnorm_operator, swiglu_operator

    return [_selected_logp(), linear_logp_operator(), matmul_operator(), rmsnorm_operator(), swiglu_operator(),
            rope_operator(), embedding_operator(), attention_operator(), *_rl_operators()]


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
        op.probe(backend, device)
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


def describe(backend: Backend, device) -> dict:
    """The JSON-serializable descriptor of a backend on `device`, availability measured.

    Its claims (strict_eligible, batch_invariant, ...) are tested by `rlk-triton check`; `failed_here`
    lists what a check in this process found false, and the claims it contradicts read False."""
    from . import contracts

    device = device_str(device)
    arch, _ = arch_here(device)
    available, reason = measure_availability(backend.op, backend.name, device)
    d = asdict(backend)
    if arch == "interpreter" and backend.optimized:
        # Triton kernels under the interpreter compute the same function, but are not fast.
        d.update(optimized=False, notes=(backend.notes + " " if backend.notes else "")
                 + "runs under the Triton interpreter here: correct, not optimized")
    failed = dict(_FAILED_HERE.get((backend.op, backend.name, device), {}))
    for prop in failed:
        d.update({claim: False for claim in CLAIMS[prop]})
    if failed:
        d["notes"] = (d["notes"] + " " if d["notes"] else "") + "failed here in rlk-triton check: " + ", ".join(failed)
    # no such device here: its arch, hence the arch overrides of the contract rows, are unknown
    d.update(backend_id=backend.backend_id, device=device,
             contract_ids={dt: contracts.contract_id(operator(backend.op).contract, dt, arch) if arch else None
                           for dt in backend.dtypes},
             build_fingerprint=build_fingerprint(device), available=available, unavailable_reason=reason,
             claims_tested_by="rlk-triton check", failed_here=failed)
    d["dtypes"], d["parallel_modes"] = list(backend.dtypes), list(backend.parallel_modes)
    return d


def capabilities(device=None) -> list[dict]:
    """Descriptors of every backend of every operator on `device` (default: cuda if present, else cpu)."""
    device = device_str(device or default_device())
    return [describe(b, device) for op in operators() for b in op.backends]
