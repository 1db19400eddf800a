"""native/rmsnorm_kernels.cu computes in the documented order, checked without a GPU: nvcc's sm_90a PTX
of the file runs in scripts/ptx_emulator.py and every rstd and y bit is compared with a NumPy float32
model of the order docs/native.md states (Triton 3.6's, as its PTX and the H200 gate showed). A change
to the file's arithmetic order fails here, in CI, before the GPU gate would refuse it."""
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlk_triton import native

ROOT = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc") or next((str(p) for p in Path("/usr/local").glob("cuda*/bin/nvcc")), None)
F = np.float32
TYPE = {torch.bfloat16: "13__nv_bfloat16", torch.float16: "6__half", torch.float32: "f"}


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    if NVCC is None:
        pytest.skip("no nvcc on this machine")
    out = tmp_path_factory.mktemp("ptx") / "rmsnorm.ptx"
    flags = [f for f in native.BUILD_FLAGS if not f.startswith("-gencode")]
    subprocess.run([NVCC, *flags, "-arch=sm_90a", "-ptx", str(ROOT / "native" / "rmsnorm_kernels.cu"), "-o", str(out)],
                   check=True, capture_output=True, timeout=600)
    return out.read_text()


def _emulator():
    sys.path.insert(0, str(ROOT / "scripts"))
    import ptx_emulator

    return ptx_emulator


def _entry(module: str, key: str) -> str:
    names = [n for n in re.findall(r"\.entry (\w+)\(", module) if key in n]
    assert len(names) == 1, (key, names)
    i = module.index(".entry " + names[0])
    return ".visible " + module[i:module.index("\n}\n", i) + 3]


