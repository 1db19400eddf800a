"""native/rmsnorm_kernels.cu computes in the documented order, checked without a GPU: nvcc's sm_90a PTX
of the file runs in scripts/ptx_emulator.py and every output bit (forward: y, residual_out, rstd;
backward: dx, d residual, the dW partial rows, dW) is compared with a NumPy float32 model of the order
docs/native.md states (Triton 3.6's, as its PTX and the H200 gate showed). A change to the file's
arithmetic order fails here, in CI, before the GPU gate would refuse it."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlk_triton import native

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import ptx_emulator as emu  # noqa: E402

NATIVE_SOURCE = "rmsnorm_kernels.cu"  # the native/ file whose PTX the `ptx` fixture (conftest.py) compiles
F = np.float32


def model(x, w, eps, offset, block, warps, vec, residual=None):
    """(y, rstd) in the order of docs/native.md: thread t holds lanes (r // vec) * vec * T + t * vec +
    r % vec; per thread fma(h0, h0, h1 * h1) then fma(hr, hr, acc) (one lane: fma(h0, h0, shfl16(h0^2)));
    butterflies 16 .. 1 in the warp, then over the warps' lane-0 sums; IEEE div / sqrt; y = (rstd h) w'.
    With a residual, x is first replaced by h = dtype(fp32(x) + fp32(residual))."""
    fma32 = emu.fma32
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
    N, H = x.shape
    esz = x.element_size()
    block, warps, vec, rows = native._rmsnorm_config(x, arch="sm90", residual=residual)
    E = block // (32 * warps)
    mem = emu.Memory(8192 + 2 * (x.stride(0) + (residual.stride(0) if residual is not None else 0)) * N * esz
                     + 2 * H * esz + 2 * N * H * esz + N * 4 + 8192)

    def rows_of(t):  # [N, H] with its row stride, as the kernel reads it
        flat = torch.zeros(N, t.stride(0), dtype=t.dtype)
        flat[:, :H] = t
        return mem.put(flat)

    xa = rows_of(x)
    ra = rows_of(residual) if residual is not None else 0
    wa = mem.put(w)
    ya = mem.alloc(N * H * esz)
    oa = mem.alloc(N * H * esz) if residual is not None else 0
    sa = mem.alloc(N * 4)
    wide = min(16 // esz, E)
    full = H == block and vec == wide and x.stride(0) % vec == 0 and (residual is None or residual.stride(0) % vec == 0)
    res = int(residual is not None)
    entry = emu.entry(module, f"rms_norm_fwd_kernelI{emu.CUDA_TYPE[x.dtype]}Li{E}ELi{vec}ELi{warps}ELi{rows}ELb{int(full)}ELb{res}EE")
    r_stride = residual.stride(0) if residual is not None else 0
    for b in range(-(-N // rows)):
        emu.run_cta(entry, 32 * warps, [xa, x.stride(0), ra, r_stride, wa, ya, oa, sa, N, H, emu.f32_bits(float(H)),
                                        emu.f32_bits(eps), emu.f32_bits(offset)], mem.buf, b)

    def read(at):
        return mem.get(at, N * H, x.dtype).view(N, H)

    return read(ya), read(oa) if residual is not None else None, mem.get(sa, N, torch.float32).numpy(), \
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


# ---- the backward (docs/native.md): the row kernel's dx and dW partial rows, then the dW reduction ----

def model_backward(h, g, gr, w, rstd, offset, block, warps, vec, R):
    """(dx, partial rows, dw) in the documented order: w' = offset + w, gw = w' g, xhat = rstd h,
    p = fma(gw, xhat, +0); per thread p0 + p1 then p_r + acc in register order (the forward's lane
    layout with the full vec); butterflies 16 .. 1, then over the warps' lane-0 sums; c = sum / H;
    dh = fma(-xhat, c, gw) * rstd, or fma(that, rstd, gr); a block of R rows folds dw = fma(xhat, g, dw)
    per lane; the reduction sums the partial rows in its lane layout (CV columns per thread: 4 when H
    is a multiple of 16, else 1), chains a thread's slots, butterflies over a warp's rows, then
    (w0 + w2) + (w1 + w3) over the warps."""
    fma32 = emu.fma32
    N, H = h.shape
    T = 32 * warps
    E = block // T
    pad = np.zeros((N, block), F)
    hp, gp = pad.copy(), pad.copy()
    hp[:, :H], gp[:, :H] = h.float().numpy(), g.float().numpy()
    wk = np.full(block, F(offset), F)
    wk[:H] = F(offset) + w.float().numpy().astype(F)
    r = rstd.astype(F)[:, None]
    xhat, gw = r * hp, wk[None, :] * gp
    p = fma32(gw, xhat, np.zeros_like(gw)).astype(F)
    idx = np.array([[(k // vec) * vec * T + t * vec + k % vec for k in range(E)] for t in range(T)])
    e = p[:, idx]
    s = e[:, :, 0]
    if E > 1:
        s = s + e[:, :, 1]
        for k in range(2, E):
            s = e[:, :, k] + s
    lanes = np.arange(T)
    for d in (16, 8, 4, 2, 1):
        s = s + s[:, lanes ^ d]
    ws = s[:, ::32]
    d = warps // 2
    while d >= 1:
        ws = ws + ws[:, np.arange(warps) ^ d]
        d //= 2
    c = (ws[:, 0] / F(H))[:, None]
    dh = fma32(-xhat, c, gw).astype(F)
    if gr is not None:
        grp = pad.copy()
        grp[:, :H] = gr.float().numpy()
        dh = fma32(dh, np.broadcast_to(r, dh.shape), grp).astype(F)
    else:
        dh = dh * r
    n_blocks = -(-N // R)
    partial = np.zeros((n_blocks, H), F)
    for b in range(n_blocks):
        acc = np.zeros(H, F)
        for row in range(b * R, min(b * R + R, N)):
            acc = fma32(xhat[row, :H], gp[row, :H], acc).astype(F)
        partial[b] = acc
    CV = 4 if H % 16 == 0 else 1
    TC = 16 // CV
    TR = 32 // TC
    RT, S = 4 * TR, 128 // (4 * TR)
    groups = -(-n_blocks // 128)
    padded = np.zeros((groups * 128, H), F)
    padded[:n_blocks] = partial
    acc = np.zeros((S, RT, H), F)  # [slot, the thread's row offset, column]
    for grp in range(groups):
        for slot in range(S):
            acc[slot] = acc[slot] + padded[grp * 128 + slot * RT + np.arange(RT)]
    v = acc[0] + acc[1]
    for slot in range(2, S):
        v = acc[slot] + v
    v = v.reshape(4, TR, H)  # [warp, row in the warp, column]
    dd = 16
    while dd >= TC:
        v = v + v[:, np.arange(TR) ^ (dd // TC)]
        dd //= 2
    dw = (v[0, 0] + v[2, 0]) + (v[1, 0] + v[3, 0])
    return torch.from_numpy(dh[:, :H]).to(h.dtype), partial, torch.from_numpy(dw).to(h.dtype)


def emulate_backward(module, h, g, gr, w, rstd, offset, R, dres=True):
    """(dx, d residual, partial rows, dw, layout) of the native backward kernels on the sm90 layout,
    emulated; R rows per dW partial (the order for any R is the same code; the GPU's is 64)."""
    N, H = h.shape
    esz = h.element_size()
    block, warps, _, vec = native._rmsnorm_bwd_layout("sm90", h.dtype, H)
    E = block // (32 * warps)
    n_blocks = -(-N // R)
    mem = emu.Memory(8192 + (h.stride(0) + 4 * H) * N * esz + 2 * H * esz + N * 4 + n_blocks * H * 4 + 8192)
    flat = torch.zeros(N, h.stride(0), dtype=h.dtype)
    flat[:, :H] = h
    ha, ga = mem.put(flat), mem.put(g)
    gra = mem.put(gr) if gr is not None else 0
    wa, sa = mem.put(w), mem.put(torch.from_numpy(rstd))
    dxa, dra = mem.alloc(N * H * esz), mem.alloc(N * H * esz)
    pa, dwa = mem.alloc(n_blocks * H * 4), mem.alloc(H * esz)
    full = H == block and h.stride(0) % vec == 0
    entry = emu.entry(module, f"rms_norm_bwd_kernelI{emu.CUDA_TYPE[h.dtype]}Li{E}ELi{vec}ELi{warps}ELb{int(full)}"
                              f"ELb{int(gr is not None)}ELb{int(dres)}EE")
    for b in range(n_blocks):
        emu.run_cta(entry, 32 * warps, [ga, gra, ha, h.stride(0), wa, sa, dxa, dra, pa, N, H, emu.f32_bits(float(H)),
                                        emu.f32_bits(offset), R, 1], mem.buf, b)
    entry = emu.entry(module, f"rms_norm_dw_reduce_kernelI{emu.CUDA_TYPE[h.dtype]}Li{4 if H % 16 == 0 else 1}EE")
    for b in range(-(-H // 16)):
        emu.run_cta(entry, 128, [pa, dwa, n_blocks, H], mem.buf, b)
    return mem.get(dxa, N * H, h.dtype).view(N, H), mem.get(dra, N * H, h.dtype).view(N, H), \
        mem.get(pa, n_blocks * H, torch.float32).view(n_blocks, H).numpy(), mem.get(dwa, H, h.dtype), \
        (block, warps, vec, full)


# (dtype, H, h's row stride, the residual_out's gradient read, the residual's gradient written, rows,
# rows per dW partial): one lane per thread, each vector width, FULL and not, both reduction layouts,
# more than 128 partial rows, each pair of the two residual flags
BACKWARD_CASES = [
    (torch.bfloat16, 128, 128, False, True, 12, 4), (torch.float32, 1000, 1000, True, True, 12, 4),
    (torch.float16, 2048, 2048, False, False, 12, 4), (torch.bfloat16, 4096, 4100, True, False, 12, 4),
    (torch.float32, 4099, 4099, False, True, 9, 4), (torch.bfloat16, 16384, 16384, False, False, 6, 4),
    (torch.float32, 128, 128, False, True, 133, 1), (torch.float32, 200, 200, True, True, 133, 1),
]


@pytest.mark.parametrize("dtype,H,stride,with_gr,with_dres,N,R", BACKWARD_CASES)
def test_native_rmsnorm_backward_ptx_computes_in_the_documented_order(ptx, dtype, H, stride, with_gr, with_dres,
                                                                       N, R):
    g = torch.Generator().manual_seed(H + 3)
    h = (torch.randn(N, stride, generator=g) * 3).to(dtype)[:, :H]
    h[1] = h[1] * 1e-3
    gy = torch.randn(N, H, generator=g).to(dtype)
    gr = torch.randn(N, H, generator=g).to(dtype) if with_gr else None
    w = (torch.randn(H, generator=g) * 0.5 + 1).to(dtype)
    rstd = (1 / np.sqrt((h.float() ** 2).mean(1).numpy() + 1e-5)).astype(F)
    dx, dres, partial, dw, (block, warps, vec, _) = emulate_backward(ptx, h, gy, gr, w, rstd, 0.5, R, with_dres)
    dx_model, partial_model, dw_model = model_backward(h, gy, gr, w, rstd, 0.5, block, warps, vec, R)
    # d residual is a second copy of dx, written only when asked for (its buffer starts zeroed)
    assert _same(dx, dx_model) and _same(dres, dx_model if with_dres else torch.zeros_like(dres))
    assert (partial.view(np.uint32) == partial_model.view(np.uint32)).all()
    assert _same(dw, dw_model)
