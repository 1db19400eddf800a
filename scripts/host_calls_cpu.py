"""Host time of public calls at decode sizes on this CPU, with every Triton launcher stubbed out: what a
call costs in Python before and around its launches (checks, dispatch, config lookups, allocations,
validation, and the library's own launch path: argument signatures, templates, remembered descriptor
maps), the part of an eager call's wall time that is not the kernel (issue 20). A proxy for the GPU
host: Triton's C launcher and the driver are not counted, and a GPU machine's CPU is faster or slower.

    python scripts/host_calls_cpu.py [--json FILE] [--label TEXT] [--stub launch] [--only TEXT]

Kernels are never run: the JIT function of every rlk_triton.ops.launch.CachedLaunch is replaced by a
stand-in whose "compiled kernel" launches nothing (for a kernel with host descriptors, through a copy
of Triton 3.6's descriptor wrapper, which ops.launch takes over as on the GPU), and the interpreter
flag is faked so that CPU tensors pass the device checks; outputs are garbage. `--stub launch`
replaces CachedLaunch.launch itself with a no-op instead, as this script did before 2026-12-06
(the library's launch path then not counted either). The backend="cuda_native" rows run the public
native path against a stand-in extension that returns preallocated outputs, as if admitted: what
that path costs in Python before the binding's own ~20 us (docs/native.md). Each row: the median
over 7 rounds of 2000 calls, microseconds per call.
"""
import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

import rlk_triton._runtime as _runtime

_runtime.interpreter_active = lambda: True  # CPU tensors pass the device checks; nothing is interpreted
from rlk_triton.ops import launch  # noqa: E402

launch.stream_handle = lambda index: 0  # no CUDA stream here

import torch  # noqa: E402

torch.cuda.current_device = lambda: 0  # CachedLaunch keys its entries by it

from rlk_triton import configs, native  # noqa: E402

from rlk_triton.advantages import gae, group_advantages  # noqa: E402
from rlk_triton.attention import attention_decode  # noqa: E402
from rlk_triton.logp import selected_logp  # noqa: E402
from rlk_triton.losses import gspo_loss, policy_loss  # noqa: E402
from rlk_triton.ops.embedding import embedding  # noqa: E402
from rlk_triton.ops.matmul import matmul, matmul_into  # noqa: E402
from rlk_triton.ops.rmsnorm import rms_norm  # noqa: E402
from rlk_triton.ops.rope import apply_rope  # noqa: E402
from rlk_triton.ops.swiglu import swiglu  # noqa: E402
from rlk_triton.testing.launchers import descriptor_wrapper  # noqa: E402


def _no_launch(*args):
    """Triton's C launcher, stubbed."""


class _Compiled:
    """A compiled kernel that launches nothing; with host descriptors at `positions`, its launcher has
    Triton 3.6's shape, so ops.launch remembers the maps as on the GPU (a map is a placeholder)."""
    function, packed_metadata = 0, None

    def __init__(self, positions):
        wrapped = descriptor_wrapper(lambda *a: None, positions, [0] * len(positions),
                                     lambda arg, meta: [object(), *arg.shape, *arg.strides])

        class Run:  # as CudaLauncher: `launch` is the C launcher, or the wrapper around it
            global_scratch_size = profile_scratch_size = 0
            launch_cooperative_grid = launch_pdl = False

            def __init__(self):
                self.launch = wrapped if positions else _no_launch

            def __call__(self, gx, gy, gz, stream, function, *args):
                self.launch(gx, gy, gz, stream, function, False, False, None, None, *args)

        self.run = Run()


class _StandInJit:
    """A JIT function's stand-in: `jit[grid](*args, **meta)` returns a _Compiled per descriptor layout."""

    def __init__(self, jit):
        self.params, self.compiled = jit.params, {}

    def __getitem__(self, grid):
        from triton.tools.tensor_descriptor import TensorDescriptor

        def go(*args, **meta):
            positions = tuple(i for i, a in enumerate(args) if type(a) is TensorDescriptor)
            return self.compiled.setdefault(positions, _Compiled(positions))
        return go


def stub_launchers(mode: str) -> None:
    """`launch`: CachedLaunch.launch is a no-op. `launcher`: every kernel of rlk_triton.ops gets a
    stand-in JIT (its modules imported here: some public modules import theirs on first use)."""
    import importlib
    import pkgutil

    import rlk_triton.ops

    if mode == "launch":
        launch.CachedLaunch.launch = lambda self, grid, args, meta: None
        return
    for info in pkgutil.iter_modules(rlk_triton.ops.__path__):
        importlib.import_module(f"rlk_triton.ops.{info.name}")
    for name, module in list(sys.modules.items()):
        if name.startswith("rlk_triton"):
            for value in vars(module).values():
                if type(value) is launch.CachedLaunch and not isinstance(value.jit, _StandInJit):
                    value.jit = _StandInJit(value.jit)


