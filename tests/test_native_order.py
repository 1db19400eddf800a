"""native/rmsnorm_kernels.cu computes in the documented order, checked without a GPU: nvcc's sm_90a PTX
of the file runs in scripts/ptx_emulator.py and every rstd and y bit is compared with a NumPy float32
model of the order docs/native.md states (Triton 3.6's, as its PTX and the H200 gate showed). A change
to the file's arithmetic order fails here, in CI, before the GPU gate would refuse it."""
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlk_triton import native

ROOT = Path(__file__).resolve().parents[1]
F = np.float32
TYPE = {torch.bfloat16: "13__nv_bfloat16", torch.float16: "6__half", torch.float32: "f"}


@pytest.fixture(scope="module")
def ptx():
    try:
        return native.compile_ptx("rmsnorm_kernels.cu")
    except native.NativeUnavailable as ex:
        pytest.skip(str(ex))


def _emulator():
    sys.path.insert(0, str(ROOT / "scripts"))
    import ptx_emulator

    return ptx_emulator



def _f2u(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def model(x, w, eps, offset, block, warps, vec, residual=None):
    """(y, rstd) in the order of docs/native.md: thread t holds lanes (r // vec) * vec * T + t * vec +
    r % vec; per thread fma(h0, h0, h1 * h1) then fma(hr, hr, acc) (one lane: fma(h0, h0, shfl16(h0^2)));
    butterflies 16 .. 1 in the warp, then over the warps' lane-0 sums; IEEE div / sqrt; y = (rstd h) w'.
    With a residual, x is first replaced by h = dtype(fp32(x) + fp32(residual))."""
    fma32 = _emulator().fma32
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
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


def emulate(module, x, w, eps, offset, residual=None):
    """(y, residual_out, rstd, layout) of the native kernel the launcher would pick on the H200 (sm90
    table), emulated; residual_out is None without a residual."""
    emu = _emulator()
    N, H = x.shape
    esz = x.element_size()
    block, warps, vec, rows = native._rmsnorm_config(x, arch="sm90", residual=residual)
    E = block // (32 * warps)
    mem = np.zeros(8192 + 2 * (x.stride(0) + (residual.stride(0) if residual is not None else 0)) * N * esz
                   + 2 * H * esz + 2 * N * H * esz + N * 4 + 4096, np.uint8)
    top = [256]

    def put(nbytes, data=None):  # a 256-byte aligned region
        at = top[0]
        top[0] = at + ((nbytes + 255) // 256) * 256
        if data is not None:
            mem[at:at + nbytes] = data
        return at

    def rows_of(t):  # [N, H] with its row stride, as the kernel reads it
        flat = torch.zeros(N * t.stride(0), dtype=t.dtype)
        flat.view(N, t.stride(0))[:, :H] = t
        return put(N * t.stride(0) * esz, flat.view(torch.uint8).numpy())

    xa = rows_of(x)
    ra = rows_of(residual) if residual is not None else 0
    wa = put(H * esz, w.contiguous().view(torch.uint8).numpy())
    ya = put(N * H * esz)
    oa = put(N * H * esz) if residual is not None else 0
    sa = put(N * 4)
    wide = min(16 // esz, E)
    full = H == block and vec == wide and x.stride(0) % vec == 0 and (residual is None or residual.stride(0) % vec == 0)
    res = int(residual is not None)
    entry = _emulator().entry(module, f"rms_norm_fwd_kernelI{TYPE[x.dtype]}Li{E}ELi{vec}ELi{warps}ELi{rows}ELb{int(full)}ELb{res}EE")
    r_stride = residual.stride(0) if residual is not None else 0
    for b in range(-(-N // rows)):
        emu.run_cta(entry, 32 * warps, [xa, x.stride(0), ra, r_stride, wa, ya, oa, sa, N, H, _f2u(float(H)),
                                        _f2u(eps), _f2u(offset)], mem, b)
    ints = {2: torch.int16, 4: torch.int32}[esz]

    def read(at):
        return torch.from_numpy(mem[at:at + N * H * esz].copy()).view(ints).view(x.dtype).view(N, H)

    return read(ya), read(oa) if residual is not None else None, mem[sa:sa + N * 4].view(np.float32).copy(), \
        (block, warps, vec, full)


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


def _rows(dtype, H, stride, seed):
    g = torch.Generator().manual_seed(seed)
    N = 12  # enough rows that a one-ulp change of order shows in some rstd
    x = (torch.randn(N, stride, generator=g) * 3).to(dtype)[:, :H]
    x[1] = x[1] * 1e-3  # a row of small values: other sums, other roundings
    return x, (torch.randn(H, generator=g) * 0.5 + 1).to(dtype)


def _same(a, b):
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.view(ints), b.view(ints))


@pytest.mark.parametrize("dtype,H,stride", CASES)
def test_native_rmsnorm_ptx_computes_in_the_documented_order(ptx, dtype, H, stride):
    x, w = _rows(dtype, H, stride, H)
    y, _, rstd, (block, warps, vec, _) = emulate(ptx, x, w, 1e-5, 1.0)
    y_model, rstd_model = model(x, w, 1e-5, 1.0, block, warps, vec)
    assert (rstd.view(np.uint32) == rstd_model.view(np.uint32)).all(), (rstd, rstd_model)
    assert _same(y, y_model)


# (dtype, H, x's row stride, the residual's row stride): the one-row and two-rows kernels, FULL and not,
# the two-rows kernel's VEC 1 (H and both strides not multiples of 16)
RESIDUAL_CASES = [
    (torch.bfloat16, 128, 128, 128), (torch.float16, 1000, 1000, 1000), (torch.float32, 1024, 1024, 1040),
    (torch.bfloat16, 4096, 4096, 4096), (torch.float16, 4096, 4096, 4100),
    (torch.bfloat16, 4099, 4099, 4115), (torch.float16, 4096, 4160, 4176), (torch.float32, 4099, 4112, 4099),
    (torch.float32, 8192, 8192, 8192),
]


@pytest.mark.parametrize("dtype,H,stride,res_stride", RESIDUAL_CASES)
def test_native_rmsnorm_residual_ptx_computes_in_the_documented_order(ptx, dtype, H, stride, res_stride):
    x, w = _rows(dtype, H, stride, H + 1)
    g = torch.Generator().manual_seed(H + 2)
    r = (torch.randn(x.shape[0], res_stride, generator=g) * 8).to(dtype)[:, :H]
    y, res_out, rstd, (block, warps, vec, _) = emulate(ptx, x, w, 1e-6, 1.0, residual=r)
    assert _same(res_out, (x.float() + r.float()).to(dtype))
    y_model, rstd_model = model(x, w, 1e-6, 1.0, block, warps, vec, residual=r)
    assert (rstd.view(np.uint32) == rstd_model.view(np.uint32)).all(), (rstd, rstd_model)
    assert _same(y, y_model)


def test_fused_rows_with_a_16_multiple_stride_and_h_not_have_no_native_layout():
    """The two-rows kernel with the residual, H not a multiple of 16 and a row stride that is one:
    Triton 3.6 reduces each row twice in two layouts and scales y with the other one's rstd (y an ulp
    off the native kernel's in the emulator), so there is no native rule and the call is refused."""
    x = torch.empty(2, 4099, dtype=torch.bfloat16)
    r = torch.empty(2, 4112, dtype=torch.bfloat16)[:, :4099]
    for a, b in ((x, r), (r, x), (r, r)):
        assert native._rmsnorm_config(a, arch="sm90", residual=b)[2] is None
    assert native._rmsnorm_config(x, arch="sm90", residual=x)[2] == 1
    assert native._rmsnorm_config(r, arch="sm90")[2] == 8  # without the residual: one reduction, VEC 8
    assert native._rmsnorm_config(torch.empty(2, 4096, dtype=torch.bfloat16)[:, :4000], arch="sm90",
                                  residual=r[:, :4000])[2] == 8  # H a multiple of 16: the full vector
