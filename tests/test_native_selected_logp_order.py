"""native/selected_logp_kernels.cu computes in the documented order, checked without a GPU: nvcc's sm_90a
PTX of the file runs in scripts/ptx_emulator.py and every logp, entropy, row max and row log-sum bit is
compared with a NumPy float32 model of the order docs/native.md states (Triton 3.6's, as its PTX and
SASS show; scripts/native_ptx_compare.py checks the file against that PTX where Triton 3.6 is
installed). A change to the file's arithmetic order fails here, in CI. The approximate instructions
(ex2.approx, rcp.approx) are the emulator's models on both sides: this checks the order, the GPU gate
the hardware's bits."""
import math
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlk_triton import native

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import ptx_emulator as emu  # noqa: E402

NATIVE_SOURCE = "selected_logp_kernels.cu"  # the native/ file whose PTX the `ptx` fixture (conftest.py) compiles
F = np.float32
LOG2E, LN2 = F(1.4426950408889634), F(0.6931471805599453)


# ---- the model ----

def _ex2(x):
    with np.errstate(all="ignore"):
        return emu.flush(np.exp2(emu.flush(F(x)).astype(np.float64)).astype(F))


def _fma(a, b, c):
    return emu.fma32(np.asarray(a, F), np.asarray(b, F), np.asarray(c, F))


def _fma_ftz(a, b, c):
    return emu.flush(emu.fma32(emu.flush(np.asarray(a, F)), emu.flush(np.asarray(b, F)), emu.flush(np.asarray(c, F))))


def _log2(a):
    """libdevice's log2f with flush to zero, step for step (native/selected_logp_kernels.cu log2_ftz)."""
    a = F(a)
    tiny = a < F(1.17549435e-38)
    x = F(a * F(8388608.0)) if tiny else a
    xi = int(np.array(x, F).view(np.int32))
    k = ((xi - 0x3F3504F3) & 0xFF800000)
    k = k - (1 << 32) if k >= 1 << 31 else k
    ek = _fma_ftz(F(k), F(1.1920928955078125e-7), F(-23.0) if tiny else F(0))
    f = F(np.array(xi - k, np.int64).astype(np.int32).view(F) + F(-1.0))
    c = [np.array(v, np.uint32).view(F) for v in (0x3DC6B27F, 0xBE2C7F30, 0x3E2FCF2A, 0xBE374E43, 0x3E520BF4,
                                                  0xBE763C8B, 0x3E93BF99, 0xBEB8AA49, 0x3EF6384A, 0xBF38AA3B)]
    p = _fma_ftz(c[0], f, c[1])
    for coef in c[2:]:
        p = _fma_ftz(p, f, coef)
    r = F(ek + _fma_ftz(f, np.array(0x3FB8AA3B, np.uint32).view(F), F(f * F(f * p))))
    if not (xi & 0xFFFFFFFF) < 0x7F800000:
        r = _fma_ftz(x, F(np.inf), F(np.inf))
    return F(-np.inf) if x == 0 else F(r)


def _div_parts(a, b):
    """div.full's expansion: (a', rcp(b')) with both scaled for |b| out of [2^-126, 2^126]."""
    a, b = F(a), F(b)
    if abs(b) > F(2.0 ** 126):
        a, b = F(a * F(0.25)), F(b * F(0.25))
    if abs(b) < F(2.0 ** -126):
        a, b = F(a * F(2.0 ** 24)), F(b * F(2.0 ** 24))
    with np.errstate(all="ignore"):
        return a, emu.flush((np.float64(1) / np.float64(emu.flush(b))).astype(F))


def _butterfly(v, op, start):
    """Lane values combined at distances start, start / 2, .., 1 (every lane ends with a result)."""
    lanes = np.arange(v.size)
    d = start
    while d >= 1:
        v = op(v, v[lanes ^ d]).astype(F)
        d //= 2
    return v