def _f2u(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def model(x, w, eps, offset, block, warps, vec):
    """(y, rstd) in the order of docs/native.md: thread t holds lanes (r // vec) * vec * T + t * vec +
    r % vec; per thread fma(h0, h0, h1 * h1) then fma(hr, hr, acc) (one lane: fma(h0, h0, shfl16(h0^2)));
    butterflies 16 .. 1 in the warp, then over the warps' lane-0 sums; IEEE div / sqrt; y = (rstd h) w'."""
    fma32 = _emulator().fma32
    h = x.float().numpy().astype(F)
    R, H = h.shape
    T = 32 * warps
    E = block // T
    hp = np.zeros((R, block), F)
    hp[:, :H] = h
    idx = np.array([[(r // vec) * vec * T + t * vec + r % vec for r in range(E)] for t in range(T)])
    e = hp[:, idx]  # [rows, threads, registers]
    lanes = np.arange(T)
    if E == 1:
        s = fma32(e[:, :, 0], e[:, :, 0], (e[:, :, 0] * e[:, :, 0])[:, lanes ^ 16])
        dists = (8, 4, 2, 1)
    else:
        s = fma32(e[:, :, 0], e[:, :, 0], e[:, :, 1] * e[:, :, 1])
        for r in range(2, E):
            s = fma32(e[:, :, r], e[:, :, r], s)
        dists = (16, 8, 4, 2, 1)
    for d in dists:
        s = s + s[:, lanes ^ d]
    ws = s[:, ::32]  # lane 0 of each warp
    d = warps // 2
    while d >= 1:
        ws = ws + ws[:, np.arange(warps) ^ d]
        d //= 2
    with np.errstate(all="ignore"):
        rstd = F(1) / np.sqrt(ws[:, 0] / F(H) + F(eps))
        y = (rstd[:, None] * h) * (w.float().numpy().astype(F) + F(offset))[None, :]
    return torch.from_numpy(y).to(x.dtype), rstd


def emulate(module, x, w, eps, offset):
    """(y, rstd) of the native kernel the launcher would pick on the H200 (sm90 table), emulated."""
    emu = _emulator()
    N, H = x.shape
    esz, stride = x.element_size(), x.stride(0)
    block, warps, vec, rows = native._rmsnorm_config(x, arch="sm90")
    E = block // (32 * warps)
    mem = np.zeros(8192 + (N * stride + 2 * H + N * H) * esz + N * 4 + 4096, np.uint8)
    xa, wa = 256, 256 + ((N * stride * esz + 255) // 256) * 256
    ya = wa + ((H * esz + 255) // 256) * 256
    ra = ya + ((N * H * esz + 255) // 256) * 256
    flat = torch.zeros(N * stride, dtype=x.dtype)
    flat.view(N, stride)[:, :H] = x
    mem[xa:xa + N * stride * esz] = flat.view(torch.uint8).numpy()
    mem[wa:wa + H * esz] = w.contiguous().view(torch.uint8).numpy()
    full = H == block and stride % vec == 0 and vec == min(16 // esz, E)  # launch_vec's FULL rule
    entry = _entry(module, f"rms_norm_fwd_kernelI{TYPE[x.dtype]}Li{E}ELi{vec}ELi{warps}ELi{rows}ELb{int(full)}EE")
    for b in range(-(-N // rows)):
        emu.run_cta(entry, 32 * warps, [xa, stride, wa, ya, ra, N, H, _f2u(float(H)), _f2u(eps), _f2u(offset)],
                    mem, b)
    ints = {2: torch.int16, 4: torch.int32}[esz]
    y = torch.from_numpy(mem[ya:ya + N * H * esz].copy()).view(ints).view(x.dtype).view(N, H)
    return y, mem[ra:ra + N * 4].view(np.float32).copy(), (block, warps, vec, full)


CASES = [
    (torch.bfloat16, 128, 128),  # one lane per thread: the product folded into the first shuffle
    (torch.bfloat16, 1000, 1000), (torch.float32, 1000, 1000), (torch.float16, 1024, 1024),
    (torch.bfloat16, 4096, 4160),  # two rows per block, a wider row stride
    (torch.float16, 4099, 4099),  # the two-rows kernel with VEC 1 (H and the stride not multiples of 16)
    (torch.float32, 8192, 8192), (torch.bfloat16, 16384, 16384),
    (torch.bfloat16, 2048, 2052),  # one tile, but row starts not 16-byte aligned: not FULL
]


def test_cases_cover_the_full_and_the_bounds_checked_paths():
    full = set()
    for dtype, H, stride in CASES:
        block, warps, vec, _ = native._rmsnorm_config(torch.empty(2, stride, dtype=dtype)[:, :H], arch="sm90")
        full.add(H == block and stride % vec == 0 and vec == min(16 // (2 if dtype != torch.float32 else 4),
                                                                 block // (32 * warps)))
    assert full == {True, False}


@pytest.mark.parametrize("dtype,H,stride", CASES)
def test_native_rmsnorm_ptx_computes_in_the_documented_order(ptx, dtype, H, stride):
    g = torch.Generator().manual_seed(H)
    N = 12  # enough rows that a one-ulp change of order shows in some rstd
    x = (torch.randn(N, stride, generator=g) * 3).to(dtype)[:, :H]
    x[1] = x[1] * 1e-3  # a row of small values: other sums, other roundings
    w = (torch.randn(H, generator=g) * 0.5 + 1).to(dtype)
    y, rstd, (block, warps, vec, _) = emulate(ptx, x, w, 1e-5, 1.0)
    y_model, rstd_model = model(x, w, 1e-5, 1.0, block, warps, vec)
    assert (rstd.view(np.uint32) == rstd_model.view(np.uint32)).all(), (rstd, rstd_model)
    ints = {2: torch.int16, 4: torch.int32}[x.element_size()]
    assert torch.equal(y.view(ints), y_model.view(ints))


def test_the_model_is_not_order_blind():
    """Another order (no VEC grouping) gives other rstd bits on some row: the comparison above can fail."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(64, 1000, generator=g) * 3).to(torch.bfloat16)
    w = torch.ones(1000, dtype=torch.bfloat16)
    _, a = model(x, w, 1e-6, 0.0, 1024, 4, 8)
    _, b = model(x, w, 1e-6, 0.0, 1024, 4, 1)
    assert (a.view(np.uint32) != b.view(np.uint32)).any()
