"""rlk-triton: the command line.

  rlk-triton check [--json]      parity of every registered operator against its contract on this
                                 machine (GPU if present, else the interpreter on small shapes) and
                                 bitwise batch invariance; prints a pass/fail table; exit 1 on a fail
  rlk-triton configs [--json]    the locked launch-config table and its fingerprint
  rlk-triton capabilities [--json] [--device D]
                                 every backend's descriptor, availability measured on this machine
  rlk-triton resolve OP --dtype D [--fast M] [--consistency M] [--device D] [--rows N] [--call C]
                                 the mode policy's decision record (JSON); exit 1 when it fails
  rlk-triton drift [--model PATH] [--prompts FILE] [--new-tokens N] [--seed S] [--device D]
                   [--json FILE] [--chart FILE.png]
                                 rollout vs training log-probs on one model: the control group
                                 (transformers' kernels) beside rlk's rollout engine and training
                                 path, the first divergent op; exit 1 when rlk drifts (needs .[hf])
  rlk-triton bench [--op OP ...] [--quick] [--json FILE]
                                 the benchmark suite: each case's time (CUDA-graph device time and
                                 wall clock), its ratio to every baseline of the same run (torch
                                 eager, torch.compile, cuBLAS / SDPA, Liger / CCE when installed)
                                 and to the run's ceiling, extra peak memory; exit 1 when a case
                                 failed. Without a GPU only --quick (interpreter, tiny shapes, CPU
                                 figures)
  rlk-triton --version           rlk_triton, torch and triton versions

A usage error (unknown operator, dtype, device or mode) is one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import warnings

JSON_HELP = "print JSON instead of a table"

# What a failure on each invariance axis (rlk_triton.testing.invariance) points at.
AXIS_HINTS = {
    "repeat": "the same batch twice gave different bits: run-to-run nondeterminism (atomics, uninitialized memory)",
    "batch_size": "the bits depend on the batch size: a config or reduction order keyed on the row count",
    "row_position": "the bits depend on where the row sits in the batch: row tiling of the kernel (tl.dot M tile?)",
    "padding_rows": "padding rows change other rows: they leak into a shared reduction",
    "neighbours": "other rows change this row's bits: a reduction mixes rows",
    "dense_indexed": "the indexed path reduces in another order than the dense one",
    "tile_position": "the bits depend on the row's offset inside a row tile: the tile arithmetic",
}


def _prepare_runtime() -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    from ._runtime import interpreter_active

    interpreter_active()  # installs the filter for the interpreter's NumPy noise (see _runtime)
    return "cpu"


def _version() -> str:
    from importlib import metadata

    from . import __version__

    def v(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    # from the package metadata: printing a version must not import torch or triton
    return f"rlk-triton {__version__} (torch {v('torch')}, triton {v('triton')}, python {platform.python_version()})"


# ---- check ----

def _row_backend_id(op, row_op) -> str:
    """The registry's backend id of an invariance row op: its name is '<backend id>[...]', or '<op>[...]'
    for an operator with a single backend."""
    prefix = row_op.name.split("[")[0]
    ids = [b.backend_id for b in op.backends]
    if prefix in ids:
        return prefix
    if prefix == op.name and len(ids) == 1:
        return ids[0]
    raise ValueError(f"row op {row_op.name!r} names no backend of {op.name} ({', '.join(ids)})")


def _plan(device: str, on_gpu: bool) -> list:
    """Every check to run, so the total is known up front: (kind, op, backend, payload)."""
    from . import registry
    from .testing.harness import harness

    plan = []
    for op in registry.operators():
        h = harness(op.name)
        for backend in op.backends:
            if backend.backend_class == "native":  # held to the Triton kernel's bits by its gate, not re-judged here
                from . import native

                available, why = native.availability(op.name, device)
                plan.append(("available", op, backend, "admitted: bitwise equal to the Triton kernel "
                             "(rlk-triton native admit)" if available else why))
                continue
            available, why = registry.measure_availability(op.name, backend.name, device)
            if not available:
                plan.append(("available", op, backend, why))
                continue
            plan += [("parity", op, backend, case) for case in h.parity_cases(on_gpu)]
        by_id = {b.backend_id: b for b in op.backends}
        plan += [("invariance", op, by_id[_row_backend_id(op, r)], r) for r in h.row_ops(device, on_gpu)]
    return plan


def _judge(op):
    """The judge of op's parity cases (the harness's)."""
    from .testing.harness import harness

    return harness(op.name).judge


def _run_one(kind, op, backend, payload, device, on_gpu, arch) -> dict:
    from . import contracts
    from .testing import check_batch_invariance

    row = {"op": op.name, "backend": backend.backend_id, "check": kind}
    if kind == "available":
        # an unavailable reference backend, or the Triton one on a CPU without the interpreter, is allowed
        row.update(case=payload, passed=backend.backend_class != "production" or not on_gpu,
                   look_at=f"the probe: {payload}")
    elif kind == "parity":
        ratios = _judge(op)(payload, device, backend=backend.name)
        worst_name = max(ratios, key=ratios.get)
        dtype = payload.dtype
        row.update(case=payload.label(), contract_id=contracts.contract_id(op.contract, dtype, arch),
                   worst_ratio=ratios[worst_name], worst=worst_name, ratios=ratios,
                   passed=ratios[worst_name] <= 1.0,
                   look_at=f"{worst_name}: error / bound {ratios[worst_name]:.3g} (bound: contracts/{op.contract}.yaml, "
                           f"{contracts.dtype_name(dtype)} row)")
    else:
        rep = check_batch_invariance(payload, probe_rows=3, batch_sizes=(5, 64) if on_gpu else (4, 7))
        results = [{"axis": r.axis, "variant": r.variant, "what": r.what, "equal": r.equal,
                    "max_abs_diff": r.max_abs_diff} for r in rep.results]
        bad = [r for r in results if not r["equal"]]
        row.update(case=payload.name, axes=sorted({r["axis"] for r in results}), results=results,
                   failures=[f"{r['axis']}/{r['variant']}/{r['what']}" for r in bad], passed=not bad)
        if bad:
            worst = max(bad, key=lambda r: r["max_abs_diff"])
            row.update(max_abs_diff=worst["max_abs_diff"],
                       look_at=f"{worst['axis']}/{worst['variant']}/{worst['what']}: "
                               + AXIS_HINTS.get(worst["axis"], "see rlk_triton/testing/invariance.py"))
    return row


def _record(row, backend, device) -> None:
    """Tell the registry what failed here, so capabilities in this process do not claim it."""
    from . import registry

    if row["check"] == "parity":
        prop = "contract_accuracy"
    elif row["check"] == "invariance":
        prop = "bitwise_deterministic" if any(f.startswith("repeat/") for f in row["failures"]) else "batch_invariant"
    else:
        return
    row["property"] = prop
    registry.record_check_failure(row["op"], backend.name, prop, device, f"{row['case']}: {row['look_at']}")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _blas() -> str:
    try:  # what numpy actually loaded, where threadpoolctl can tell
        import threadpoolctl

        libs = [f"{i.get('internal_api')} {i.get('version')}" for i in threadpoolctl.threadpool_info()
                if i.get("user_api") == "blas"]
        if libs:
            return ", ".join(libs)
    except Exception:  # noqa: BLE001 - optional and best effort
        pass
    try:  # else what numpy was built against
        import numpy

        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', 'unknown')} {blas.get('version', '')}".strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def _driver() -> str | None:
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def _versions(on_gpu: bool) -> dict:
    import numpy
    import torch
    import triton

    from . import __version__

    v = {"rlk_triton": __version__, "python": platform.python_version(), "torch": torch.__version__,
         "triton": triton.__version__, "numpy": numpy.__version__, "blas": _blas(),
         "cuda": torch.version.cuda, "cpu": _cpu_model(), "platform": platform.platform()}
    if on_gpu:
        v["gpu"] = torch.cuda.get_device_name()
        v["driver"] = _driver()
    return v


def _finite(x):
    """JSON without Infinity / NaN, which strict parsers reject: non-finite floats as strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _check(args) -> int:
    device = _prepare_runtime()
    import torch

    from . import configs
    from ._runtime import default_arch

    on_gpu = device == "cuda"
    arch = default_arch()
    where = torch.cuda.get_device_name() if on_gpu else "CPU, Triton interpreter"
    versions = _versions(on_gpu)
    if not args.json:
        print(f"rlk-triton check on {where} (arch {arch}, config fingerprint {configs.fingerprint(arch)})")
        print("versions: " + ", ".join(f"{k} {'none' if v is None else v}" for k, v in versions.items()
                                       if k not in ("gpu", "platform")), flush=True)
    t0 = time.time()
    plan = _plan(device, on_gpu)
    n = len(plan)
    kinds = {k: sum(p[0] == k for p in plan) for k in ("parity", "invariance", "available")}
    if not args.json:
        print(f"{n} checks: {kinds['parity']} parity, {kinds['invariance']} invariance"
              + (f", {kinds['available']} unavailable backends" if kinds["available"] else ""), flush=True)
    rows = []
    for i, (kind, op, backend, payload) in enumerate(plan, 1):
        row = _run_one(kind, op, backend, payload, device, on_gpu, arch)
        row["index"] = i
        if not row["passed"]:
            _record(row, backend, device)
        rows.append(row)
        if not args.json:
            print(_format_row(row, n), flush=True)
    failed = [r for r in rows if not r["passed"]]
    if args.json:
        print(json.dumps(_finite({"device": where, "arch": arch, "fingerprint": configs.fingerprint(arch),
                                  "versions": versions, "total": n, "rows": rows,
                                  "failures": [{k: r.get(k) for k in ("index", "op", "backend", "check", "property",
                                                                      "case", "worst_ratio", "max_abs_diff",
                                                                      "look_at")} for r in failed],
                                  "passed": not failed}), indent=1))
    else:
        if failed:
            print(f"\n{len(failed)} failed (capabilities in this process no longer claim what failed):")
            for r in failed:
                print(_format_row(r, n))
                print(f"{'':{_counter_width(n) + 4}}look at: {r['look_at']}")
        print(f"{len(rows) - len(failed)} passed, {len(failed)} failed  ({time.time() - t0:.1f} s)")
    return 1 if failed else 0