def model_row(x, V, inv_t, target, block_v, chunk_v, vec, entropy):
    """(logp, entropy, row max, log-sum) of one row x (raw fp32 logits) in the documented order."""
    E = block_v // 32
    idx = np.array([[(r // vec) * vec * 32 + t * vec + r % vec for r in range(E)] for t in range(32)])
    n_chunks = max(-(-V // chunk_v), 1)
    states = []
    for c in range(n_chunks):
        m, s, t = F(-np.inf), F(0), F(0)
        start, width = c * chunk_v, min(V - c * chunk_v, chunk_v)
        for tile in range(-(-width // block_v)):
            lane = start + tile * block_v + idx  # [threads, registers]
            xr = np.where(lane < V, x[np.minimum(lane, V - 1)], F(-np.inf)).astype(F)
            xs = (inv_t * xr).astype(F)
            mx = xs[:, 0]
            for r in range(1, E):
                mx = np.fmax(mx, xs[:, r])
            m_new = np.fmax(m, _butterfly(mx, np.fmax, 16)[0])
            shift = F(0) if m_new == -np.inf else m_new
            d = _fma(inv_t, xr, -shift)
            e = _ex2((d * LOG2E).astype(F))
            m_minus = F(m - shift)
            alpha = _ex2(F(m_minus * LOG2E))
            if entropy:
                moved = F(s * m_minus) if s > 0 else F(0)
                with np.errstate(invalid="ignore"):
                    terms = np.where(e > 0, (d * e).astype(F), F(0)).astype(F)
                u = F(terms[:, 0] + terms[:, 1])
                for r in range(2, E):
                    u = (u + terms[:, r]).astype(F)
                t = _fma(F(t + moved), alpha, _butterfly(u, np.add, 16)[0])
            se = (e[:, 0] + e[:, 1]).astype(F)
            for r in range(2, E):
                se = (se + e[:, r]).astype(F)
            s = _fma(s, alpha, _butterfly(se, np.add, 16)[0])
            m = m_new
        states.append((F(m), F(s), F(t)))
    if n_chunks == 1:
        m, s, t = states[0]
    elif n_chunks > 32:  # two warps: each warp's lane-0 partial, then p0 + p1 (max for m)
        pad = [(F(-np.inf), F(0), F(0))] * (64 - n_chunks)
        m_c, s_c, t_c = (np.array(v, F).reshape(2, 32) for v in zip(*(states + pad)))
        m = np.fmax(*(_butterfly(m_c[h], np.fmax, 16)[0] for h in (0, 1)))
        shift = F(0) if m == -np.inf else m
        d_c = (m_c - shift).astype(F)
        beta = _ex2((d_c * LOG2E).astype(F))
        lanes = np.arange(32)

        def halves_sum(a, b):
            parts = [_butterfly(_fma(a[h], b[h], (a[h] * b[h]).astype(F)[lanes ^ 16]), np.add, 8)[0] for h in (0, 1)]
            return F(parts[0] + parts[1])

        s = halves_sum(beta, s_c)
        w = (np.where(s_c > 0, (d_c * s_c).astype(F), F(0)) + t_c).astype(F)
        t = halves_sum(w, beta) if entropy else F(0)
    else:  # the merge: lane % C = chunk, the first butterfly step contracted; the sums of the lane whose
        # shared write is kept (ptx_emulator.shared_write_order): the upper half's with 16 or 32 lanes a
        # row (the last 8-lane phase of Triton's 16-byte stores), else the row's lowest lane's
        C = 1 << (n_chunks - 1).bit_length()
        pad = [(F(-np.inf), F(0), F(0))] * (C - n_chunks)
        m_c, s_c, t_c = (np.array(v, F) for v in zip(*(states + pad)))
        m = _butterfly(m_c, np.fmax, C // 2)[-1]
        shift = F(0) if m == -np.inf else m
        d_c = (m_c - shift).astype(F)
        beta = _ex2((d_c * LOG2E).astype(F))
        lanes = np.arange(C)

        def lane_sum(a, b):
            v = _fma(a, b, (a * b).astype(F)[lanes ^ (C // 2)])
            kept = C - 1 if C > 8 else 0
            return _butterfly(v, np.add, C // 4)[kept] if C > 2 else v[kept]

        s = lane_sum(beta, s_c)
        w = (np.where(s_c > 0, (d_c * s_c).astype(F), F(0)) + t_c).astype(F)
        t = lane_sum(w, beta) if entropy else F(0)
    log_s = F(_log2(s) * LN2)
    in_range = 0 <= target < V
    logp = F(_fma(x[target if in_range else 0], inv_t, -m) - log_s)
    logp = logp if in_range else F(np.nan)
    logp = F(0) if target == -100 else logp
    num, rcp = _div_parts(t, s)
    return logp, _fma(rcp, -num, log_s), F(m), log_s


# ---- the emulated native kernels ----

def emulate(module, logits, target, inv_t_source, entropy):
    """(logp, entropy, row_max, row_logsum) of the native kernels on [n, V] logits, emulated."""
    n, V = logits.shape
    block_v, chunk_v, vec = native._slp_config(logits, arch="sm90")
    n_chunks = max(-(-V // chunk_v), 1)
    mem = emu.Memory(logits.numel() * 4 + n * 64 + 12 * n * n_chunks + (1 << 16))
    la, ta = mem.put(logits), mem.put(target)
    outs = [mem.put(torch.zeros(n)) for _ in range(4)]
    st = mem.put(torch.zeros(3 * n * n_chunks))
    args = struct.pack("<QqqqQQQf4xQQQQQqqiiqii", la, logits.stride(0), 0, 1, ta, 0, 0, inv_t_source, outs[0],
                       outs[1] if entropy else 0, outs[2], outs[3], st, V, -100, n, n_chunks, n, 0, 0)
    tail = f"Lb{int(entropy)}ELb0ELb0E"
    chunk = emu.entry(module, f"slp_chunk_kernelI{emu.CUDA_TYPE[logits.dtype]}Li{block_v}ELi{vec}E{tail}Lb{int(n_chunks == 1)}EE")
    for r in range(n):
        for c in range(n_chunks):
            emu.run_cta(chunk, 32, [args, chunk_v], mem.buf, (r, c))
    if n_chunks > 1:
        merge = emu.entry(module, f"slp_merge64_kernelI{emu.CUDA_TYPE[logits.dtype]}Li32E{tail}EE" if n_chunks > 32 else
                       f"slp_merge_kernelI{emu.CUDA_TYPE[logits.dtype]}Li{1 << (n_chunks - 1).bit_length()}ELi32E{tail}EE")
        for b in range(-(-n // 32)):
            emu.run_cta(merge, 128, [args], mem.buf, b)
    return [mem.get(a, n, torch.float32).numpy() for a in outs], (block_v, chunk_v, vec)


# (dtype, V, rows, entropy): one chunk with VEC 8 and with VEC 1 (odd V: the row stride), 2, 4, 16, 19 and
# 38 chunks (merges of 2, 4, 16 and 32 lanes, and of two warps)
CASES = [
    (torch.bfloat16, 1000, 3, True), (torch.float32, 1001, 3, True), (torch.float16, 16000, 3, True),
    (torch.bfloat16, 32000, 3, False), (torch.float32, 65536, 3, True), (torch.bfloat16, 151936, 2, True),
    (torch.float32, 151936, 2, True),
]


@pytest.mark.parametrize("dtype,V,n,entropy", CASES)
def test_native_selected_logp_ptx_computes_in_the_documented_order(ptx, dtype, V, n, entropy):
    g = torch.Generator().manual_seed(V)
    logits = (torch.randn(n, V, generator=g) * 4).to(dtype)
    target = torch.randint(0, V, (n,), generator=g)
    target[0] = -100 if n > 2 else target[0]
    temperature = 0.7
    (logp, ent, row_max, log_s), (block_v, chunk_v, vec) = emulate(ptx, logits, target, temperature, entropy)
    x = logits.float().numpy().astype(F)
    inv_t = F(_div_parts(F(1), F(temperature))[0] * _div_parts(F(1), F(temperature))[1])  # div.full(1, T)
    for r in range(n):
        want = model_row(x[r], V, inv_t, int(target[r]), block_v, chunk_v, vec, entropy)
        got = (logp[r], ent[r] if entropy else want[1], row_max[r], log_s[r])
        assert [np.array(v, F).view(np.uint32) for v in got] == [np.array(v, F).view(np.uint32) for v in want], \
            (r, got, want)


def test_the_model_is_not_order_blind():
    """Another layout (VEC 1 instead of 8) gives other bits on some row: the comparison above can fail."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(6, 4000, generator=g) * 4).to(torch.bfloat16).float().numpy().astype(F)
    a = [model_row(row, 4000, F(1), 3, 2048, 16384, 8, True) for row in x]
    b = [model_row(row, 4000, F(1), 3, 2048, 16384, 1, True) for row in x]
    assert any(np.array(u, F).view(np.uint32).tolist() != np.array(v, F).view(np.uint32).tolist()
               for u, v in zip(a, b))
    assert math.isfinite(a[0][0])


# ---- the backward: elementwise ----

def model_grad(x, inv_t, target, row_max, row_logsum, g, h, ent, V):
    """d logits of one row in the documented order (native/selected_logp_kernels.cu, backward)."""
    log_p = (_fma(inv_t, x, -row_max) - row_logsum).astype(F)
    p = _ex2((log_p * LOG2E).astype(F))
    g = F(0) if target == -100 else F(g)
    onehot = np.where(np.arange(V) == target, g, F(0)).astype(F)
    dx = _fma(-p, g, onehot)
    if h is not None:
        q = np.where(p > 0, (p * (log_p + F(ent)).astype(F)).astype(F), F(0)).astype(F)
        dx = _fma(-q, F(h), dx)
    return (inv_t * dx).astype(F)


@pytest.mark.parametrize("dtype,V,entropy", [(torch.bfloat16, 4096, True), (torch.float32, 1001, True),
                                             (torch.float16, 2048, False)])
def test_native_selected_logp_backward_ptx_computes_in_the_documented_order(ptx, dtype, V, entropy):
    n = 3
    g = torch.Generator().manual_seed(V + 1)
    logits = (torch.randn(n, V, generator=g) * 4).to(dtype)
    target = torch.tensor([5, -100, V - 1])
    row_max, row_logsum = torch.rand(n, generator=g) * 10, torch.rand(n, generator=g) * 3
    ent, g_logp, g_ent = torch.rand(n, generator=g), torch.randn(n, generator=g), torch.randn(n, generator=g)
    vec = native._slp_bwd_vec(logits)
    mem = emu.Memory(3 * logits.numel() * 4 + (1 << 16))
    la, ta, ma, sa, ea, gla, gea = (mem.put(t) for t in (logits, target, row_max, row_logsum, ent, g_logp, g_ent))
    oa = mem.put(torch.zeros(n * V, dtype=dtype))
    args = struct.pack("<QqQQQf4xQQQQQQqqqii", la, V, ta, 0, 0, 0.7, ma, sa, ea if entropy else 0, gla,
                       gea if entropy else 0, oa, V, -100, n, 0, 0)
    unroll, threads, blocks = native.slp_bwd_launch(V, vec)
    code = emu.entry(ptx, f"slp_bwd_kernelI{emu.CUDA_TYPE[dtype]}Li{vec}ELi{unroll}ELb{int(entropy)}ELb0ELb0EE")
    for r in range(n):
        for b in range(blocks):
            emu.run_cta(code, threads, [args], mem.buf, (r, b))
    got = mem.get(oa, n * V, dtype).view(n, V)
    num, rcp = _div_parts(F(1), F(0.7))
    inv_t = F(num * rcp)
    x = logits.float().numpy().astype(F)
    for r in range(n):
        want = model_grad(x[r], inv_t, int(target[r]), F(row_max[r]), F(row_logsum[r]), g_logp[r].item(),
                          g_ent[r].item() if entropy else None, ent[r].item(), V)
        assert native.same_bits(got[r], torch.from_numpy(want).to(dtype)), r


_SAME_ADDRESS_STORES = """
.visible .entry k(
	.param .u64 k_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<3>;
	.shared .align 16 .b8 buf[32];
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, buf;
	st.shared.v4.b32 	[%r2], {%r1, %r1, %r1, %r1};
	st.shared.v2.b32 	[%r2+16], {%r1, %r1};
	st.shared.b32 	[%r2+24], %r1;
	bar.sync 	0;
	ld.shared.b32 	%r3, [%r2];
	ld.shared.b32 	%r4, [%r2+16];
	ld.shared.b32 	%r5, [%r2+24];
	ld.param.u64 	%rd1, [k_param_0];
	setp.eq.s32 	%p1, %r1, 0;
	@%p1 st.global.b32 	[%rd1], %r3;
	@%p1 st.global.b32 	[%rd1+4], %r4;
	@%p1 st.global.b32 	[%rd1+8], %r5;
	ret;
}
"""


def test_same_address_shared_writes_keep_the_modelled_lane():
    """The emulator's model of one warp's stores to one shared address (ptx_emulator.shared_write_order),
    on which the merge's check above rests: a 16-byte store keeps the lowest lane of the last 8-lane
    phase (24), an 8-byte store that of the last 16-lane phase (16), a 4-byte store lane 0. The H200
    gate showed a 16-byte store keeping an upper-half lane and a 4-byte store a lower-half one; which
    lane within is the model's (docs/native.md)."""
    mem = np.zeros(4096, np.uint8)
    emu.run_cta(_SAME_ADDRESS_STORES, 32, [256], mem, 0)
    assert mem[256:268].view(np.uint32).tolist() == [24, 16, 0]
