"""The attention backward's tiles on the GPU: for each head dim, the backward's device time with the
locked attention_bwd_dkdv / attention_bwd_dq rows, then with other (block_m, block_n, num_warps,
num_stages) for one kernel at a time against the other's locked row (split_min_len kept as locked),
then the best dkdv with the best dq together; each candidate's determinism (two runs, torch.equal),
its gradients against the locked ones (other tiles give other bits, so only a size check) and SDPA's
default backend's backward on the same inputs. Optionally (--fwd256) the D=256 forward's tiles, speed
only: the forward's block_n is the reduction order that decode shares, so those rows are candidates
for a new bit class, never a free choice.

    python scripts/gpu_attention_tiles.py --out tiles.json --commit <sha> [--time-box 480]
        [--dims 128 64 256] [--dtype bfloat16] [--fwd256] [--jobs 12] [--max-candidates N]

Backward tiles are a speed choice (docs/attention.md): the backward must stay deterministic (no
atomics, one writer per element) but has no cross-path bitwise requirement. Candidates are set by
replacing this device's rows of configs.LOCKED_CONFIGS in-process (as tests/test_attention.py and
scripts/gpu_attention_split.py do) and restored after each one; nothing is written to the table.

Time: --time-box (seconds from the start of main) stops new candidates; the JSON is rewritten after
every candidate and at the end. The time is shared out between the head dims (what one leaves is the
next one's), and dkdv / dq candidates alternate, nearest the locked tile first, so a short box still
covers both kernels of every dim. Before timing, --jobs worker processes compile every candidate
(triton's warmup: nothing launched; the main process then loads them from triton's disk cache) and
load them (shared memory / thread limits: such a candidate is reported, not run). Pick the box a
minute under the call's limit (imports and the first inputs come before it starts).

--smoke: the CPU stand-in (Triton interpreter, tiny shapes, two candidates per kernel, host clock):
the whole path (rows replaced and checked, launch, determinism, diffs, SDPA, JSON) without a GPU.
"""
import argparse
import dataclasses
import gc
import itertools
import json
import math
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from contextlib import contextmanager
from types import SimpleNamespace

if "--smoke" in sys.argv[1:]:  # the interpreter flag must be set before triton decorates a kernel
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from rlk_triton import configs  # noqa: E402
from rlk_triton._runtime import arch_of, as_dtype, interpreter_active  # noqa: E402
from rlk_triton.bench.timing import cpu_ms, events_ms, graph_ms  # noqa: E402
from rlk_triton.ops import attention as ops  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_attention_split import sdpa_backend  # noqa: E402

KERNELS = {"dkdv": "attention_bwd_dkdv", "dq": "attention_bwd_dq", "fwd": "attention_fwd"}
FIELDS = ("block_m", "block_n", "num_warps", "num_stages")
# (sequences, tokens each) per head dim: causal training shapes whose backward takes milliseconds
SHAPES = {64: (4, 8192), 128: (4, 8192), 256: (4, 4096)}


def bucket(d):
    return "d<=128" if d <= 128 else "d256"


def row_key(kernel, arch, dtype, d):
    return (kernel, configs.table_arch(arch, kernel), str(dtype).removeprefix("torch."), bucket(d))


def cfg_dict(c):
    return {f: getattr(c, f) for f in FIELDS + ("split_min_len", "scores_t")}


def cfg_text(c):
    return f"bm={c.block_m} bn={c.block_n} w={c.num_warps} st={c.num_stages}" + (" scores_t" if c.scores_t else "")


@contextmanager
def rows_set(cfgs, arch, dtype, d):
    """Replace this device's locked rows {short kernel name: config} for the block; restored after."""
    saved = {}
    try:
        for name, c in cfgs.items():
            key = row_key(KERNELS[name], arch, dtype, d)
            saved[key] = configs.LOCKED_CONFIGS[key]
            configs.LOCKED_CONFIGS[key] = c
        yield
    finally:
        configs.LOCKED_CONFIGS.update(saved)


def smem_estimate_kb(c, d, elt=2):
    """(block_m + 2 block_n) x D x stages operand bytes: a rough figure (against the sm90 compiler's
    own, triton 3.9: from 0.45x to 3x), so it only skips the obviously too big; a launch that does not
    fit raises OutOfResources, caught and reported."""
    return (c.block_m + 2 * c.block_n) * d * elt * c.num_stages / 1024


