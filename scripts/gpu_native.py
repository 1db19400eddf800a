"""native/ on the GPU: the gates (`rlk_triton.native.admit` for every op, which writes the admission
records), then the native kernels against the Triton kernels (forward and backward launches), same
run: rows {op, shape, backend, wall_ms, device_ms, bitwise} for the raw launches and, when admitted,
the public calls (rms_norm(backend=...), selected_logp(backend=...)).

    python scripts/gpu_native.py --out native.json --commit <sha> [--variants] [--op rmsnorm selected_logp]

wall_ms: calls from the host with one sync at the end (what an eager caller pays per call);
device_ms: the same call captured in a CUDA graph, the median of three measurements taken in turn
with the other calls of the shape (differences of 1-2% are what the large-size target is about).
"bare extension call": the binding alone with the layout precomputed (two torch allocations and the
launch, the stream handle read): the floor of any torch-allocating native call. --variants also builds
the kernels without streaming cache hints (-DRLK_STREAMING=0), the backward with them
(-DRLK_BWD_STREAMING=1) and the backward's row loads through the read-only path (-DRLK_BWD_READONLY_LOADS=1),
and times each beside the build's (same bits: load and store paths are not operations; each row's
bitwise field checks it); `--variants FLAG ...` builds only those.
"""
import argparse
import json
import statistics
import time

import torch
import triton

from rlk_triton import bench, native
from rlk_triton.ops import launch, rmsnorm
from rlk_triton.ops.rmsnorm import rms_norm


# -D flag -> the rows' backend name; an RLK_BWD_ flag changes only the backward, so its build is timed there only
VARIANTS = {"RLK_STREAMING=0": "native launch, no streaming hints",
            "RLK_BWD_STREAMING=1": "native launch, streaming hints in the backward",
            "RLK_BWD_READONLY_LOADS=1": "native launch, read-only loads in the backward"}


