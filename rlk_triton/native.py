"""native/: optional hand-written CUDA kernels, admitted per machine only when bitwise equal to the
Triton kernel (native/README.md, docs/native.md).

- Build: torch.utils.cpp_extension compiles native/*.cu and bindings.cpp on first use (ninja, sm_90a,
  --fmad=false), only with a CUDA torch and nvcc; a CPU install never tries.
- Gate: `admit(op)` (`rlk-triton native admit`) runs the op's gate cases with the native and the Triton
  kernel and requires the same bits in every output (NaNs by their bit patterns). Success writes a
  record with this process's fingerprint to the per-user cache ($RLK_NATIVE_CACHE, else
  ~/.cache/rlk_triton/native/<op>.json).
- A record counts only while its fingerprint equals the current one (sources, build flags, nvcc,
  device and capability, driver, CUDA, torch, triton, the op's own locked-config rows): `status()` says
  why each op is or is not admitted. Nothing here switches a call to a native kernel by itself.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Optional

import torch

from .errors import InputError, RlkError

NATIVE_DIR = Path(__file__).resolve().parents[1] / "native"  # a source checkout (editable install)
BUILD_FLAGS = ("-O3", "--fmad=false", "-gencode=arch=compute_90a,code=sm_90a")
RECORD_FORMAT = "rlk-triton-native-admission/1"


class NativeUnavailable(RlkError, RuntimeError):
    """The native build cannot run here (no CUDA torch, no nvcc, no sources); the message says which."""


@dataclasses.dataclass(frozen=True)
class NativeOp:
    op: str  # the registry's operator name
    sources: tuple  # files under native/ that make its binary
    arch: str  # the one arch its kernels are written for
    cases: Callable[[str], list]  # device -> [(label, inputs)]
    triton: Callable  # inputs -> tuple of tensors (the semantic implementation)
    native: Callable  # (extension module, inputs) -> tuple of tensors
    # the locked-config kernels the op's Triton launches read (configs.lookup's first argument): the
    # admission depends on their rows only (tests/test_native.py checks the list against the lookups)
    config_kernels: tuple = ()


# ---- rms_norm forward, with or without the fused residual add ----

def _full_vec(dtype: torch.dtype, tile: int, warps: int) -> int:
    """A blocked layout's full vector: 16 bytes' worth of lanes per thread, at most the thread's share of
    the tile (native/rmsnorm_kernels.cu full_vec)."""
    return min(16 // dtype.itemsize, max(tile // (32 * warps), 1))


def _rmsnorm_config(x, arch=None, residual=None):
    """(BLOCK_H, num_warps, vec, rows) of the Triton launch for x (and the residual, if fused): the
    native layout. vec is the lanes per thread per vector of the layout Triton 3.6 reduces in (16
    bytes, at most BLOCK_H / threads; in the rows kernel 1 when neither H nor a row stride is a
    multiple of 16: the JIT's divisibility specialization), or None where the native kernel has no
    rule: the rows kernel with the residual, H not a multiple of 16 and a row stride that is one.
    There Triton 3.6 reduces each row twice in two layouts and scales y by the other sum's rstd (its
    PTX has two sqrt per row; y differs from the native kernel's by an ulp in the emulator), so the
    native kernel refuses the call. Found by compiling the kernels for sm90 with the JIT's
    specialization and running their PTX beside the native kernel's in scripts/ptx_emulator.py
    (scripts/native_ptx_compare.py), for 16-byte aligned x, residual and weight only: the native
    kernel refuses other pointers. rows: the rows kernel's rows per program (the native kernel's rows
    per block, speed only). arch: the config table to read (default: x's device's)."""
    from ._runtime import arch_of

    res_16 = None if residual is None else residual.stride(0) % 16 == 0
    return _rmsnorm_layout(arch or arch_of(x.device), x.dtype, x.shape[1], x.stride(0) % 16 == 0, res_16)


@functools.lru_cache(maxsize=None)
def _rmsnorm_layout(arch: str, dtype: torch.dtype, H: int, stride_16: bool, res_stride_16: Optional[bool] = None):
    """_rmsnorm_config's value, once per key: the call path asks on every call (host time is what a
    native decode-sized call is for)."""
    from . import configs
    from .ops import rmsnorm

    cfg = configs.lookup("rmsnorm_fwd", arch, dtype, H)
    block = rmsnorm.hidden_tile(cfg, H)
    rows = configs.lookup("rmsnorm_fwd_rows", arch, dtype, H).block_v
    rows = rows if rows > 1 and block >= H else 1
    vec = _full_vec(dtype, block, cfg.num_warps)
    if rows > 1 and H % 16:
        if res_stride_16 is None:
            vec = vec if stride_16 else 1
        else:  # fused: only the all-VEC-1 layout has a rule (docstring)
            vec = 1 if not (stride_16 or res_stride_16) else None
    return block, cfg.num_warps, vec, rows


@functools.lru_cache(maxsize=None)
def _rmsnorm_bwd_layout(arch: str, dtype: torch.dtype, H: int):
    """(BLOCK_H, num_warps, rows per dW partial, vec) of the Triton backward launch: the native
    backward's layout. Unlike the forward's, vec is the full 16 bytes (at most BLOCK_H / threads) for
    every H and row stride: Triton 3.6 keeps that layout and falls back to narrower accesses
    (scripts/native_ptx_compare.py's backward cases). The dW reduction's layout depends on H only
    (native/rmsnorm_kernels.cu)."""
    from . import configs
    from .ops import rmsnorm

    cfg = configs.lookup("rmsnorm_bwd", arch, dtype, H)
    block = rmsnorm.hidden_tile(cfg, H)
    rows = configs.lookup("rmsnorm_dw_rows", arch, dtype, H).block_v
    return block, cfg.num_warps, rows, _full_vec(dtype, block, cfg.num_warps)


def _rmsnorm_upstream(x, residual):
    """The gate's upstream gradients for y (and residual_out): fixed, signed, varied per element."""
    n = x.numel()
    i = torch.arange(n, device=x.device, dtype=torch.float32)
    g = torch.sin(i * 0.37).mul_(2).to(x.dtype).view(x.shape)
    return g.contiguous(), (torch.cos(i * 0.11).to(x.dtype).view(x.shape).contiguous() if residual is not None else None)


def _rmsnorm_triton(x, w, eps, offset, residual=None):
    """The gate's outputs of the Triton launches: (y, rstd) or (y, residual_out, rstd), then dx and dW
    (and d residual with the residual) of the backward for _rmsnorm_upstream's gradients."""
    from .ops import rmsnorm

    y, res_out, rstd = rmsnorm.launch_forward(x, w, residual, eps, offset)
    gy, gr = _rmsnorm_upstream(x, residual)
    dx, dw, dres = rmsnorm.launch_backward(gy, gr, res_out if residual is not None else x, w, rstd, offset, True,
                                           residual is not None)
    if residual is None:
        return y, rstd, dx, dw
    return y, res_out, rstd, dx, dw, dres


def _rmsnorm_native(ext, x, w, eps, offset, residual=None):
    """_rmsnorm_triton's outputs from the native kernels."""
    fwd = _rmsnorm_forward(ext, x, w, eps, offset, residual)
    gy, gr = _rmsnorm_upstream(x, residual)
    h = fwd[1] if residual is not None else x
    dx, dw, dres = _rmsnorm_backward(ext, gy, gr, h, w, fwd[-1], offset, True, residual is not None)
    return fwd + ((dx, dw) if residual is None else (dx, dw, dres))


def _rmsnorm_forward(ext, x, w, eps, offset, residual=None, layout=None):
    from .ops.launch import stream_handle

    block, warps, vec, rows = layout or _rmsnorm_config(x, residual=residual)
    if vec is None:
        raise InputError("residual", "no native layout for the fused add with H not a multiple of 16 and a row "
                         "stride that is one (docs/native.md)")
    y, res_out, rstd = ext.rms_norm_fwd(x, residual, w, eps, offset, block, warps, vec, rows,
                                       stream_handle(x.device.index))
    return (y, rstd) if residual is None else (y, res_out, rstd)


def _rmsnorm_backward(ext, grad_y, grad_res, h, w, rstd, offset, with_dw, with_dres):
    """(dx, dw or [0], d residual or an empty tensor), as rmsnorm.launch_backward returns them. The
    gradients must be contiguous and 16-byte aligned (the layout rule is known for aligned rows only):
    a misaligned one is copied first, which moves its bits and changes none."""
    from ._runtime import arch_of
    from .ops.launch import stream_handle

    grad_y, grad_res = (t if t is None or t.data_ptr() % 16 == 0 else t.clone() for t in (grad_y, grad_res))
    block, warps, rows, _ = _rmsnorm_bwd_layout(arch_of(h.device), h.dtype, h.shape[1])
    return tuple(ext.rms_norm_bwd(grad_y, grad_res, h, w, rstd, offset, with_dw, with_dres, block, warps, rows,
                                  stream_handle(h.device.index)))


RMSNORM_GATE_H = (128, 200, 384, 1000, 1024, 2048, 4096, 4099, 8192, 12288, 16384)


def _rmsnorm_cases(device) -> list:
    """One-tile rows of every (BLOCK_H, num_warps) the native kernels have and every dtype, tails,
    special values; batch sizes 1..300 so the same rows also show batch invariance; forward and
    backward (fixed upstream gradients, _rmsnorm_upstream)."""
    out = []
    g = torch.Generator().manual_seed(0)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for H in RMSNORM_GATE_H:
            for N in (1, 7, 300):
                x = (torch.randn(N, H, generator=g) * 3).to(dt)
                if N == 7:  # zeros, a huge row, subnormal-sized values
                    x[1] = 0
                    x[2] = x[2] * 1e4 if dt != torch.float16 else x[2] * 100
                    x[3] = x[3] * 1e-30 if dt != torch.float16 else x[3] * 1e-6
                w = (torch.randn(H, generator=g) * 0.5 + 1).to(dt)
                for eps, offset in ((1e-6, 0.0), (1e-5, 1.0)):
                    out.append((f"{str(dt)[6:]} N={N} H={H} eps={eps} offset={offset}",
                                (x.to(device), w.to(device), eps, offset)))
                # the fused residual add: h = dtype(x + r) normalized, r large enough that h differs
                r = (torch.randn(N, H, generator=g) * 8).to(dt)
                out.append((f"{str(dt)[6:]} N={N} H={H} residual", (x.to(device), w.to(device), 1e-6, 1.0, r.to(device))))
        x = torch.randn(5, 4096 + 64, generator=g).to(dt)[:, :4096]  # a row stride wider than H
        out.append((f"{str(dt)[6:]} strided rows", (x.to(device), torch.ones(4096, dtype=dt).to(device), 1e-6, 0.0)))
        # strided x and residual: both row strides multiples of 16, and both not (with H = 4099 too)
        for H, pad in ((4096, 64), (4096, 3), (4099, 1)):
            x = torch.randn(5, H + pad, generator=g).to(dt)[:, :H]
            r = torch.randn(5, H + pad + 16, generator=g).to(dt)[:, :H]
            out.append((f"{str(dt)[6:]} strided rows H={H} residual", (x.to(device), torch.ones(H, dtype=dt).to(device),
                                                                     1e-6, 0.0, r.to(device))))
        # more dW partial rows than the reduction's lane tile (129 blocks of 64 rows): its second group
        for H in (1000, 1024):
            x = torch.randn(64 * 128 + 65, H, generator=g).to(dt)
            w = (torch.randn(H, generator=g) * 0.5 + 1).to(dt)
            out.append((f"{str(dt)[6:]} N={x.shape[0]} H={H}", (x.to(device), w.to(device), 1e-6, 1.0)))
    return out


# ---- selected_logp forward and backward ----

def _slp_config(logits, arch=None):
    """(BLOCK_V, CHUNK_V, vec) of the Triton launch for [rows, V] logits: the native layout. vec is
    the layout's lanes per vector: 16 bytes' worth when the row stride is a multiple of 16 (the JIT
    marks it divisible, so rows start 16-byte aligned), else 1. Found, like rms_norm's, by running
    Triton 3.6's sm90 PTX beside the native PTX in the emulator (scripts/native_ptx_compare.py)."""
    from ._runtime import arch_of

    return _slp_layout(arch or arch_of(logits.device), logits.dtype, logits.shape[-1], logits.stride(0) % 16 == 0)


@functools.lru_cache(maxsize=None)
def _slp_layout(arch: str, dtype: torch.dtype, V: int, stride_16: bool):
    from . import configs

    cfg = configs.lookup("selected_logp_fwd", arch, dtype, V)
    split = configs.lookup("selected_logp_chunk", arch, dtype, V)
    return cfg.block_v, split.block_v, _full_vec(dtype, cfg.block_v, 1) if stride_16 else 1


def _slp_rows(logits):
    """[..., V] logits as the [N, V] rows the native kernels take, or None. A view, for leading dims with
    the strides of a dense [N, V] (every stride, a size-1 dim's too: Triton's 3-D addressing reads both
    strides, so a [1, T, V] whose first stride is not T * V's is laid out by the other one), where
    Triton's [B, T, V] launch has the [N, V] launch's layout (scripts/native_ptx_compare.py's 3-D cases)."""
    if logits.dim() == 2:
        return logits
    if logits.dim() == 1:
        return logits.view(1, -1)
    if any(logits.stride(i) != logits.stride(i + 1) * logits.shape[i + 1] for i in range(logits.dim() - 2)):
        return None
    return logits.view(-1, logits.shape[-1])


def _slp_bwd_vec(logits) -> int:
    """The native backward's elements per thread access: 16 bytes' worth where every row start of the
    logits and of d logits ([rows, V], contiguous) stays 16-byte aligned, else 1. Speed only: the
    backward is elementwise, its bits do not depend on it."""
    full = 16 // logits.element_size()
    V = logits.shape[-1]
    return full if logits.stride(0) % full == 0 and V % full == 0 and logits.data_ptr() % 16 == 0 else 1


def slp_bwd_launch(V: int, vec: int) -> tuple[int, int, int]:
    """(vectors a thread, threads a block, blocks a row) of the native backward's launch
    (native/selected_logp_kernels.cu: bwd_unroll, BWD_THREADS, launch_bwd), for the harnesses that run
    its PTX in the emulator."""
    unroll, threads = (16 if vec == 1 else 4), 64
    return unroll, threads, -(-V // (threads * unroll * vec))


def _slp_upstream(n, with_entropy, device):
    """The gate's upstream gradients: fixed, signed, different per row (entropy's only with entropy)."""
    g = torch.linspace(-1.5, 1.25, n, device=device)
    return g, (torch.linspace(0.75, -0.5, n, device=device) if with_entropy else None)


def _slp_triton(logits, target, row_index, temperature, temperature_rows, ignore_index, with_entropy):
    """(logp, entropy, row_max, row_logsum) of the Triton forward launch, then d logits of its backward
    launch for the gate's upstream gradients."""
    from .ops import selected_logp

    out = tuple(selected_logp.launch_forward(logits, target, row_index, temperature, temperature_rows, ignore_index,
                                             with_entropy))
    g, h = _slp_upstream(target.numel(), with_entropy, logits.device)
    return out + (selected_logp.launch_backward(g, h, logits, target, row_index, temperature, temperature_rows,
                                                ignore_index, out[2], out[3], out[1]),)


def _slp_native(ext, logits, target, row_index, temperature, temperature_rows, ignore_index, with_entropy):
    """_slp_triton's outputs from the native kernels ([..., V] logits through their [N, V] view)."""
    rows = _slp_rows(logits)
    out = _slp_forward(ext, rows, target, row_index, temperature, temperature_rows, ignore_index, with_entropy)
    g, h = _slp_upstream(target.numel(), with_entropy, logits.device)
    return out + (_slp_backward(ext, g, h, rows, target, row_index, temperature, temperature_rows, ignore_index,
                                out[2], out[3], out[1]).view(logits.shape),)


def _slp_forward(ext, logits, target, row_index, temperature, temperature_rows, ignore_index, with_entropy,
                 layout=None):
    from .ops.launch import stream_handle

    block_v, chunk_v, vec = layout or _slp_config(logits)
    return tuple(ext.selected_logp_fwd(logits, target, row_index, temperature_rows, temperature, ignore_index,
                                       with_entropy, block_v, chunk_v, vec, stream_handle(logits.device.index)))


def _slp_backward(ext, grad_logp, grad_entropy, logits, target, row_index, temperature, temperature_rows,
                  ignore_index, row_max, row_logsum, entropy):
    from .ops.launch import stream_handle

    return ext.selected_logp_bwd(grad_logp, grad_entropy, logits, target, row_index, temperature_rows, temperature,
                                 ignore_index, row_max, row_logsum, entropy, _slp_bwd_vec(logits),
                                 stream_handle(logits.device.index))


def _slp_cases(device) -> list:
    """Forward and backward (d logits for fixed upstream gradients, _slp_upstream), compared output by
    output. Every V bucket and chunk count the native kernels have (1 to 64 chunks, FINISH and merged),
    every dtype, 1 / 7 / 64 rows (the same rows in several batch sizes), entropy on and off; targets
    ignored and out of range, huge, -inf and all -inf rows, per-row and scalar temperatures, int32
    ids, row indices with a bad one (validate=False), and row strides that are and are not multiples
    of 16."""
    out = []
    g = torch.Generator().manual_seed(1)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for V in (1000, 8000, 16000, 32000, 50257, 128256, 151936, 262144, 393216):
            if _slp_layout("sm90", dt, V, True)[1] * 64 < V:
                continue  # more chunks than two merge warps have lanes: no native kernel (the launcher refuses)
            for N in (1, 7, 64):
                x = (torch.randn(N, V, generator=g) * 4).to(dt)
                t = torch.randint(0, V, (N,), generator=g)
                if N == 7:
                    t[1], t[2] = -100, V + 3  # ignored; out of range (validate=False): NaN
                    x[3] = x[3] * 2000 if dt != torch.float16 else x[3] * 100  # huge logits
                    x[4, ::3] = float("-inf")
                    x[5] = float("-inf")  # all -inf: NaN results
                for ent in (False, True):
                    out.append((f"{str(dt)[6:]} N={N} V={V} entropy={ent}",
                                (x.to(device), t.to(device), None, 1.0, None, -100, ent)))
            x = (torch.randn(7, V + 8, generator=g) * 4).to(dt)[:, :V]  # a row stride not a multiple of 16
            t = torch.randint(0, V, (7,), generator=g)
            temps = (torch.rand(7, generator=g) + 0.5).float()
            out.append((f"{str(dt)[6:]} V={V} strided, per-row temperature",
                        (x.to(device), t.to(device), None, 1.0, temps.to(device), -100, True)))
            x = (torch.randn(9, V, generator=g) * 4).to(dt)
            rows = torch.tensor([8, 0, 3, 12, 6, 5], dtype=torch.int32)  # 12: not a row (validate=False)
            # (distinct rows, as the public call requires: a row scored twice has two racing d logits writers)
            out.append((f"{str(dt)[6:]} V={V} row indices, int32 ids, T=0.7",
                        (x.to(device), torch.randint(0, V, (6,), generator=g, dtype=torch.int32).to(device),
                         rows.to(device), 0.7, None, -100, True)))
        for B, T, V in ((2, 3, 151936), (3, 2, 50257), (2, 2, 8000)):  # [B, T, V]: Triton's 3-D addressing
            x = (torch.randn(B, T, V, generator=g) * 4).to(dt)
            out.append((f"{str(dt)[6:]} [{B}, {T}, {V}] logits",
                        (x.to(device), torch.randint(0, V, (B * T,), generator=g).to(device), None, 1.0, None, -100,
                         True)))
    return out


OPS = {"rmsnorm": NativeOp("rmsnorm", ("rmsnorm_kernels.cu", "bindings.cpp"), "sm90", _rmsnorm_cases,
                           _rmsnorm_triton, _rmsnorm_native,
                           ("rmsnorm_fwd", "rmsnorm_fwd_rows", "rmsnorm_bwd", "rmsnorm_dw_rows", "rmsnorm_dw_reduce")),
       "selected_logp": NativeOp("selected_logp", ("selected_logp_kernels.cu", "selected_logp_bindings.cpp"), "sm90",
                                 _slp_cases, _slp_triton, _slp_native,
                                 ("selected_logp_fwd", "selected_logp_chunk", "selected_logp_bwd"))}


def native_op(op: str) -> NativeOp:
    if op not in OPS:
        raise InputError("op", f"no native kernel for {op!r} (have: {sorted(OPS)})")
    return OPS[op]


# ---- fingerprint and records ----

def _nvcc() -> Optional[str]:
    from torch.utils.cpp_extension import CUDA_HOME

    for cand in ((Path(CUDA_HOME) / "bin" / "nvcc") if CUDA_HOME else None, shutil.which("nvcc")):
        if cand and Path(cand).exists():
            return str(cand)
    return None


@functools.lru_cache(maxsize=None)
def _nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def source_hash(op: str) -> str:
    """sha256 of the op's native sources and the build flags: names the binary."""
    h = hashlib.sha256(json.dumps(BUILD_FLAGS).encode())
    for name in native_op(op).sources:
        path = NATIVE_DIR / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"<missing>"))
    return h.hexdigest()[:16]


