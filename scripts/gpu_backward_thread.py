"""Where a lone forward + backward's host time goes, with autograd's defaults (a CUDA backward handed to
the device's worker thread) and with the backward on the calling thread
(torch.autograd.set_multithreading_enabled(False)), on the GPU machine.

    python scripts/gpu_backward_thread.py --out FILE [--calls N]

Per case and mode, medians over N timed calls (each one a forward and autograd.grad, no sync between
calls) of four spans measured with time.perf_counter on the host:
- forward: from the step's start to the call of torch.autograd.grad;
- to the backward: from that call to the entry of the first Python backward function (autograd's
  engine: the graph task, the hand-off to the worker thread, the GIL);
- in the backward: the time inside Python backward functions (the library's eager autograd.Functions,
  wrapped here; one per op), and on which thread they ran;
- after the backward: from the last backward function's exit to autograd.grad's return.
Cases: torch's x * 2 (no Python backward: the engine alone), a Python autograd.Function whose backward
is g * 2 (the engine with one Python node), and the library's host-bound fwd+bwd rows of
scripts/gpu_host_overhead.py. The wall time per call (one sync at the end) is beside them, and for the
library's cases a cProfile of 200 calls with the backward on the calling thread (where cProfile sees
it): the functions with the most own time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import torch

from gpu_host_profile import profile_top
from rlk_triton.bench import cases, timing
from rlk_triton.bench.report import header

_SPANS: list = []  # (event, perf_counter, thread ident) of the current call
_real_grad = torch.autograd.grad


def _grad(*args, **kwargs):
    _SPANS.append(("grad", time.perf_counter(), threading.get_ident()))
    out = _real_grad(*args, **kwargs)
    _SPANS.append(("return", time.perf_counter(), threading.get_ident()))
    return out


def _wrap_backward(cls) -> None:
    backward = cls.backward

    def timed(ctx, *grads):
        _SPANS.append(("in", time.perf_counter(), threading.get_ident()))
        try:
            return backward(ctx, *grads)
        finally:
            _SPANS.append(("out", time.perf_counter(), threading.get_ident()))

    cls.backward = staticmethod(timed)


def _wrap_library() -> int:
    """Wraps the backward of every eager autograd.Function of rlk_triton.ops (dispatch.autograd_op)."""
    import importlib
    import pkgutil

    import rlk_triton.ops

    for info in pkgutil.iter_modules(rlk_triton.ops.__path__):
        importlib.import_module(f"rlk_triton.ops.{info.name}")
    functions = {getattr(value, "eager", None) for name, module in list(sys.modules.items())
                 if name.startswith("rlk_triton.ops.") for value in list(vars(module).values())}
    functions = [f for f in functions if isinstance(f, type) and issubclass(f, torch.autograd.Function)]
    for f in functions:  # each class once, however many names it has
        _wrap_backward(f)
    return len(functions)


class _Times2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


_wrap_backward(_Times2)


def _cases() -> list:
    """(name, make): make() returns the timed step (a forward and autograd.grad)."""
    out = [("torch x * 2, 16 fp32 (no Python backward)", lambda: cases.autograd_floor("cuda"))]
    x = torch.randn(16, device="cuda", requires_grad=True)
    up = torch.ones(16, device="cuda")
    out.append(("Python autograd.Function, backward g * 2, 16 fp32",
                lambda: (lambda: torch.autograd.grad(_Times2.apply(x), x, up))))
    out.append(("policy_loss fwd+bwd [256 x 4096] (issue target)",
                lambda: cases._policy_loss(256, 4096, torch.float32, "cuda", True).rlk))
    return out + [(f"{c.op} {c.name}", (lambda c=c: c.build("cuda", True).rlk)) for c in cases.select(None, "quick")
                  if "bwd" in c.name and c.op in ("rmsnorm", "rope", "policy_loss", "gspo_loss")]


def _measure(step, calls: int) -> dict:
    for _ in range(20):  # warm: compiles, allocator
        step()
    torch.cuda.synchronize()
    forward, to_bwd, in_bwd, after, threads = [], [], [], [], set()
    main = threading.get_ident()
    for _ in range(calls):
        _SPANS.clear()
        t0 = time.perf_counter()
        step()
        spans = list(_SPANS)
        grad = next(t for e, t, _ in spans if e == "grad")
        ret = next(t for e, t, _ in spans if e == "return")
        ins = [t for e, t, _ in spans if e == "in"]
        outs = [t for e, t, _ in spans if e == "out"]
        threads |= {"caller" if tid == main else "other" for e, _, tid in spans if e == "in"}
        forward.append(grad - t0)
        if ins:
            to_bwd.append(ins[0] - grad)
            in_bwd.append(sum(o - i for i, o in zip(ins, outs)))
            after.append(ret - outs[-1])
        else:
            to_bwd.append(ret - grad)
    torch.cuda.synchronize()
    us = lambda v: round(statistics.median(v) * 1e6, 2) if v else None  # noqa: E731
    return {"forward_us": us(forward), "to_backward_us": us(to_bwd), "in_backward_us": us(in_bwd),
            "after_backward_us": us(after), "python_backward_ran_on": sorted(threads),
            "wall_us": round(timing.wall_ms(step, device="cuda") * 1e3, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    torch.autograd.grad = _grad
    wrapped = _wrap_library()
    report = header("cuda", "quick", ["backward_thread"]) | {
        "format": "rlk-triton-backward-thread/1", "commit": args.commit, "wrapped_functions": wrapped, "rows": []}
    for name, make in _cases():
        try:
            step = make()
            row = {"case": name}
            for mode, threaded in (("default", True), ("caller", False)):
                with torch.autograd.set_multithreading_enabled(threaded):
                    row[mode] = _measure(step, args.calls)
            print(json.dumps(row), flush=True)
            if not name.startswith(("torch", "Python")):
                with torch.autograd.set_multithreading_enabled(False):  # where cProfile sees the backward
                    row["profile_backward_on_caller"] = profile_top(step, n=200, lines=25)
            report["rows"].append(row)
        except Exception as ex:  # noqa: BLE001 - keep measuring the other cases
            report.setdefault("errors", []).append({"case": name, "error": repr(ex)[:300]})
            print(f"{name}: {ex!r}"[:300], flush=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if report.get("errors") else 0


if __name__ == "__main__":
    raise SystemExit(main())