def build_variant(flag: str):
    """The rmsnorm extension built with one more -D flag (timing only: never gated or recorded)."""
    from torch.utils.cpp_extension import load as build

    nop = native.native_op("rmsnorm")
    tag = "".join(ch if ch.isalnum() else "_" for ch in flag.lower())  # a valid extension (module) name
    return build(name=f"rlk_native_rmsnorm_{native.source_hash('rmsnorm')}_{tag}",
                 sources=[str(native.NATIVE_DIR / s) for s in nop.sources],
                 extra_cuda_cflags=[*native.BUILD_FLAGS, f"-D{flag}"], verbose=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--variants", nargs="*", default=None, choices=sorted(VARIANTS), metavar="FLAG",
                    help=f"time builds with one more -D flag: these, or all of {sorted(VARIANTS)}")
    ap.add_argument("--op", nargs="+", default=sorted(native.OPS), choices=sorted(native.OPS),
                    help="gate and time these ops (rmsnorm among them: its rows come first)")
    args = ap.parse_args()
    if "rmsnorm" not in args.op:
        ap.error("--op: rmsnorm is always gated and timed")
    gates, records = {}, {}
    for op in args.op:
        t0 = time.time()
        gates[op] = native.admit(op)
        gates[op]["seconds"] = time.time() - t0
        records[op] = json.loads(native.record_path(op).read_text()) if gates[op]["admitted"] else None
        print(op, {k: v for k, v in gates[op].items() if k != "mismatches"}, gates[op]["mismatches"][:20], flush=True)
    gate = gates["rmsnorm"]
    rows = []
    report = {"what": "native/ rms_norm forward (with and without the residual) and backward, selected_logp forward "
                      "and backward: the gates, then native against Triton, same run",
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "commit": args.commit, "date": time.strftime("%Y-%m-%d"), "gates": gates, "records": records,
              "rows": rows}
    ext = native.load("rmsnorm")
    variants = {}
    if args.variants is not None:
        t1 = time.time()
        for flag in args.variants or sorted(VARIANTS):
            variants[flag] = build_variant(flag)
        report["variant_build_s"] = time.time() - t1
    g = torch.Generator(device="cuda").manual_seed(0)
    for (N, H), fused in [(shape, fused) for shape in ((1, 4096), (8, 4096), (64, 4096), (1024, 4096),
                                                       (16384, 4096), (16384, 8192)) for fused in (False, True)]:
        x = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16)
        w = torch.randn(H, device="cuda", generator=g).to(torch.bfloat16)
        r = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16) if fused else None
        rest = (r,) if fused else ()  # the launchers' optional residual
        want = rmsnorm.launch_forward(x, w, r, 1e-6, 0.0)
        want = want[:2] if fused else want[:1]  # y, and residual_out when fused
        layout = native._rmsnorm_config(x, residual=r)
        stream = launch.stream_handle
        calls = {"triton launch": lambda: rmsnorm.launch_forward(x, w, r, 1e-6, 0.0),
                 "native launch": lambda: native._rmsnorm_forward(ext, x, w, 1e-6, 0.0, *rest),
                 # the stream read in the call: a handle read once would launch outside a graph's capture
                 "bare extension call": lambda: ext.rms_norm_fwd(x, r, w, 1e-6, 0.0, *layout, stream(x.device.index)),
                 "rms_norm(backend='triton')": lambda: rms_norm(x, w, eps=1e-6, residual=r)}
        for flag, mod in variants.items():
            if not flag.startswith("RLK_BWD_"):  # else the forward is the same code in that build
                calls[VARIANTS[flag]] = lambda mod=mod: native._rmsnorm_forward(mod, x, w, 1e-6, 0.0, *rest)
        if gate["admitted"]:
            calls["rms_norm(backend='cuda_native')"] = lambda: rms_norm(x, w, eps=1e-6, residual=r,
                                                                        backend="cuda_native")
        # y, and residual_out when fused (every call returns y first, residual_out second when fused)
        time_calls(rows, calls, lambda name, got: {
            "op": "rms_norm fwd" + (" + residual" if fused else ""), "shape": f"{N} x {H} bf16",
            "bitwise": all(native.same_bits(a, b) for a, b in zip(got[:len(want)], want))})
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    rmsnorm_backward_rows(rows, ext, g, gate["admitted"], variants)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    if "selected_logp" in gates:
        selected_logp_rows(rows, gates["selected_logp"]["admitted"], g)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


def backward_cases(g):
    """(N, H, fused, launch_backward's arguments) of the timed rms_norm backward rows: training-sized
    bf16 rows, dW on, without and with the residual (its gradient read, d residual written)."""
    for (N, H), fused in [(shape, fused) for shape in ((1024, 4096), (16384, 4096), (16384, 8192))
                          for fused in (False, True)]:
        h = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16)
        w = torch.randn(H, device="cuda", generator=g).to(torch.bfloat16)
        rstd = torch.rsqrt(h.float().square().mean(1) + 1e-6)
        gy = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16)
        gr = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16) if fused else None
        yield N, H, fused, (gy, gr, h, w, rstd, 0.0, True, fused)