def calls():
    bf = torch.bfloat16
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 4096, generator=g).to(bf), torch.ones(4096, dtype=bf)
    gate, up = torch.randn(8, 14336, generator=g).to(bf), torch.randn(8, 14336, generator=g).to(bf)
    W = torch.randn(4096, 4096, generator=g).to(bf)
    ids, E = torch.randint(0, 1000, (8,), generator=g), torch.randn(1000, 4096, generator=g).to(bf)
    logits, target = torch.randn(1, 151936, generator=g).to(bf), torch.randint(0, 151936, (1,), generator=g)
    q, k = torch.randn(8, 32, 128, generator=g).to(bf), torch.randn(8, 8, 128, generator=g).to(bf)
    cos, sin = torch.randn(4096, 64, generator=g), torch.randn(4096, 64, generator=g)
    pos = torch.randint(0, 4096, (8,), generator=g)
    kc = torch.zeros(64, 256, 8, 128, dtype=bf)
    bt = torch.arange(64, dtype=torch.int32).reshape(8, 8)
    lens = torch.full((8,), 1000, dtype=torch.int32)
    xg, wg, dy = x.clone().requires_grad_(), w.clone().requires_grad_(), torch.randn(8, 4096, generator=g).to(bf)

    def rms_fwd_bwd():
        return torch.autograd.grad(rms_norm(xg, wg), (xg, wg), dy)

    lp = torch.randn(256, 4096, generator=g).requires_grad_()
    old_lp, adv = torch.randn(256, 4096, generator=g), torch.randn(256, 4096, generator=g)
    active = torch.ones(256, 4096, dtype=torch.bool)

    rewards, values = torch.randn(64, 1024, generator=g), torch.randn(64, 1024, generator=g)
    response_mask = torch.rand(64, 1024, generator=g) < 0.9
    scores, group_ids, valid = torch.randn(8, generator=g), torch.arange(8) % 2, torch.rand(8, generator=g) < 0.9

    def policy_fwd_bwd():  # the shape; only the loss is differentiated
        return torch.autograd.grad(policy_loss(lp, old_lp, adv, mask=active)[0], lp)

    seq_lp = torch.randn(64, 1024, generator=g).requires_grad_()
    seq_old, seq_adv, seq_mask = torch.randn(64, 1024, generator=g), torch.randn(64, generator=g), active[:64, :1024]

    def gspo_fwd_bwd():  # the host-overhead report's shape
        return torch.autograd.grad(gspo_loss(seq_lp, seq_old, seq_adv, mask=seq_mask)[0], seq_lp)

    class NativeStandIn:  # the bindings' return values, preallocated: the Python path alone is timed
        rms = [torch.empty(8, 4096, dtype=bf), torch.empty(0, dtype=bf), torch.empty(8)]
        slp = [torch.empty(1) for _ in range(4)]

        @classmethod
        def rms_norm_fwd(cls, *args):
            return cls.rms

        @classmethod
        def selected_logp_fwd(cls, *args):
            return cls.slp

    x1, mm_out = x[:1].clone(), torch.empty(1, 4096, dtype=bf)  # the GPU's path: sm90's config at M 1 takes
    sm90_one_row = configs.lookup_matmul("matmul", "sm90", bf, rows=1, cols=4096)  # the descriptor kernel
    native.load = lambda op: NativeStandIn
    native.usable = lambda op, device: (True, None)
    return {
        "rms_norm fwd [8 x 4096]": lambda: rms_norm(x, w),
        "rms_norm(backend='cuda_native') fwd [8 x 4096]": lambda: rms_norm(x, w, backend="cuda_native"),
        "rms_norm fwd+bwd [8 x 4096]": rms_fwd_bwd,
        "swiglu fwd [8 x 14336]": lambda: swiglu(gate, up),
        "matmul [8 x 4096] @ [4096 x 4096]^T": lambda: matmul(x, W.t()),
        "matmul_into [1 x 4096] @ [4096 x 4096]^T, sm90 config (descriptors)": lambda: matmul_into(
            x1, W.t(), mm_out, cfg=sm90_one_row),
        "embedding fwd 8 ids": lambda: embedding(ids, E),
        "apply_rope 8 tokens, 32 + 8 heads": lambda: apply_rope(q, k, cos, sin, pos),
        "selected_logp [1 x 151936]": lambda: selected_logp(logits, target),
        "selected_logp(backend='cuda_native') [1 x 151936]": lambda: selected_logp(logits, target,
                                                                                  backend="cuda_native"),
        "attention_decode 8 seqs x 1000 cached": lambda: attention_decode(q, kc, kc, bt, lens),
        "policy_loss fwd+bwd [256 x 4096]": policy_fwd_bwd,
        "gspo_loss fwd+bwd [64 x 1024]": gspo_fwd_bwd,
        "gae [64 x 1024], bool mask": lambda: gae(rewards, values, response_mask, gamma=0.99, lam=0.95),
        "group_advantages 8 seqs in 2 groups, bool valid": lambda: group_advantages(
            scores, group_ids, num_groups=2, valid=valid, validate=False),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--label", default="")
    ap.add_argument("--only", default="", help="the calls whose name contains this text")
    ap.add_argument("--stub", choices=("launcher", "launch"), default="launcher",
                    help="what is replaced by a no-op: Triton's launcher (default) or CachedLaunch.launch")
    args = ap.parse_args()
    stub_launchers(args.stub)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = []
    for name, fn in calls().items():
        if args.only not in name:
            continue
        for _ in range(200):
            fn()
        rounds = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            rounds.append((time.perf_counter() - t0) / 2000 * 1e6)
        rows.append({"call": name, "host_us": statistics.median(rounds)})
        print(f"{name:40s} {rows[-1]['host_us']:7.1f} us", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"what": __doc__.splitlines()[0], "commit": commit, "label": args.label,
                       "cpu": platform.processor() or platform.machine(), "python": sys.version.split()[0],
                       "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "stub": args.stub,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
