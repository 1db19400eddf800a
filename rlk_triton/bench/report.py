"""Runs benchmark cases (cases.py) and writes the one report format of the library's benchmarks.

A report is JSON: what ran where (device, versions, commit, date, config fingerprint, the run's
ceilings), then one row per (case, baseline):
  op, case, shape, dtype          which call of the library
  rlk_ms, rlk_wall_ms             its time per call (`time` says which clock) and its wall clock
  rlk_peak_extra_mib              the memory one call allocates beyond what is live (CUDA only)
  baseline, baseline_kind         what it is compared with (cases.BASELINE_KINDS)
  baseline_ms, baseline_wall_ms, baseline_peak_extra_mib
  ratio                           baseline_ms / rlk_ms: above 1 the library is faster; against a
                                  ceiling, the fraction of the physical limit the library reaches
  time                            "device" (CUDA graph replays), "device events" (a call that cannot
                                  be captured), "cpu" (the Triton interpreter: not a GPU figure)
and the baselines that could not run here (`skipped`, with the reason) and the failures (`errors`).
"""
from __future__ import annotations

import datetime
import gc
import json
import os
import platform
import subprocess
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from . import timing
from .cases import CEILINGS, Bound, Case, select

FORMAT = "rlk-triton-bench/1"
RATIO = ("baseline_ms / rlk_ms: above 1 the library is faster; against a ceiling, the fraction of the "
         "physical limit the library reaches")
CPU_NOTE = "CPU times of Triton-interpreted kernels on tiny shapes: they say nothing about a GPU"


@dataclass
class Timing:
    ms: float
    wall_ms: float
    peak_extra_mib: Optional[float]
    time: str  # timing.DEVICE_TIME | EVENT_TIME | CPU_TIME


def device_ms(fn: Callable, device, clock: Optional[str] = None) -> tuple[float, str]:
    """fn's time per call and the clock that took it: a CUDA graph unless fn cannot be captured (or
    clock asks for events), the host clock without CUDA."""
    if not timing.on_cuda(device):
        return timing.cpu_ms(fn), timing.CPU_TIME
    if clock != timing.EVENT_TIME:
        try:
            return timing.graph_ms(fn), timing.DEVICE_TIME
        except Exception:  # noqa: BLE001 - a host sync inside fn: time it with events instead
            torch.cuda.synchronize()
    return timing.events_ms(fn), timing.EVENT_TIME


def measure(fn: Callable, device, clock: Optional[str] = None) -> Timing:
    ms, used = device_ms(fn, device, clock)
    # without CUDA the host is the device: the per-call figure is already the wall clock
    wall = timing.wall_ms(fn, device=device) if timing.on_cuda(device) else ms
    return Timing(ms, wall, timing.peak_extra_mib(fn, device), used)


class Rates:
    """The run's physical ceilings, measured once on first use."""

    def __init__(self, device):
        self.device, self.copy_gbps, self.matmul_tflops = device, None, {}

    def ceiling_ms(self, bound: Bound) -> float:
        if bound.ceiling == "copy":
            if self.copy_gbps is None:
                self.copy_gbps = timing.copy_rate_gbps(device=self.device)
            return bound.work / (self.copy_gbps * 1e6)  # GB/s = 1e6 bytes per ms
        name = str(bound.dtype).removeprefix("torch.")
        if name not in self.matmul_tflops:
            self.matmul_tflops[name] = timing.matmul_tflops(bound.dtype, self.device)
        return bound.work / (self.matmul_tflops[name] * 1e9)  # TFLOP/s = 1e9 flops per ms

    def as_dict(self) -> dict:
        return {"copy_gbps": self.copy_gbps, "matmul_tflops": dict(self.matmul_tflops)}


def _where(case: Case) -> dict:
    return {"op": case.op, "case": case.case, "shape": case.shape, "dtype": case.dtype}


def _error(case: Case, what: str, ex: BaseException) -> dict:
    return {**_where(case), "what": what, "error": "".join(traceback.format_exception_only(ex)).strip()[-2000:]}


def _row(case, rlk: Timing, baseline: str, kind: str, base_ms: float, base: Optional[Timing], **extra) -> dict:
    return {**_where(case), "rlk_ms": rlk.ms, "rlk_wall_ms": rlk.wall_ms, "rlk_peak_extra_mib": rlk.peak_extra_mib,
            "baseline": baseline, "baseline_kind": kind, "baseline_ms": base_ms,
            "baseline_wall_ms": base.wall_ms if base else None,
            "baseline_peak_extra_mib": base.peak_extra_mib if base else None,
            "ratio": base_ms / rlk.ms, "time": rlk.time, **extra}