def _driver() -> Optional[str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:  # noqa: BLE001 - nvml absent: the driver is not part of the fingerprint then
        return None


def fingerprint(op: str, device="cuda") -> dict:
    """What an admission depends on, for `op` on `device` in this process."""
    import triton

    from ._runtime import arch_of

    dev = torch.device(device)
    gpu = dev.type == "cuda" and torch.cuda.is_available()
    nvcc = _nvcc()
    return {
        "op": op, "sources": source_hash(op), "build_flags": list(BUILD_FLAGS),
        "nvcc": _nvcc_version(nvcc) if nvcc else None,
        "device": torch.cuda.get_device_name(dev) if gpu else None,
        "capability": list(torch.cuda.get_device_capability(dev)) if gpu else None,
        "driver": _driver() if gpu else None, "cuda": torch.version.cuda,
        "torch": torch.__version__, "triton": triton.__version__,
        "locked_configs": config_fingerprint(op, arch_of(dev)) if gpu else None,
    }


def config_fingerprint(op: str, arch: str) -> str:
    """The op's own locked-config rows, hashed: a config change elsewhere in the table (another op's
    tiles) leaves its admission standing; a change of its own rows makes the record stale."""
    from . import configs

    return configs.fingerprint(arch, kernels=native_op(op).config_kernels)


def records_dir() -> Path:
    root = os.environ.get("RLK_NATIVE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "rlk_triton" / "native"


def record_path(op: str) -> Path:
    return records_dir() / f"{native_op(op).op}.json"


def read_record(op: str, path: Optional[Path] = None) -> Optional[dict]:
    """The admission record of `op` in the record cache (or at `path`, a committed copy), None where
    there is none or it is not a readable record of this format."""
    path = record_path(op) if path is None else path
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("format") == RECORD_FORMAT else None


def _write_record(op: str, record: dict) -> Path:
    path = record_path(op)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)  # atomic: a crash never leaves half a record
    return path


def admission(op: str, device="cuda") -> tuple[bool, str]:
    """(admitted here, why): a record exists and its fingerprint is this process's."""
    rec = read_record(op)
    if rec is None:
        return False, f"no admission record at {record_path(op)}: run `rlk-triton native admit --op {op}`"
    now = fingerprint(op, device)
    changed = sorted(k for k in set(now) | set(rec.get("fingerprint", {})) if rec["fingerprint"].get(k) != now.get(k))
    if changed:
        return False, "stale record: " + ", ".join(f"{k} {rec['fingerprint'].get(k)!r} -> {now.get(k)!r}"
                                                   for k in changed)
    return True, f"admitted {rec['date']} ({rec['cases']} cases bitwise equal)"


def availability(op: str, device) -> tuple[bool, Optional[str]]:
    """(usable on `device` in this process, why not): buildable here and admitted under this fingerprint."""
    why = unavailable_reason(op, device)
    if why:
        return False, why
    ok, why = admission(op, device)
    return ok, None if ok else why


@functools.lru_cache(maxsize=None)
def usable(op: str, device: str) -> tuple[bool, Optional[str]]:
    """availability(), once per (op, device) and process: what the call path asks on every call (the
    fingerprint hashes the sources and the op's config rows). admit() clears it."""
    return availability(op, device)


def status(device="cuda") -> list[dict]:
    """Per op: admitted (a record with this process's fingerprint) and why; where the native build
    cannot run on `device` at all (a CPU machine), that reason first: advising `admit` there would send
    the reader to a command that cannot succeed."""
    rows = []
    for op in OPS:
        ok, why = admission(op, device)
        cannot = unavailable_reason(op, device)
        if cannot:
            why = f"cannot build or run here ({cannot})" + ("" if read_record(op) is None else
                                                            f"; the record at {record_path(op)}: {why}")
        rows.append({"op": op, "backend": f"{op}.cuda_native", "admitted": ok, "reason": why, "unavailable": cannot})
    return rows


# ---- build ----

def unavailable_reason(op: str, device="cuda") -> Optional[str]:
    """Why the native build of `op` cannot run on `device` here, or None."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return f"native kernels run on CUDA devices, not {dev.type}"
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return "no CUDA torch here"
    from ._runtime import arch_of

    if arch_of(dev) != native_op(op).arch:
        return f"written for {native_op(op).arch}, this device is {arch_of(dev)}"
    if _nvcc() is None:
        return "no nvcc (CUDA_HOME / PATH)"
    missing = [s for s in native_op(op).sources if not (NATIVE_DIR / s).exists()]
    if missing:
        return f"sources not installed ({', '.join(missing)} under {NATIVE_DIR}): use a source checkout"
    return None


def compile_ptx(source: str) -> str:
    """The sm_90a PTX of native/<source> with the build's flags: what the order checks run in
    scripts/ptx_emulator.py without a GPU (tests/test_native*_order.py, scripts/native_ptx_compare.py).
    NativeUnavailable without nvcc."""
    nvcc = _nvcc()
    if nvcc is None:
        raise NativeUnavailable("no nvcc (CUDA_HOME / PATH)")
    flags = [f for f in BUILD_FLAGS if not f.startswith("-gencode")]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "k.ptx"
        subprocess.run([nvcc, *flags, "-arch=sm_90a", "-ptx", str(NATIVE_DIR / source), "-o", str(out)],
                       check=True, capture_output=True, timeout=900)
        return out.read_text()


@functools.lru_cache(maxsize=None)
def load(op: str):
    """The op's compiled extension (built once per source hash; ninja caches it across processes)."""
    why = unavailable_reason(op)
    if why:
        raise NativeUnavailable(why)
    from torch.utils.cpp_extension import load as build

    nop = native_op(op)
    return build(name=f"rlk_native_{op}_{source_hash(op)}", sources=[str(NATIVE_DIR / s) for s in nop.sources],
                 extra_cuda_cflags=list(BUILD_FLAGS), verbose=False)


def rms_norm_fwd(x, weight, eps: float, weight_offset: float, residual=None, layout=None):
    """(y, rstd), or (y, residual_out, rstd) with the residual, of the admitted native rms_norm forward
    (rlk_triton.ops.rmsnorm calls it for backend="cuda_native" after checking the admission, with the
    _rmsnorm_config layout it checked)."""
    return _rmsnorm_forward(load("rmsnorm"), x, weight, eps, weight_offset, residual, layout)


def rms_norm_bwd(grad_y, grad_residual, h, weight, rstd, weight_offset: float, with_dw: bool, with_dres: bool):
    """(dx, dw or [0], d residual or an empty tensor) of the admitted native rms_norm backward (the Triton
    launcher's arguments; grad_y / grad_residual contiguous [N, H])."""
    return _rmsnorm_backward(load("rmsnorm"), grad_y, grad_residual, h, weight, rstd, weight_offset, with_dw,
                             with_dres)


def selected_logp_fwd(logits, target, row_index, temperature: float, temperature_rows, ignore_index: int,
                      with_entropy: bool, layout=None):
    """(logp, entropy, row_max, row_logsum) of the admitted native selected_logp forward, for [rows, V]
    logits (rlk_triton.logp calls it for backend="cuda_native" after checking the admission, with the
    _slp_config layout it checked)."""
    return _slp_forward(load("selected_logp"), logits, target, row_index, temperature, temperature_rows,
                        ignore_index, with_entropy, layout)


def selected_logp_bwd(grad_logp, grad_entropy, logits, target, row_index, temperature: float, temperature_rows,
                      ignore_index: int, row_max, row_logsum, entropy):
    """d logits of the admitted native selected_logp backward (the Triton launcher's arguments)."""
    return _slp_backward(load("selected_logp"), grad_logp, grad_entropy, logits, target, row_index, temperature,
                         temperature_rows, ignore_index, row_max, row_logsum, entropy)


# ---- the gate ----

def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and bits (a NaN equals the same NaN; +0 differs from -0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def gate(op: str, native: Callable, triton: Callable, cases: list) -> dict:
    """Run every case with both implementations; the report lists each mismatching output."""
    mismatches = []
    for label, inputs in cases:
        want, got = triton(*inputs), native(*inputs)
        for i, (a, b) in enumerate(zip(want, got)):
            if not same_bits(a, b):
                same_shape = a.shape == b.shape
                bad = (a.float() != b.float()).sum().item() if same_shape else None
                worst = (a.float() - b.float()).abs().max().item() if same_shape and a.numel() else None
                mismatches.append({"case": label, "output": i, "elements_differing": bad, "max_abs_diff": worst})
        if len(want) != len(got):
            mismatches.append({"case": label, "output": "count", "elements_differing": None})
    return {"op": op, "cases": len(cases), "mismatches": mismatches, "admitted": not mismatches}


def admit(op: str, device="cuda") -> dict:
    """Build, run the gate on `device`, write the record on success (and remove a stale one on failure)."""
    nop = native_op(op)
    ext = load(op)
    report = gate(op, lambda *a: nop.native(ext, *a), nop.triton, nop.cases(device))
    report["fingerprint"] = fingerprint(op, device)
    usable.cache_clear()
    if report["admitted"]:
        report["record"] = str(_write_record(op, {
            "format": RECORD_FORMAT, "op": op, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "cases": report["cases"], "fingerprint": report["fingerprint"]}))
    elif record_path(op).exists():
        record_path(op).unlink()  # a failed gate voids an earlier admission of other bits
    return report