def _counter_width(n: int) -> int:
    return 2 * len(str(n)) + 3  # "[i/N]"


def _format_row(row, n) -> str:
    status = "PASS" if row["passed"] else "FAIL"
    if row["check"] == "parity":
        detail = f"worst error / bound {row['worst_ratio']:.3f}" + ("" if row["passed"] else f" ({row['worst']})")
    elif row["check"] == "invariance":
        detail = (("bitwise on " + ", ".join(row["axes"])) if row["passed"]
                  else f"max |diff| {row['max_abs_diff']:.3g}; " + "; ".join(row["failures"]))
    else:
        detail = "unavailable"
    counter = f"[{row['index']:>{len(str(n))}}/{n}]"
    return f"{counter} {status}  {row['backend']:30s} {row['check']:10s} {row['case']:56s} {detail}"


# ---- the other commands ----

def _configs(args) -> int:
    _prepare_runtime()
    from . import configs
    from ._runtime import default_arch

    arch = default_arch()
    table = configs.table_as_data()
    if args.json:
        print(json.dumps({"arch": arch, "fingerprint": configs.fingerprint(arch), "table": table}, indent=1))
        return 0
    print(f"fingerprint {configs.fingerprint(arch)} (arch {arch})")
    print(f"{'kernel':20s} {'arch':12s} {'dtype':9s} {'bucket':9s} tiles")
    for r in table:
        tiles = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("kernel", "arch", "dtype", "v_bucket"))
        print(f"{r['kernel']:20s} {r['arch']:12s} {r['dtype']:9s} {r['v_bucket']:9s} {tiles}")
    return 0