def run_case(case: Case, device, quick: bool, rates: Rates) -> tuple[list, list, list]:
    """(rows, skipped, errors) of one case. A failure is recorded, never raised: the run goes on."""
    rows, errors = [], []
    try:
        bound = case.build(device, quick)
    except Exception as ex:  # noqa: BLE001 - recorded
        return [], [], [_error(case, "build", ex)]
    skipped = [{**_where(case), "baseline": label, "why": why} for label, why in bound.skipped]
    try:
        rlk = measure(bound.rlk, device)
    except Exception as ex:  # noqa: BLE001
        return [], skipped, [_error(case, "rlk", ex)]
    rlk_events = None  # the library's call timed with events, when a baseline cannot be captured
    for b in bound.baselines:
        try:
            base = measure(b.fn, device, rlk.time)
            mine = rlk
            if base.time != rlk.time:  # compare like with like: both with events
                rlk_events = rlk_events or measure(bound.rlk, device, timing.EVENT_TIME)
                mine = rlk_events
            rows.append(_row(case, mine, b.label, b.kind, base.ms, base))
        except Exception as ex:  # noqa: BLE001
            errors.append(_error(case, b.label, ex))
    try:
        work = {"bytes" if bound.ceiling == "copy" else "flops": bound.work}
        rows.append(_row(case, rlk, CEILINGS[bound.ceiling], "ceiling", rates.ceiling_ms(bound), None, work=work))
    except Exception as ex:  # noqa: BLE001
        errors.append(_error(case, CEILINGS[bound.ceiling], ex))
    del bound
    gc.collect()
    if timing.on_cuda(device):
        torch.cuda.empty_cache()
    return rows, skipped, errors


def _commit() -> tuple[str, Optional[bool]]:
    """(short commit, uncommitted changes?) of the checkout the package runs from; RLK_COMMIT overrides
    (a copy of the tree without .git)."""
    if os.environ.get("RLK_COMMIT"):
        return os.environ["RLK_COMMIT"], None
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():  # an installed copy: not this checkout's commit to name
        return "unknown", None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    return sha, bool(dirty)


def _versions() -> dict:
    from importlib import metadata

    import numpy
    import triton

    from .. import __version__

    def dist(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {"rlk_triton": __version__, "torch": torch.__version__, "triton": triton.__version__,
            "numpy": numpy.__version__, "python": platform.python_version(), "cuda": torch.version.cuda,
            "liger_kernel": dist("liger-kernel"), "cut_cross_entropy": dist("cut-cross-entropy")}


def header(device, size: str, ops: list) -> dict:
    from .. import configs
    from .._runtime import default_arch

    gpu = timing.on_cuda(device)
    arch = default_arch()
    commit, dirty = _commit()
    return {"format": FORMAT, "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            "commit": commit, "uncommitted_changes": dirty,
            "device": torch.cuda.get_device_name(torch.device(device)) if gpu else f"cpu ({platform.processor() or platform.machine()})",
            "gpu_figures": gpu, "note": None if gpu else CPU_NOTE, "size": size, "arch": arch,
            "config_fingerprint": configs.fingerprint(arch), "versions": _versions(), "ratio": RATIO,
            "ceilings": {}, "ops": ops, "rows": [], "skipped": [], "errors": []}


def write(report: dict, path) -> None:
    """Write the report whole (a reader never sees half a file; a cut-off run keeps what it did)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, path)


def format_row(row: dict) -> str:
    return (f"{row['op']:16s} {row['case']:7s} {row['shape'][:48]:48s} {row['baseline'][:56]:56s} "
            f"{row['rlk_ms']:10.4g} {row['baseline_ms']:10.4g} {row['ratio']:8.3g}")


TABLE_HEAD = f"{'op':16s} {'case':7s} {'shape':48s} {'baseline':56s} {'rlk ms':>10s} {'base ms':>10s} {'ratio':>8s}"


def run(ops=None, quick: bool = False, json_path=None, echo: Optional[Callable[[str], None]] = None) -> dict:
    """Run the cases of `ops` (None: every family) on CUDA if present, else on the CPU under the
    Triton interpreter (tiny shapes; only with quick). Writes the report to json_path after every
    case; echo(line) gets the table as it grows. Returns the report."""
    from ..errors import InputError

    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = "full" if not quick else ("quick" if device == "cuda" else "tiny")
    selected = select(ops, size)  # an unknown op is named before anything runs
    if device == "cpu" and not quick:
        raise InputError("quick", "without a CUDA GPU the suite runs only with --quick (the Triton interpreter "
                                  "on tiny shapes: CPU figures, not GPU ones)")
    report = header(device, size, list(dict.fromkeys(c.op for c in selected)))
    rates = Rates(device)
    if echo:
        echo(f"{report['device']}, commit {report['commit']}, configs {report['config_fingerprint']}, "
             f"size {size}" + (f"\n{CPU_NOTE}" if report["note"] else ""))
        echo(TABLE_HEAD)
    for case in selected:
        rows, skipped, errors = run_case(case, device, quick, rates)
        report["rows"] += rows
        report["skipped"] += skipped
        report["errors"] += errors
        report["ceilings"] = rates.as_dict()
        if json_path:
            write(report, json_path)
        if echo:
            for line in [format_row(r) for r in rows] + [f"ERROR {e['op']} {e['case']} {e['shape']} "
                                                         f"({e['what']}): {e['error'][:300]}" for e in errors]:
                echo(line)
    return report