def rmsnorm_backward_rows(rows, ext, g, admitted, variants):
    """The rms_norm backward launches (dx and dW; d residual and the residual_out gradient when fused),
    Triton against native, training-sized rows, bf16; then the public fwd+bwd call (torch.autograd.grad)
    per backend, the issue's [16384 x 4096] target (native only where admitted)."""
    for N, H, fused, args in backward_cases(g):
        want = rmsnorm.launch_backward(*args)
        calls = {"triton backward launch": lambda: rmsnorm.launch_backward(*args),
                 "native backward launch": lambda: native._rmsnorm_backward(ext, *args)}
        for flag, mod in variants.items():
            calls[VARIANTS[flag].replace("launch", "backward launch")] = \
                lambda mod=mod: native._rmsnorm_backward(mod, *args)
        time_calls(rows, calls, lambda name, got: {
            "op": "rms_norm bwd" + (" + residual" if fused else ""), "shape": f"{N} x {H} bf16",
            "bitwise": all(native.same_bits(a, b) for a, b in zip(got, want) if a.numel() or b.numel())})
    h = torch.randn(16384, 4096, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    w = torch.randn(4096, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    gy = torch.randn(16384, 4096, device="cuda", generator=g).to(torch.bfloat16)
    public = {f"rms_norm(backend='{b}') fwd+bwd": lambda b=b: torch.autograd.grad(rms_norm(h, w, backend=b), (h, w), gy)
              for b in ("triton",) + (("cuda_native",) if admitted else ())}
    want = public["rms_norm(backend='triton') fwd+bwd"]()
    time_calls(rows, public, lambda name, got: {
        "op": "rms_norm fwd+bwd (public call)", "shape": "16384 x 4096 bf16",
        "bitwise": all(native.same_bits(a, b) for a, b in zip(got, want))})


def selected_logp_rows(rows, admitted, g):
    """Decode-sized selected_logp (1 / 8 / 64 rows of a 151936 vocab, bf16, with and without entropy)
    and a training-sized one: the Triton and native launches, the bare binding, the public calls."""
    from rlk_triton.logp import selected_logp
    from rlk_triton.ops import selected_logp as slp

    ext = native.load("selected_logp")
    stream = launch.stream_handle
    for N, entropy in ((1, False), (1, True), (8, True), (64, True), (4096, True)):
        logits = (torch.randn(N, 151936, device="cuda", generator=g) * 4).to(torch.bfloat16)
        t = torch.randint(0, 151936, (N,), device="cuda", generator=g)
        args = (logits, t, None, 1.0, None, -100, entropy)
        want = tuple(slp.launch_forward(*args))
        block_v, chunk_v, vec = native._slp_config(logits)
        g_logp, g_ent = native._slp_upstream(N, entropy, logits.device)
        bwd_args = (g_logp, g_ent, logits, t, None, 1.0, None, -100, want[2], want[3], want[1])
        grad = slp.launch_backward(*bwd_args)
        calls = {"triton launch": lambda: slp.launch_forward(*args),
                 "native launch": lambda: native._slp_forward(ext, *args),
                 "triton backward launch": lambda: slp.launch_backward(*bwd_args),
                 "native backward launch": lambda: native._slp_backward(ext, *bwd_args),
                 "bare extension call": lambda: ext.selected_logp_fwd(logits, t, None, None, 1.0, -100, entropy, block_v,
                                                                      chunk_v, vec, stream(logits.device.index)),
                 "selected_logp(backend='triton')": lambda: selected_logp(logits, t, return_entropy=entropy,
                                                                          validate=False)}
        if admitted:
            calls["selected_logp(backend='cuda_native')"] = lambda: selected_logp(
                logits, t, return_entropy=entropy, validate=False, backend="cuda_native")
        time_calls(rows, calls, lambda name, got: {
            "op": "selected_logp " + ("bwd" if "backward" in name else "fwd") + (" + entropy" if entropy else ""),
            "shape": f"{N} x 151936 bf16",
            "bitwise": all(native.same_bits(a, b) for a, b in zip(got, (grad,) if "backward" in name else want)
                           if a.numel())})


def time_calls(rows, calls, describe):
    """A row per call: device time (the median of three CUDA-graph measurements, taken in turn with the
    shape's other calls so that clocks and temperature drift hit every call alike), wall time per call
    from the host, and describe(name, outputs)'s fields (op, shape, bitwise)."""
    device = {name: [] for name in calls}
    for _ in range(3):
        for name, fn in calls.items():
            device[name].append(bench.graph_ms(fn))
    for name, fn in calls.items():
        got = fn()
        got = got if isinstance(got, (tuple, list)) else (got,)
        rows.append(dict(describe(name, got), backend=name, wall_ms=bench.wall_ms(fn),
                         device_ms=statistics.median(device[name]), device_ms_each=device[name]))
        print(rows[-1], flush=True)


if __name__ == "__main__":
    main()