def _capabilities(args) -> int:
    _prepare_runtime()
    from .registry import capabilities

    caps = capabilities(args.device)
    if args.json:
        print(json.dumps(caps, indent=1))
        return 0
    fp = caps[0]["build_fingerprint"] if caps else {}
    print(f"device {caps[0]['device'] if caps else '?'}; build " + ", ".join(f"{k} {v}" for k, v in fp.items()))
    print("claims (strict, batch-invariant, deterministic) are tested by `rlk-triton check` on this machine")
    print(f"{'backend':32s} {'class':10s} {'strict':6s} {'optimized':9s} {'available':9s} why not / notes")
    for c in caps:
        first = "".join(f"; ranked first for eager calls of <= {r['max_rows']} rows ({r['report']})"
                        for r in c["speed_rank_by_rows"])
        print(f"{c['backend_id']:32s} {c['backend_class']:10s} {str(c['strict_eligible']):6s} "
              f"{str(c['optimized']):9s} {str(c['available']):9s} {c['unavailable_reason'] or c['notes']}{first}")
    return 0


def _resolve(args) -> int:
    _prepare_runtime()
    from . import policy
    from .errors import PolicyError

    try:
        d = policy.resolve(args.op, dtype=args.dtype, device=args.device, fast=args.fast,
                           consistency=args.consistency, rows=args.rows, call=args.call)
    except PolicyError as ex:
        print(json.dumps(ex.decision, indent=1))
        print(f"rlk-triton resolve: {ex}", file=sys.stderr)
        return 1
    print(json.dumps(d.to_dict(), indent=1))
    return 0