def candidates(locked, sizes, warps, stages, d, skip_kb, scores_t=None):
    """(config, skip reason or None) for every tile of the grid but the locked one, nearest it first:
    fewer changed fields, then fewer doublings / stage steps. scores_t: the values of that flag to try
    (dk / dv only; None: the locked one's)."""
    out = []
    for bm, bn, w, s, t in itertools.product(sizes, sizes, warps, stages, scores_t or (locked.scores_t,)):
        c = dataclasses.replace(locked, block_m=bm, block_n=bn, num_warps=w, num_stages=s, scores_t=t)
        if c == locked:
            continue
        est = smem_estimate_kb(c, d)
        out.append((c, f"smem estimate {est:.0f} KB > {skip_kb:.0f} KB" if est > skip_kb else None))

    def dist(item):
        c = item[0]
        changed = sum(getattr(c, f) != getattr(locked, f) for f in FIELDS + ("scores_t",))
        steps = sum(abs(math.log2(getattr(c, f) / getattr(locked, f))) for f in FIELDS[:3])
        return changed, steps + abs(c.num_stages - locked.num_stages)
    return sorted(out, key=dist)


# ---- parallel compile (worker processes; the main process then hits triton's disk cache) ----

class _Warmup:
    """A kernel whose launches only compile (JITFunction.run(warmup=True)); the compiled kernels are kept."""
    compiled = []

    def __init__(self, fn, name):
        self.fn, self.name = fn, name

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            kernel = self.fn.run(*args, grid=grid, warmup=True, **kwargs)
            _Warmup.compiled.append((self.name, kernel))
            return kernel
        return call


