"""rlk-triton: the command line.

  rlk-triton check [--json]      parity of every registered operator against its contract on this
                                 machine (GPU if present, else the interpreter on small shapes) and
                                 bitwise batch invariance; prints a pass/fail table; exit 1 on a fail
  rlk-triton configs [--json]    the locked launch-config table and its fingerprint
  rlk-triton capabilities [--json] [--device D]
                                 every backend's descriptor, availability measured on this machine
  rlk-triton resolve OP --dtype D [--fast M] [--consistency M] [--device D]
                                 the mode policy's decision record (JSON); exit 1 when it fails
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings


def _prepare_runtime() -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    # The interpreter evaluates masked-off lanes in NumPy (log of 0, inf - inf): noise, not findings.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
    return "cpu"


def _check(args) -> int:
    device = _prepare_runtime()
    import torch

    from . import configs, contracts, registry
    from ._runtime import default_arch
    from .testing import check_batch_invariance

    on_gpu = device == "cuda"
    arch = default_arch()
    where = torch.cuda.get_device_name() if on_gpu else "CPU, Triton interpreter"
    if not args.json:
        print(f"rlk-triton check on {where} (arch {arch}, config fingerprint {configs.fingerprint(arch)})")
    rows = []
    t0 = time.time()
    for op in registry.operators():
        for backend in op.backends:
            available, why = registry.measure_availability(op.name, backend.name, device)
            if not available:
                rows.append({"op": op.name, "backend": backend.backend_id, "check": "available",
                             "case": why, "passed": backend.backend_class != "production" or not on_gpu})
                _progress(args, rows[-1])
                continue
            for case in op.parity_cases(on_gpu):
                ratios = op.judge(case, device, backend=backend.name)
                worst = max(ratios.values())
                rows.append({"op": op.name, "backend": backend.backend_id, "check": "parity", "case": case.label(),
                             "contract_id": contracts.contract_id(op.contract, case.dtype, arch),
                             "worst_ratio": worst, "ratios": ratios, "passed": worst <= 1.0})
                _progress(args, rows[-1])
        for row_op in op.row_ops(device, on_gpu):
            rep = check_batch_invariance(row_op, probe_rows=3, batch_sizes=(5, 64) if on_gpu else (4, 7))
            bad = rep.failures()
            rows.append({"op": op.name, "backend": row_op.name.split("[")[0], "check": "invariance", "case": row_op.name,
                         "axes": sorted({r.axis for r in rep.results}),
                         "failures": [f"{r.axis}/{r.variant}/{r.what}" for r in bad], "passed": not bad})
            _progress(args, rows[-1])
    failed = [r for r in rows if not r["passed"]]
    if args.json:
        print(json.dumps({"device": where, "arch": arch, "fingerprint": configs.fingerprint(arch),
                          "rows": rows, "passed": not failed}, indent=1))
    else:
        print(f"{len(rows) - len(failed)} passed, {len(failed)} failed  ({time.time() - t0:.1f} s)")
    return 1 if failed else 0


def _progress(args, row):
    if args.json:
        return
    status = "PASS" if row["passed"] else "FAIL"
    if row["check"] == "parity":
        detail = f"worst error / bound {row['worst_ratio']:.3f}"
    elif row["check"] == "invariance":
        detail = ("bitwise on " + ", ".join(row["axes"])) if row["passed"] else "; ".join(row["failures"])
    else:
        detail = "unavailable"
    print(f"  {status}  {row['backend']:30s} {row['check']:10s} {row['case']:56s} {detail}", flush=True)


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
    print(f"{'backend':32s} {'class':10s} {'strict':6s} {'optimized':9s} {'available':9s} why not / notes")
    for c in caps:
        print(f"{c['backend_id']:32s} {c['backend_class']:10s} {str(c['strict_eligible']):6s} "
              f"{str(c['optimized']):9s} {str(c['available']):9s} {c['unavailable_reason'] or c['notes']}")
    return 0


def _resolve(args) -> int:
    _prepare_runtime()
    from . import policy
    from .errors import PolicyError

    try:
        d = policy.resolve(args.op, dtype=args.dtype, device=args.device, fast=args.fast,
                           consistency=args.consistency)
    except PolicyError as ex:
        print(json.dumps(ex.decision, indent=1))
        return 1
    print(json.dumps(d.to_dict(), indent=1))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rlk-triton", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="parity and invariance of every operator on this machine")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=_check)
    g = sub.add_parser("configs", help="the locked launch configs and their fingerprint")
    g.add_argument("--json", action="store_true")
    g.set_defaults(fn=_configs)
    k = sub.add_parser("capabilities", help="backend descriptors, availability measured here")
    k.add_argument("--json", action="store_true")
    k.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    k.set_defaults(fn=_capabilities)
    r = sub.add_parser("resolve", help="the mode policy's decision for an operator")
    r.add_argument("op")
    r.add_argument("--dtype", required=True)
    r.add_argument("--device", default=None)
    r.add_argument("--fast", default=None, help="off | auto | strict (default: RLK_FAST, else off)")
    r.add_argument("--consistency", default=None, help="off | audit | strict (default: RLK_CONSISTENCY, else off)")
    r.set_defaults(fn=_resolve)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