def _drift(args) -> int:
    device = args.device or _prepare_runtime()
    if device == "cpu" or str(device).startswith("cpu"):
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import matplotlib  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as ex:
        from .errors import InputError

        raise InputError("drift", f"needs the hf extra ({ex.name} is missing): pip install 'rlk-triton[hf]'") from None
    from .drift import run

    args.device = device
    return run.main(args)


def _bench(args) -> int:
    device = _prepare_runtime()
    from .bench import run

    report = run(args.op, quick=args.quick, json_path=args.json, echo=print)
    if report["skipped"]:
        print(f"skipped: {len(report['skipped'])} baselines (the report says why)")
    if args.json:
        print(f"report: {args.json} ({len(report['rows'])} rows on {device})")
    return 1 if report["errors"] else 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rlk-triton", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="parity and invariance of every operator on this machine")
    c.add_argument("--json", action="store_true",
                   help=JSON_HELP + ": versions, config fingerprint, every row with every ratio and diff, the failures")
    c.set_defaults(fn=_check)
    g = sub.add_parser("configs", help="the locked launch configs and their fingerprint")
    g.add_argument("--json", action="store_true", help=JSON_HELP + ": arch, fingerprint and the table")
    g.set_defaults(fn=_configs)
    k = sub.add_parser("capabilities", help="backend descriptors, availability measured here")
    k.add_argument("--json", action="store_true", help=JSON_HELP + ": one descriptor per backend")
    k.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if present)")
    k.set_defaults(fn=_capabilities)
    r = sub.add_parser("resolve", help="the mode policy's decision for an operator")
    r.add_argument("op", help="an operator name, e.g. selected_logp (see `rlk-triton capabilities`)")
    r.add_argument("--dtype", required=True,
                   help="dtype of the op's floating-point input: bfloat16 / bf16, float16 / fp16 / half, "
                        "float32 / fp32 / float, ...")
    r.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if present)")
    r.add_argument("--fast", default=None, help="off | auto | strict (default: RLK_FAST, else off)")
    r.add_argument("--consistency", default=None, help="off | audit | strict (default: RLK_CONSISTENCY, else off)")
    r.add_argument("--rows", type=int, default=None,
                   help="the call's rows (tokens, or sequences at decode): ranks measured for small eager calls apply")
    r.add_argument("--call", default="eager",
                   help="eager | cuda_graph | compile: how the calls run (default eager); under a CUDA graph host "
                        "time is not paid per call, compile excludes eager-only backends")
    r.set_defaults(fn=_resolve)
    d = sub.add_parser("drift", help="rollout vs training log-probs on a model: control group, rlk, first divergent op")
    from .drift.run import add_arguments

    add_arguments(d)
    d.set_defaults(fn=_drift)
    b = sub.add_parser("bench", help="the benchmark suite: time, ratios to baselines and ceilings, peak memory")
    b.add_argument("--op", nargs="+", action="extend", default=None, metavar="OP",
                   help="operator families to run (default: all): " + ", ".join(_bench_families()))
    b.add_argument("--quick", action="store_true",
                   help="one smaller shape per case, no torch.compile baselines; without a GPU: the "
                        "Triton interpreter on tiny shapes (CPU figures)")
    b.add_argument("--json", metavar="FILE", default=None,
                   help="write the report (device, versions, commit, date, config fingerprint, rows) to FILE, "
                        "rewritten after every case")
    b.set_defaults(fn=_bench)
    n = sub.add_parser("native", help="native CUDA kernels: admission records and the bitwise gate")
    n.add_argument("action", choices=("status", "admit"),
                   help="status: each native kernel and why it is or is not admitted here; admit: build, run "
                        "the gate against the Triton kernel on this GPU, record the admission")
    n.add_argument("--op", nargs="+", default=None, metavar="OP", help="native kernels to admit (default: all)")
    n.add_argument("--device", default="cuda", help="the CUDA device (default: cuda)")
    n.add_argument("--json", action="store_true", help=JSON_HELP)
    n.set_defaults(fn=_native)
    return ap