def _precompile(item):
    """Worker: compile and load (never launch) the kernels of one candidate at the real run's
    specialization (the same dtypes, head counts, strides, split rule; N a multiple of 16 as the
    real N is). Returns (index, task, result): ok + each kernel's shared bytes / registers / spills,
    or the error. A start mark with the worker's pid lets the parent see a compiler abort."""
    index, marks, task = item
    with open(os.path.join(marks, f"{index}.start"), "w") as f:
        f.write(str(os.getpid()))
    kind, d, hq, hkv, dt, max_seqlen, n_real, cfgs = task
    try:
        if not isinstance(ops._bwd_dq_kernel, _Warmup):
            for name in ("_fwd_kernel", "_bwd_preprocess_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel"):
                setattr(ops, name, _Warmup(getattr(ops, name), name))
        dtype = getattr(torch, dt)
        n = 64 + n_real % 16  # divisible by 16 (a specialization) exactly when the real N is
        q, do, out = (torch.empty(n, hq, d, device="cuda", dtype=dtype) for _ in range(3))
        k, v = (torch.empty(n, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
        lse = torch.empty(hq, n, device="cuda", dtype=torch.float32)
        cu = torch.tensor([0, n], device="cuda", dtype=torch.int32)
        cfgs = {name: configs.MatmulConfig(**fields) for name, fields in cfgs.items()}  # dataclasses.asdict's
        arch = arch_of(q.device)
        _Warmup.compiled.clear()
        if kind == "fwd":
            ops.launch_forward(q, k, v, cu, max_seqlen, d ** -0.5, True, cfg=cfgs.get("fwd"))
        else:
            with rows_set(cfgs, arch, dtype, d):
                ops.launch_backward(do, None, q, k, v, out, lse, cu, max_seqlen, d ** -0.5, True)
        info = {}
        for name, kernel in _Warmup.compiled:
            if hasattr(kernel, "_init_handles"):
                kernel._init_handles()  # loads the module: raises OutOfResources where it cannot run
            info[name] = {"shared": getattr(getattr(kernel, "metadata", None), "shared", None),
                          "n_regs": getattr(kernel, "n_regs", None), "n_spills": getattr(kernel, "n_spills", None)}
        return index, task, {"ok": True, "kernels": info}
    except Exception as ex:  # noqa: BLE001 - reported
        return index, task, {"ok": False, "error": f"{type(ex).__name__}: {str(ex)[:300]}"}


def _alive(pid):
    try:
        os.kill(pid, 0)  # no signal: does the (own, spawned) worker still exist
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def precompile(tasks, jobs, seconds, log):
    """Compile the tasks on `jobs` spawned processes within `seconds`: [(task, result)]. The locked
    tasks are compiled before the rest, so that no two workers build the locked kernels. A task whose
    worker died (a compiler abort takes the process with it) is returned as crashed: the main process
    must not compile it."""
    results = []
    if not tasks or jobs <= 0:
        return results
    t0 = time.time()
    marks = tempfile.mkdtemp(prefix="rlk-tiles-")
    items = list(enumerate(tasks))
    pending = {}
    pool = multiprocessing.get_context("spawn").Pool(jobs)

    def started(i):
        try:
            with open(os.path.join(marks, f"{i}.start")) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None  # not started yet (or the mark is being written)

    try:
        for group in ([x for x in items if x[1][0] == "locked"], [x for x in items if x[1][0] != "locked"]):
            it = pool.imap_unordered(_precompile, [(i, marks, t) for i, t in group])
            pending = {i: t for i, t in group}
            while pending:
                if time.time() - t0 > seconds:
                    raise TimeoutError
                try:
                    i, task, res = it.next(timeout=1.0)
                    results.append((task, res))
                    pending.pop(i, None)
                except multiprocessing.TimeoutError:
                    for i in list(pending):
                        pid = started(i)
                        if pid is not None and not _alive(pid):
                            log(f"precompile: the worker of {pending[i][0]} D={pending[i][1]} {pending[i][7]} died")
                            results.append((pending.pop(i), {"ok": False, "crashed": True,
                                                             "error": "crashed: its compiling worker died"}))
    except TimeoutError:
        # one still compiling may hang the main process too: reported, not run; the unstarted compile when run
        late = [i for i in pending if started(i) is not None]
        results += [(pending[i], {"ok": False, "unfinished": True,
                                  "error": "unfinished: still compiling when the precompile share ended"})
                    for i in late]
        log(f"precompile: time share used, {len(results) - len(late)}/{len(tasks)} done, {len(late)} unfinished "
            f"(skipped); the rest compile when run")
    except Exception as ex:  # noqa: BLE001 - a broken pool only costs the main process the compiles
        log(f"precompile stopped: {type(ex).__name__}: {str(ex)[:200]}")
    finally:
        pool.terminate()
        pool.join()
        shutil.rmtree(marks, ignore_errors=True)
    return results


def _task_key(kind, d, cfgs):
    return kind, d, json.dumps({k: cfg_dict(c) for k, c in sorted(cfgs.items())}, sort_keys=True)


# ---- measuring ----

def make_timer(device, graphs=True):
    """(ms, how): CUDA-graph device time, CUDA events where the graph cannot be captured (or with
    graphs=False), the host clock under the interpreter."""
    if device.type != "cuda":
        return lambda fn: (cpu_ms(fn, n=1), "cpu")
    if not graphs:
        return lambda fn: (events_ms(fn), "events")

    def timer(fn):
        try:
            return graph_ms(fn), "graph"
        except Exception:  # noqa: BLE001 - the events fallback re-raises a real failure
            torch.cuda.synchronize()
            return events_ms(fn), "events"
    return timer


def cuda_healthy(device):
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False


def grad_diffs(got, ref, ref_max):
    out = {"max_abs_diff": {}, "rel_diff": {}, "bitwise_vs_locked": {}}
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        diff = (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
        out["max_abs_diff"][name] = diff
        out["rel_diff"][name] = diff / ref_max[name] if ref_max[name] else diff
        out["bitwise_vs_locked"][name] = torch.equal(a, b)
    return out


class Run:
    """The inputs of one head dim and the measurements made on them."""

    def __init__(self, args, d, device, dtype, timer, log):
        self.args, self.d, self.device, self.dtype, self.timer, self.log = args, d, device, dtype, timer, log
        seqs, seqlen = SHAPES.get(d, (4, 8192)) if not args.smoke else (1, 64)
        seqs, seqlen = args.seqs or seqs, args.seqlen or seqlen
        self.lens = [seqlen] * seqs
        self.hq, self.hkv = (4, 2) if args.smoke else (args.hq, args.hkv)
        self.N, self.L = sum(self.lens), seqlen
        g = torch.Generator(device=device).manual_seed(d)
        self.cu = torch.tensor([0] + self.lens, device=device).cumsum(0).to(torch.int32)
        self.q, self.k, self.v = (torch.randn(self.N, h, d, device=device, generator=g).to(dtype)
                                  for h in (self.hq, self.hkv, self.hkv))
        self.scale = d ** -0.5
        self.out, self.lse = ops.launch_forward(self.q, self.k, self.v, self.cu, self.L, self.scale, True)
        self.do = torch.randn(self.out.shape, device=device, generator=g).to(dtype)
        self.arch = arch_of(self.q.device)
        self.shape = (f"{seqs} x {seqlen}, {self.hq}/{self.hkv} heads, D={d}, causal, "
                      f"{str(dtype).removeprefix('torch.')}")

    def locked(self, name):
        return configs.LOCKED_CONFIGS[row_key(KERNELS[name], self.arch, self.dtype, self.d)]

    def bwd(self):
        return ops.launch_backward(self.do, None, self.q, self.k, self.v, self.out, self.lse, self.cu, self.L,
                                   self.scale, True)

    def fwd(self, cfg=None):
        return ops.launch_forward(self.q, self.k, self.v, self.cu, self.L, self.scale, True, cfg=cfg)

    def measure_bwd(self, cfgs, ref=None, ref_max=None, locked_ms=None):
        """One backward configuration ({short kernel name: config}; {} = the locked rows): device ms,
        determinism, diffs against the locked gradients."""
        row = {}
        try:
            with rows_set(cfgs, self.arch, self.dtype, self.d):
                for name, c in cfgs.items():  # the launch reads what was set: proof the candidate runs
                    got = ops._cfg(KERNELS[name], self.q)
                    assert got == c, f"{name}: the launch would use {got}, not {c}"
                r1 = self.bwd()
                r2 = self.bwd()
                row["deterministic"] = all(torch.equal(a, b) for a, b in zip(r1, r2))
                del r2
                row["bwd_ms"], row["time"] = self.timer(self.bwd)
            if ref is not None:
                row.update(grad_diffs(r1, ref, ref_max))
                row["agrees"] = all(x <= self.args.agree_tol for x in row["rel_diff"].values())
            if locked_ms:
                row["locked_ms"] = locked_ms
                row["speedup"] = locked_ms / row["bwd_ms"]
            return row, r1
        except Exception as ex:  # noqa: BLE001 - reported
            row["error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
            return row, None
        finally:
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def measure_fwd(self, cfg, ref, locked_ms):
        row = {}
        try:
            r1 = self.fwd(cfg)
            r2 = self.fwd(cfg)
            row["deterministic"] = all(torch.equal(a, b) for a, b in zip(r1, r2))
            row["fwd_ms"], row["time"] = self.timer(lambda: self.fwd(cfg))
            row["bitwise_vs_locked"] = {"out": torch.equal(r1[0], ref[0]), "lse": torch.equal(r1[1], ref[1])}
            row["max_abs_diff"] = {"out": (r1[0].float() - ref[0].float()).abs().max().item(),
                                   "lse": (r1[1] - ref[1]).abs().max().item()}
            row["locked_ms"], row["speedup"] = locked_ms, locked_ms / row["fwd_ms"]
        except Exception as ex:  # noqa: BLE001 - reported
            row["error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
        gc.collect()
        return row

    def sdpa(self):
        """SDPA's default backend on the same inputs ([B, H, L, D] views): fwd and fwd + bwd in CUDA
        graphs, and the backward alone (autograd of a saved output, graph retained) by CUDA events
        around eager calls: its kernels run on the saved forward's stream, which a graph capture on
        another stream would not take."""
        B, L, d = len(self.lens), self.L, self.d
        qs, ks, vs = (x.detach().reshape(B, L, -1, d).transpose(1, 2).requires_grad_()
                      for x in (self.q, self.k, self.v))
        dos = self.do.reshape(B, L, self.hq, d).transpose(1, 2)

        def fwd():
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)

        def fwd_bwd():
            return torch.autograd.grad(fwd(), (qs, ks, vs), dos)

        row = {"backend": sdpa_backend(qs, ks, vs) if self.device.type == "cuda" else "cpu"}
        saved = fwd()
        events = make_timer(self.device, graphs=False)
        for name, fn, timer in (
                ("fwd_ms", fwd, self.timer), ("fwd_bwd_ms", fwd_bwd, self.timer),
                ("bwd_ms", lambda: torch.autograd.grad(saved, (qs, ks, vs), dos, retain_graph=True), events)):
            try:
                row[name], row[name.replace("_ms", "_time")] = timer(fn)
            except Exception as ex:  # noqa: BLE001 - reported
                row[name.replace("_ms", "_error")] = f"{type(ex).__name__}: {str(ex)[:200]}"
        if "fwd_ms" in row and "fwd_bwd_ms" in row:
            row["bwd_by_difference_ms"] = row["fwd_bwd_ms"] - row["fwd_ms"]
        del saved
        return row


def best(rows, kernel):
    ok = [r for r in rows if r.get("kernel") == kernel and "bwd_ms" in r and r.get("deterministic")
          and r.get("agrees", True)]
    return sorted(ok, key=lambda r: r["bwd_ms"])


def table_line(kernel, arch, dtype, d, c):
    key = row_key(kernel, arch, dtype, d)
    return (f"{key}: MatmulConfig({c.block_m}, {c.block_n}, 0, 1, {c.num_warps}, {c.num_stages}, "
            f"split_min_len={c.split_min_len}" + (", scores_t=True)" if c.scores_t else ")"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--time-box", type=float, default=1e9, help="seconds from the start: no new candidate after")
    ap.add_argument("--dims", type=int, nargs="+", default=None, help="head dims (default 128 64 256)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--seqs", type=int, default=None, help="sequences (default: 4 per dim)")
    ap.add_argument("--seqlen", type=int, default=None, help="tokens per sequence (default 8192; D=256: 4096)")
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="block_m / block_n values (32 64 128)")
    ap.add_argument("--warps", type=int, nargs="+", default=None, help="num_warps values (4 8)")
    ap.add_argument("--stages", type=int, nargs="+", default=None, help="num_stages values (1 2 3)")
    ap.add_argument("--max-candidates", type=int, default=None, help="per kernel and dim (default all)")
    ap.add_argument("--smem-skip-kb", type=float, default=450.0,
                    help="skip a tile whose rough smem estimate (smem_estimate_kb) passes this; default: only the "
                         "obviously too big (the estimate is off by up to 3x either way)")
    ap.add_argument("--agree-tol", type=float, default=2e-2,
                    help="max |grad - locked grad| / max |locked grad| per tensor for 'agrees'")
    ap.add_argument("--confirm", type=int, default=3, help="re-time the best K per kernel beside the locked rows")
    ap.add_argument("--fwd256", action="store_true", help="also the D=256 forward's tiles (speed only)")
    ap.add_argument("--scores-t", choices=("locked", "on", "both"), default="locked",
                    help="dk / dv candidates with configs scores_t as locked (default), transposed only, or both")
    ap.add_argument("--jobs", type=int, default=None, help="compile workers (default cores - 2, at most 14; 0: off)")
    ap.add_argument("--precompile-share", type=float, default=0.4, help="of the time box, at most")
    ap.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    t0 = time.time()

    def left():
        return args.time_box - (time.time() - t0)

    def log(msg):
        print(f"[{time.time() - t0:6.0f}s] {msg}", flush=True)

    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not interpreter_active():
        raise SystemExit("needs a CUDA GPU, or --smoke (the Triton interpreter on CPU)")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = as_dtype(args.dtype)
    smoke = args.smoke
    dims = args.dims or ([16, 32] if smoke else [128, 64, 256])
    sizes = args.sizes or ([16, 32] if smoke else [32, 64, 128])
    warps = args.warps or ([4] if smoke else [4, 8])
    stages = args.stages or ([1] if smoke else [1, 2, 3])
    max_cands = args.max_candidates or (2 if smoke else None)
    confirm_k = min(args.confirm, 1) if smoke else args.confirm
    jobs = 0 if not cuda else (args.jobs if args.jobs is not None else max(1, min(14, (os.cpu_count() or 4) - 2)))
    timer = make_timer(device)
    original = dict(configs.LOCKED_CONFIGS)
    blocks = [(d, True) for d in dims] + ([(256, False)] if args.fwd256 and 256 not in dims else [])
    report = {"what": "attention backward tiles (dkdv, dq) against the locked rows, same run; D=256 forward tiles "
                      "(speed only) with --fwd256",
              "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter: host clock, not a GPU "
                                                                  "figure)",
              "torch": torch.__version__, "triton": triton.__version__, "commit": args.commit,
              "date": time.strftime("%Y-%m-%d"), "fingerprint": configs.fingerprint(), "args": vars(args),
              "time_box_s": args.time_box, "stopped_by_time_box": False, "precompile": None, "dims": [],
              "summary": []}

    def write():
        report["elapsed_s"] = time.time() - t0
        tmp = f"{args.out}.tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.out)

    def on_term(signum, frame):  # a timeout's SIGTERM: the finally below still writes the JSON
        raise SystemExit(128 + signum)
    old_term = signal.signal(signal.SIGTERM, on_term)

    try:
        runs, plans = {}, {}
        for d, do_bwd in blocks:
            run = Run(args, d, device, dtype, timer, log)
            runs[d] = run
            plan = []
            if do_bwd:
                flags = {"locked": None, "on": (True,), "both": (False, True)}[args.scores_t]
                per = {name: candidates(run.locked(name), sizes, warps, stages, d, args.smem_skip_kb,
                                        flags if name == "dkdv" else None)[:max_cands]
                       for name in ("dkdv", "dq")}
                # alternate the kernels: a time box that cuts the list leaves both explored alike
                for a, b in itertools.zip_longest(per["dkdv"], per["dq"]):
                    plan += [("dkdv",) + a] if a else []
                    plan += [("dq",) + b] if b else []
            if args.fwd256 and d == 256:
                fl = run.locked("fwd")
                fsizes = args.sizes or ([16, 32] if smoke else [32, 64, 128])
                fc = [(dataclasses.replace(fl, block_m=bm, block_n=bn, num_warps=w, num_stages=s), None)
                      for bm, bn, w, s in itertools.product(fsizes, fsizes[:2], warps, stages)]
                fc = [x for x in fc if x[0] != fl][:max_cands]
                # interleave the forward rows with the backward ones
                merged = []
                for i, item in enumerate(plan):
                    merged.append(item)
                    if i % 3 == 2 and fc:
                        merged.append(("fwd",) + fc.pop(0))
                plan = merged + [("fwd",) + x for x in fc]
            plans[d] = plan
            log(f"D={d}: {run.shape}; {sum(p[0] != 'fwd' for p in plan)} backward / "
                f"{sum(p[0] == 'fwd' for p in plan)} forward candidates")

        # compile everything first, in parallel, while nothing is timed
        if jobs:
            tasks = []
            for d, plan in plans.items():
                run = runs[d]
                base = (d, run.hq, run.hkv, str(dtype).removeprefix("torch."), run.L, run.N)
                lk = {"dkdv": dataclasses.asdict(run.locked("dkdv")), "dq": dataclasses.asdict(run.locked("dq"))}
                tasks.append(("locked",) + base + (lk,))
                for kind, c, skip in plan:
                    if skip is None:
                        tasks.append((kind if kind == "fwd" else "bwd",) + base + ({kind: dataclasses.asdict(c)},))
            t = time.time()
            res = precompile(tasks, jobs, max(0.0, left()) * args.precompile_share, log)
            pre = {}
            for task, r in res:
                kind, d = task[0], task[1]
                cfgs = {k: configs.MatmulConfig(**v) for k, v in task[7].items()}
                pre[_task_key("fwd" if kind == "fwd" else "bwd", d, cfgs if kind != "locked" else {})] = r
            report["precompile"] = {"workers": jobs, "tasks": len(tasks), "done": len(res),
                                    "seconds": time.time() - t,
                                    "errors": sorted({r["error"] for _, r in res if not r["ok"]})[:20]}
            log(f"precompile: {len(res)}/{len(tasks)} in {time.time() - t:.0f}s, "
                f"{sum(not r['ok'] for _, r in res)} errors")
        else:
            pre = {}
        write()

        for i, (d, do_bwd) in enumerate(blocks):
            if left() <= 0:
                report["stopped_by_time_box"] = True
                break
            run = runs[d]
            budget = left() / (len(blocks) - i)
            deadline = time.time() + budget
            tail = min(30.0, 0.15 * budget)  # for the pair, the confirmation and the locked re-time
            locked = {name: run.locked(name) for name in ("dkdv", "dq")}
            block = {"d": d, "shape": run.shape, "locked": {k: cfg_dict(c) for k, c in locked.items()},
                     "table_keys": {k: list(row_key(KERNELS[k], run.arch, dtype, d)) for k in KERNELS},
                     "rows": [], "fwd256": [], "confirm": []}
            report["dims"].append(block)
            base_row, ref = run.measure_bwd({})
            block["locked_row"] = base_row
            if ref is None:
                log(f"D={d}: the locked backward failed: {base_row.get('error')}")
                write()
                if not cuda_healthy(device):
                    report["fatal"] = "CUDA context lost"
                    break
                continue
            locked_ms = base_row["bwd_ms"]
            ref_max = {n: t.float().abs().max().item() for n, t in zip(("dq", "dk", "dv"), ref)}
            log(f"D={d} locked dkdv {cfg_text(locked['dkdv'])}, dq {cfg_text(locked['dq'])}: {locked_ms:.3f} ms "
                f"({base_row['time']}), deterministic={base_row['deterministic']}")
            try:
                block["sdpa"] = run.sdpa()
                s = block["sdpa"]
                log(f"D={d} SDPA default ({s['backend']}): bwd {s.get('bwd_ms', float('nan')):.3f} ms, "
                    f"fwd+bwd - fwd {s.get('bwd_by_difference_ms', float('nan')):.3f} ms")
            except Exception as ex:  # noqa: BLE001 - reported
                block["sdpa"] = {"error": f"{type(ex).__name__}: {str(ex)[:200]}"}
            fwd_ref = run.fwd()  # the locked forward: its time for context, the --fwd256 rows' reference
            block["locked_fwd"] = cfg_dict(run.locked("fwd"))
            block["locked_fwd_ms"], _ = timer(run.fwd)
            write()
            plan = plans[d]
            fatal = False
            for j, (kind, c, skip) in enumerate(plan):
                if left() <= 0 or time.time() > deadline - tail:
                    block["stopped_at"] = f"{j}/{len(plan)}"
                    report["stopped_by_time_box"] = report["stopped_by_time_box"] or left() <= 0
                    log(f"D={d}: time share used after {j}/{len(plan)} candidates")
                    break
                kernel = KERNELS[kind]
                row = {"kernel": kernel, **cfg_dict(c), "smem_estimate_kb": round(smem_estimate_kb(c, d), 1)}
                p = pre.get(_task_key("fwd" if kind == "fwd" else "bwd", d, {kind: c}))
                if p is not None:
                    row["compile"] = p.get("kernels") or {"error": p.get("error")}
                if skip:
                    row["error"] = f"skipped: {skip}"
                elif p is not None and not p["ok"] and (p.get("crashed") or p.get("unfinished")
                                                        or "OutOfResources" in p["error"]):
                    row["error"] = f"precompile: {p['error']}"
                elif kind == "fwd":
                    row.update(run.measure_fwd(c, fwd_ref, block["locked_fwd_ms"]))
                else:
                    r, _ = run.measure_bwd({kind: c}, ref, ref_max, locked_ms)
                    row.update(r)
                (block["fwd256"] if kind == "fwd" else block["rows"]).append(row)
                ms = row.get("bwd_ms", row.get("fwd_ms"))
                if ms is not None:
                    extra = (f" diff dq/dk/dv {'/'.join(f'{x:.1e}' for x in row['max_abs_diff'].values())}"
                             f" agrees={row['agrees']}" if kind != "fwd" else
                             f" bitwise out/lse {row['bitwise_vs_locked']['out']}/{row['bitwise_vs_locked']['lse']}")
                    log(f"D={d} {kind} {j + 1}/{len(plan)} {cfg_text(c)}: {ms:.3f} ms ({row['speedup']:.3f}x "
                        f"locked) det={row['deterministic']}{extra}")
                else:
                    log(f"D={d} {kind} {j + 1}/{len(plan)} {cfg_text(c)}: {row['error'][:160]}")
                write()
                if "error" in row and not row["error"].startswith(("skipped", "precompile")) \
                        and not cuda_healthy(device):
                    report["fatal"] = f"CUDA context lost after D={d} {kind} {cfg_text(c)}"
                    fatal = True
                    break
            if fatal:
                break
            # the best of each kernel together, then the best ones re-timed beside the locked rows
            tops = {kind: best(block["rows"], KERNELS[kind]) for kind in ("dkdv", "dq")}
            winners = {kind: dataclasses.replace(locked[kind], **{f: rs[0][f] for f in FIELDS})
                       for kind, rs in tops.items() if rs and rs[0]["bwd_ms"] < locked_ms}
            block["best"] = {kind: {**cfg_dict(c), "bwd_ms": tops[kind][0]["bwd_ms"],
                                    "speedup": locked_ms / tops[kind][0]["bwd_ms"],
                                    "table": table_line(KERNELS[kind], run.arch, dtype, d, c)}
                             for kind, c in winners.items()}
            pairs = []  # re-timed beside the locked rows (--confirm 0: none)
            if len(winners) == 2 and left() > 0:
                r, _ = run.measure_bwd(winners, ref, ref_max, locked_ms)
                block["combined"] = {"dkdv": cfg_dict(winners["dkdv"]), "dq": cfg_dict(winners["dq"]), **r}
                if "bwd_ms" in r:
                    log(f"D={d} best dkdv + best dq: {r['bwd_ms']:.3f} ms ({r['speedup']:.3f}x) "
                        f"det={r['deterministic']} agrees={r.get('agrees')}")
                    pairs += [("combined", winners)] if confirm_k else []
            for rank in range(confirm_k):  # best dkdv, best dq, second dkdv, ...
                for kind in ("dkdv", "dq"):
                    if rank < len(tops[kind]):
                        c = dataclasses.replace(locked[kind], **{f: tops[kind][rank][f] for f in FIELDS})
                        pairs.append((kind, {kind: c}))
            for label, cfgs in pairs:  # alternate locked / candidate: drift shows in both
                if left() <= 0 or time.time() > deadline:
                    break
                lk, _ = run.measure_bwd({})
                cand, _ = run.measure_bwd(cfgs)
                if "bwd_ms" in lk and "bwd_ms" in cand:
                    block["confirm"].append({"what": label, **{k: cfg_dict(v) for k, v in cfgs.items()},
                                             "locked_ms": lk["bwd_ms"], "bwd_ms": cand["bwd_ms"],
                                             "speedup": lk["bwd_ms"] / cand["bwd_ms"]})
                    log(f"D={d} confirm {label} {' + '.join(cfg_text(v) for v in cfgs.values())}: "
                        f"{cand['bwd_ms']:.3f} vs locked {lk['bwd_ms']:.3f} ms "
                        f"({lk['bwd_ms'] / cand['bwd_ms']:.3f}x)")
            if left() > 0:
                again, _ = run.measure_bwd({})
                block["locked_again_ms"] = again.get("bwd_ms")
            fbest = sorted((r for r in block["fwd256"] if "fwd_ms" in r), key=lambda r: r["fwd_ms"])
            summary = {"d": d, "locked_ms": locked_ms, "locked_again_ms": block.get("locked_again_ms"),
                       "sdpa_bwd_ms": block["sdpa"].get("bwd_ms"), "sdpa_backend": block["sdpa"].get("backend"),
                       "best": block["best"], "combined_ms": block.get("combined", {}).get("bwd_ms"),
                       "combined_speedup": block.get("combined", {}).get("speedup"),
                       "measured": sum("bwd_ms" in r for r in block["rows"]), "planned": len(plan),
                       "failed": sum("error" in r for r in block["rows"]),
                       "nondeterministic": [f"{r['kernel']} {cfg_text(SimpleNamespace(**r))}" for r in block["rows"]
                                            if r.get("deterministic") is False],
                       "not_agreeing": [f"{r['kernel']} {cfg_text(SimpleNamespace(**r))}: rel diff "
                                        f"{max(r['rel_diff'].values()):.2e}" for r in block["rows"]
                                        if r.get("agrees") is False],
                       "fwd256_best": ({**{f: fbest[0][f] for f in FIELDS}, "fwd_ms": fbest[0]["fwd_ms"],
                                        "speedup": fbest[0]["speedup"]} if fbest else None)}
            report["summary"].append(summary)
            write()
            del run, ref
            runs.pop(d, None)
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    finally:
        configs.LOCKED_CONFIGS.clear()
        configs.LOCKED_CONFIGS.update(original)
        report["table_restored"] = configs.LOCKED_CONFIGS == original
        report["stopped_by_time_box"] = report["stopped_by_time_box"] or left() <= 0
        write()
        signal.signal(signal.SIGTERM, old_term)
    for s in report["summary"]:
        log(f"SUMMARY D={s['d']}: locked {s['locked_ms']:.3f} ms (again {s['locked_again_ms']}), "
            f"SDPA {s['sdpa_backend']} bwd {s['sdpa_bwd_ms']}, combined {s['combined_ms']} ({s['combined_speedup']}); "
            f"{s['measured']}/{s['planned']} measured, {s['failed']} failed or skipped, "
            f"nondeterministic {s['nondeterministic']}, not agreeing {s['not_agreeing']}")
        for kind, b in s["best"].items():
            log(f"  best {kind}: {b['speedup']:.3f}x  {b['table']}")
        if s["fwd256_best"]:
            log(f"  fwd256 best (speed only, another block_n is another reduction order): {s['fwd256_best']}")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