def _native(args) -> int:
    from . import native

    if args.action == "status":
        rows = native.status(args.device)
        if args.json:
            print(json.dumps(rows, indent=1))
        for r in ([] if args.json else rows):
            print(f"{r['backend']:22s} {'admitted' if r['admitted'] else 'not admitted'}: {r['reason']}")
        return 0
    reports = []
    for op in args.op or sorted(native.OPS):
        why = native.unavailable_reason(op, args.device)
        if why:
            reports.append({"op": op, "admitted": False, "unavailable": why})
            continue
        reports.append(native.admit(op, args.device))
    if args.json:
        print(json.dumps(reports, indent=1))
    for r in ([] if args.json else reports):
        if "unavailable" in r:
            print(f"{r['op']}: not run: {r['unavailable']}")
        elif r["admitted"]:
            print(f"{r['op']}: admitted, {r['cases']} cases bitwise equal; record {r['record']}")
        else:
            first = r["mismatches"][0]
            print(f"{r['op']}: REFUSED, {len(r['mismatches'])} outputs differ (first: {first['case']}, output "
                  f"{first['output']}, {first['elements_differing']} elements)")
    return 0 if all(r["admitted"] for r in reports) else 1


def _bench_families() -> list:
    from .bench.cases import FAMILIES

    return list(FAMILIES)


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    print(f"rlk-triton: {category.__name__}: {message}", file=file or sys.stderr)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from .errors import RlkError

    with warnings.catch_warnings():  # restores the caller's showwarning when main() is called in-process
        warnings.showwarning = _one_line_warning  # a fallback warning is one line too, not file:line + source
        try:
            status = args.fn(args)
            sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
            return status
        except RlkError as ex:  # typed errors name the argument: that line is the whole message
            print(f"rlk-triton {args.cmd}: {ex}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # `rlk-triton configs | head`: the reader has gone; stop quietly
            try:  # the Python docs' recipe: point stdout at devnull so the exit flush does not fail again
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError, AttributeError):
                pass
            return 1
        except KeyboardInterrupt:
            print("rlk-triton: interrupted", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
