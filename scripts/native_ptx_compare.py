"""Run the Triton kernels' sm90 PTX and the native kernels' PTX side by side in scripts/ptx_emulator.py
and compare their outputs bit for bit: the check that a native/ kernel follows the Triton kernel's
order, done before device time is spent on `rlk-triton native admit`.

The Triton PTX is compiled with the GPU machine's Triton (3.6: put its wheel on PYTHONPATH), for each
case's exact argument values, as the JIT specializes them (scripts/aot_compile_check.py), then given
ptxas's contractions (ptx_emulator.contract_like_ptxas), whose count is checked against the FFMA
instructions of the SASS that Triton's own ptxas makes of it; the native PTX is compiled with nvcc and
the build's flags. Each case's native variant is the one the launcher would pick
(rlk_triton.native._rmsnorm_config / _slp_config); a case the native kernel refuses is reported so.
The emulator models the approximate instructions (ex2.approx, rcp.approx) and which lane's write to a
shared address survives (the last): equal here is evidence, the GPU gate is the proof.

    PYTHONPATH=/path/to/triton-3.6 python scripts/native_ptx_compare.py [--op rmsnorm selected_logp] [--out r.json]

Exit code 1 when an output of an accepted case differs.
"""
import argparse
import datetime
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402

import ptx_emulator as emu  # noqa: E402
from aot_compile_check import compile_for_sm90  # noqa: E402
from rlk_triton import configs, native  # noqa: E402
from rlk_triton.ops import rmsnorm  # noqa: E402
from rlk_triton.ops import selected_logp as slp  # noqa: E402
from rlk_triton.ops.launch import next_power_of_2  # noqa: E402

N_ROWS = 16  # rows per case: enough that a one-ulp change of order shows in some rstd




def sass_ffma(ptx: str):
    """FFMA instructions in the SASS that the Triton wheel's ptxas makes of a PTX module (None without
    its cuobjdump)."""
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (bin_dir / "cuobjdump").exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        subprocess.run([str(bin_dir / "ptxas"), "--gpu-name", "sm_90a", str(src), "-o", str(cubin)], check=True,
                       capture_output=True, timeout=900)
        out = subprocess.run([str(bin_dir / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True).stdout
    return len(re.findall(r"\bFFMA\b", out))


def as_ptxas_compiles(ptx: str) -> str:
    """Triton's PTX with ptxas's contractions made explicit (ptx_emulator.contract_like_ptxas), checked:
    the FFMA that ptxas adds to the SASS when it may contract (the PTX as it is) against the same PTX with
    every mul / add / sub made .rn (which it may not contract; IEEE div / sqrt expand to FFMA alike in
    both) must be the contractions the model made."""
    contracted, made = emu.contract_like_ptxas(ptx)
    free = sass_ffma(ptx)
    if free is not None:
        fused = free - sass_ffma(re.sub(r"\b(mul|add|sub)\.f32\b", r"\1.rn.f32", ptx))
        if fused != made:
            raise RuntimeError(f"ptxas contracted {fused} operations, the emulator's model {made}")
    return contracted


def triton_rmsnorm_ptx(dtype, H, x_stride, r_stride, fused, N):
    """(ptx, (block, warps, rows)) of the Triton forward launch for these values (sm90 table)."""
    cfg = configs.lookup("rmsnorm_fwd", "sm90", dtype, H)
    block = rmsnorm.hidden_tile(cfg, H)
    rows = configs.lookup("rmsnorm_fwd_rows", "sm90", dtype, H).block_v
    rows = rows if rows > 1 and block >= H else 1
    x = torch.empty(N * x_stride, dtype=dtype)
    r = torch.empty(N * r_stride, dtype=dtype) if fused else x
    y = torch.empty(N * H, dtype=dtype)
    args = dict(x_ptr=x, x_row_stride=x_stride, res_ptr=r, res_row_stride=r_stride if fused else x_stride,
                w_ptr=torch.empty(H, dtype=dtype), y_ptr=y, res_out_ptr=torch.empty(N * H, dtype=dtype) if fused else y,
                rstd_ptr=torch.empty(N), H=H, h_count=float(H), eps=1e-6, weight_offset=0.0, HAS_RESIDUAL=fused,
                BLOCK_H=block, STORE_RSTD=True)  # the native forward stores rstd: the recording call's kernel
    if rows > 1:
        kernel, args = rmsnorm._fwd_rows_kernel, dict(args, N=N, ROWS=rows)
    else:
        kernel, args = rmsnorm._fwd_kernel, dict(args, ONE_TILE=block >= H)
    _, _, ptx, err = compile_for_sm90(kernel, args, cfg.num_warps, 1)
    if err:
        raise RuntimeError(err)
    return ptx, (block, cfg.num_warps, rows)


def rmsnorm_case(module: str, dtype, H: int, x_stride: int, r_stride, seed: int) -> dict:
    """Both kernels on the same rows; r_stride None: no residual. The outputs' bits compared."""
    fused = r_stride is not None
    N = N_ROWS
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(N, x_stride, generator=g) * 3).to(dtype)
    x[1] *= 1e-3  # small values: other sums, other roundings
    r = (torch.randn(N, r_stride, generator=g) * 8).to(dtype) if fused else None
    w = (torch.randn(H, generator=g) * 0.5 + 1).to(dtype)
    eps, offset = 1e-5, 1.0
    layout = native._rmsnorm_config(x[:, :H], arch="sm90", residual=r[:, :H] if fused else None)
    row = {"dtype": str(dtype)[6:], "H": H, "x_stride": x_stride, "residual_stride": r_stride}
    if layout[2] is None:
        return dict(row, result="refused by the native launcher")
    size = 4 * (N * (x_stride + (r_stride or 0) + 2 * H) + H) * x.element_size() + (1 << 16)

    def run(ptx_entry, params, threads, per_block):
        mem = emu.Memory(size)
        xa, ra = mem.put(x), mem.put(r) if fused else 0
        wa = mem.put(w)
        ya, oa = mem.put(torch.zeros(N * H, dtype=dtype)), mem.put(torch.zeros(N * H, dtype=dtype)) if fused else 0
        sa = mem.put(torch.zeros(N))
        for b in range(-(-N // per_block)):
            emu.run_cta(ptx_entry, threads, params(xa, ra, wa, ya, oa, sa), mem.buf, b)
        return [mem.get(ya, N * H, dtype), mem.get(oa, N * H, dtype) if fused else None, mem.get(sa, N, torch.float32)]

    tptx, (block, warps, rows) = triton_rmsnorm_ptx(dtype, H, x_stride, r_stride or x_stride, fused, N)
    tptx = as_ptxas_compiles(tptx)
    floats = [emu.f32_bits(float(H)), emu.f32_bits(eps), emu.f32_bits(offset)]
    want = run(emu.entry(tptx), lambda xa, ra, wa, ya, oa, sa: [xa, x_stride, ra if fused else xa,
                                                            r_stride if fused else x_stride, wa, ya, oa if fused else ya,
                                                            sa] + ([N] if rows > 1 else []) + [H] + floats + [0, 0],
               32 * warps, rows)
    block_n, warps_n, vec, rows_n = layout
    E = block_n // (32 * warps_n)
    wide = min(16 // x.element_size(), E)
    full = H == block_n and vec == wide and x_stride % vec == 0 and (not fused or r_stride % vec == 0)
    name = f"rms_norm_fwd_kernelI{emu.CUDA_TYPE[dtype]}Li{E}ELi{vec}ELi{warps_n}ELi{rows_n}ELb{int(full)}ELb{int(fused)}EE"
    got = run(emu.entry(module, name), lambda xa, ra, wa, ya, oa, sa: [xa, x_stride, ra, r_stride or 0, wa, ya, oa, sa, N, H]
              + floats, 32 * warps_n, rows_n)
    same = {}
    for label, a, b in zip(("y", "residual_out", "rstd"), want, got):
        if a is not None:
            ints = torch.int32 if a.element_size() == 4 else torch.int16
            same[label] = torch.equal(a.view(ints), b.view(ints))
    return dict(row, vec=vec, rows_per_block=rows_n, full=full, same_bits=same,
                result="equal" if all(same.values()) else "DIFFERENT")


def rmsnorm_cases():
    """The gate's H (rlk_triton.native.RMSNORM_GATE_H), with and without the residual, plus the
    row-stride kinds of the fused add (16-multiples or not, with H a 16-multiple or not)."""
    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for H in native.RMSNORM_GATE_H:
            out += [(dtype, H, H, None), (dtype, H, H, H)]
        out += [(dtype, 4096, 4160, None), (dtype, 4099, 4112, None)]
        out += [(dtype, H, xs, rs) for H, xs, rs in ((4096, 4160, 4176), (4096, 4099, 4115), (4099, 4100, 4116),
                                                     (4099, 4112, 4128), (4099, 4099, 4112), (4099, 4112, 4099))]
    return out


def triton_rmsnorm_bwd_ptx(dtype, H, h_stride, gres, N, R):
    """(bwd ptx, reduce ptx, (block, warps, lanes, cols)) of the Triton backward launches for these values
    (sm90 table, R rows per dW partial)."""
    cfg = configs.lookup("rmsnorm_bwd", "sm90", dtype, H)
    block = rmsnorm.hidden_tile(cfg, H)
    e = torch.empty
    args = dict(grad_y_ptr=e(N * H, dtype=dtype), grad_res_ptr=e(N * H, dtype=dtype), h_ptr=e(N * h_stride, dtype=dtype),
                h_row_stride=h_stride, w_ptr=e(H, dtype=dtype), rstd_ptr=e(N), dx_ptr=e(N * H, dtype=dtype),
                dres_ptr=e(N * H, dtype=dtype), partial_ptr=e(-(-N // R) * H), N=N, H=H, h_count=float(H),
                weight_offset=1.0, HAS_GRAD_RES=gres, WITH_DW=True, WITH_DRES=True, ROWS_PER_BLOCK=R, BLOCK_H=block,
                ONE_TILE=block >= H)
    _, _, bwd, err = compile_for_sm90(rmsnorm._bwd_kernel, args, cfg.num_warps, 1)
    if err:
        raise RuntimeError(err)
    red = configs.lookup("rmsnorm_dw_reduce", "sm90", dtype, H)
    cols = min(next_power_of_2(H), max(16, 2048 // red.block_v))
    n_blocks = -(-N // R)
    args = dict(partial_ptr=e(n_blocks * H), dw_ptr=e(H, dtype=dtype), n_blocks=n_blocks, H=H, BLOCK_B=red.block_v,
                BLOCK_C=cols)
    _, _, reduce, err = compile_for_sm90(rmsnorm._dw_reduce_kernel, args, red.num_warps, red.num_stages)
    if err:
        raise RuntimeError(err)
    return bwd, reduce, (block, cfg.num_warps, 32 * red.num_warps, cols)


def rmsnorm_bwd_case(module: str, dtype, H: int, h_stride: int, gres: bool, seed: int, N=20, R=4) -> dict:
    """Both backward implementations (the row kernel, then the dW reduction) on the same rows, rstd and
    upstream gradients, with R rows per dW partial (the locked 64 on the GPU; the order for any R is the
    same code, and a small R gives several partial rows, more than 128 with N > 128 R). dx, d residual,
    the partial rows and dW compared."""
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(N, h_stride, generator=g) * 3).to(dtype)
    h[1] *= 1e-3
    gy = torch.randn(N, H, generator=g).to(dtype)
    gr = torch.randn(N, H, generator=g).to(dtype) if gres else None
    w = (torch.randn(H, generator=g) * 0.5 + 1).to(dtype)
    rstd = torch.rsqrt(h[:, :H].float().pow(2).mean(1) + 1e-5)
    offset = 1.0
    n_blocks = -(-N // R)
    row = {"dtype": str(dtype)[6:], "H": H, "h_stride": h_stride, "grad_residual": gres, "rows": N,
           "rows_per_partial": R, "kernel": "backward"}
    vec = native._rmsnorm_bwd_layout("sm90", dtype, H)[3]
    size = 4 * (N * (h_stride + 4 * H) + (n_blocks + 2) * H) * 4 + (1 << 16)

    def regions(mem):
        return [mem.put(t) for t in (gy, gr if gres else torch.zeros(1), h, w, rstd, torch.zeros(N * H, dtype=dtype),
                                     torch.zeros(N * H, dtype=dtype), torch.zeros(n_blocks * H),
                                     torch.zeros(H, dtype=dtype))]

    def outputs(mem, dxa, dra, pa, dwa):
        return [mem.get(dxa, N * H, dtype), mem.get(dra, N * H, dtype), mem.get(pa, n_blocks * H, torch.float32),
                mem.get(dwa, H, dtype)]

    bwd, red, (block, warps, lanes, cols) = triton_rmsnorm_bwd_ptx(dtype, H, h_stride, gres, N, R)
    mem = emu.Memory(size)
    ga, gra, ha, wa, sa, dxa, dra, pa, dwa = regions(mem)
    code = emu.entry(as_ptxas_compiles(bwd))
    for b in range(n_blocks):
        emu.run_cta(code, 32 * warps, [ga, gra if gres else ga, ha, h_stride, wa, sa, dxa, dra, pa, N, H,
                                       emu.f32_bits(float(H)), emu.f32_bits(offset), 0, 0], mem.buf, b)
    code = emu.entry(as_ptxas_compiles(red))
    for b in range(-(-H // cols)):
        emu.run_cta(code, lanes, [pa, dwa, n_blocks, H, 0, 0], mem.buf, b)
    want = outputs(mem, dxa, dra, pa, dwa)

    mem = emu.Memory(size)
    ga, gra, ha, wa, sa, dxa, dra, pa, dwa = regions(mem)
    E = block // (32 * warps)
    full = H == block and h_stride % vec == 0
    name = f"rms_norm_bwd_kernelI{emu.CUDA_TYPE[dtype]}Li{E}ELi{vec}ELi{warps}ELb{int(full)}ELb{int(gres)}ELb1EE"
    code = emu.entry(module, name)
    for b in range(n_blocks):
        emu.run_cta(code, 32 * warps, [ga, gra if gres else 0, ha, h_stride, wa, sa, dxa, dra, pa, N, H,
                                       emu.f32_bits(float(H)), emu.f32_bits(offset), R, 1], mem.buf, b)
    code = emu.entry(module, f"rms_norm_dw_reduce_kernelI{emu.CUDA_TYPE[dtype]}Li{4 if H % 16 == 0 else 1}EE")
    for b in range(-(-H // 16)):
        emu.run_cta(code, 128, [pa, dwa, n_blocks, H], mem.buf, b)
    got = outputs(mem, dxa, dra, pa, dwa)
    same = {}
    for label, a, b in zip(("dx", "d_residual", "dw_partial", "dw"), want, got):
        ints = torch.int32 if a.element_size() == 4 else torch.int16
        same[label] = torch.equal(a.view(ints), b.view(ints))
    return dict(row, vec=vec, full=full, same_bits=same, result="equal" if all(same.values()) else "DIFFERENT")


def rmsnorm_bwd_cases():
    """(dtype, H, h row stride, grad of residual_out, rows, rows per partial): the gate's H (every tile
    class the native kernels have), H and row strides that are and are not multiples of 16, the residual's gradient, and
    more than 128 partial rows (the reduction's group loop)."""
    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for H in native.RMSNORM_GATE_H:
            out.append((dtype, H, H, False, 20, 4))
        out += [(dtype, 4096, 4096, True, 20, 4), (dtype, 4096, 4100, False, 20, 4), (dtype, 4099, 4112, True, 20, 4),
                (dtype, 128, 128, False, 133, 1), (dtype, 1000, 1000, True, 133, 1)]
    return out


def triton_slp_ptx(kernel: str, dtype, V: int, n: int, row_stride: int, total_rows: int, flags: dict, inner=1):
    """(ptx, warps) of Triton's selected_logp forward launch ("chunk" or "merge") for these values; inner > 1:
    [B, inner, V] logits (rows inner * row_stride apart between sequences, row_stride within one)."""
    cfg = configs.lookup("selected_logp_fwd", "sm90", dtype, V)
    split = configs.lookup("selected_logp_chunk", "sm90", dtype, V)
    n_chunks = slp.chunk_count(V, split.block_v)

    def f(k):
        return torch.empty(max(k, 1))

    ids = torch.empty(n, dtype=torch.int64)
    args = dict(logits_ptr=torch.empty(total_rows * row_stride, dtype=dtype), stride_outer=row_stride * inner,
                stride_inner=row_stride if inner > 1 else 0, inner_size=inner, target_ptr=ids, row_index_ptr=ids,
                temperature_ptr=f(n),
                temperature=1.0, logp_ptr=f(n), entropy_ptr=f(n), row_max_ptr=f(n), row_logsum_ptr=f(n),
                state_ptr=f(3 * n * n_chunks), V=V, ignore_index=-100, n_rows=n, n_chunks=n_chunks,
                total_rows=total_rows, **flags)
    if kernel == "merge":
        fn, args, warps, stages = slp._fwd_merge_kernel, dict(args, BLOCK_ROWS=slp.MERGE_ROWS,
                                                              CHUNKS=next_power_of_2(n_chunks)), split.num_warps, 1
    else:
        fn, args, warps, stages = slp._fwd_kernel, dict(args, FINISH=n_chunks == 1, BLOCK_V=cfg.block_v,
                                                        CHUNK_V=split.block_v), cfg.num_warps, cfg.num_stages
    _, _, ptx, err = compile_for_sm90(fn, args, warps, stages)
    if err:
        raise RuntimeError(err)
    return ptx, warps


def slp_inputs(dtype, V, n, seed, row_stride, total_rows, row_index, per_row_t):
    """(generator, logits, targets, row indices, per-row temperatures): targets ignored and out of range,
    a row index outside the logits."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(total_rows, row_stride, generator=g) * 4).to(dtype)
    target = torch.randint(0, V, (n,), generator=g)
    if n > 2:
        target[1], target[2] = -100, V + 5
    rows = torch.randint(0, total_rows, (n,), generator=g) if row_index else None
    if row_index and n > 3:
        rows[3] = total_rows + 2
    temps = (torch.rand(n, generator=g) + 0.5) if per_row_t else None
    return g, logits, target, rows, temps


def slp_case(module: str, dtype, V: int, n: int, seed: int, row_stride=None, entropy=True, row_index=False,
             per_row_t=False, temperature=1.0, inner=1) -> dict:
    """Both implementations on the same logits; targets ignored and out of range, a bad row index. inner > 1:
    Triton reads the rows as [n / inner, inner, V] logits (its 3-D addressing), the native kernel as the
    [n, V] view of them (rlk_triton.logp's cuda_native path views [B, T, V] so)."""
    row_stride = row_stride or V
    total_rows = n + 2 if row_index else n
    g, logits, target, rows, temps = slp_inputs(dtype, V, n, seed, row_stride, total_rows, row_index, per_row_t)
    block_v, chunk_v, vec = native._slp_config(logits[:, :V], arch="sm90")
    n_chunks = slp.chunk_count(V, chunk_v)
    row = {"dtype": str(dtype)[6:], "V": V, "rows": n, "row_stride": row_stride, "entropy": entropy,
           "row_index": row_index, "per_row_temperature": per_row_t, "temperature": temperature}
    if inner > 1:
        row["leading"] = [n // inner, inner]
    if n_chunks > 64:
        return dict(row, result="refused by the native launcher")
    flags = dict(HAS_ROW_INDEX=row_index, PER_ROW_TEMPERATURE=per_row_t, WITH_ENTROPY=entropy)
    size = total_rows * row_stride * 4 + n * 64 + 12 * n * n_chunks + (1 << 16)

    def regions(mem):
        return (mem.put(logits), mem.put(target), mem.put(rows if row_index else target),
                mem.put(temps if per_row_t else torch.zeros(1)), [mem.put(torch.zeros(n)) for _ in range(4)],
                mem.put(torch.zeros(3 * n * n_chunks)))

    def outputs(mem, outs):
        return [mem.get(a, n, torch.float32) for a in outs]

    mem = emu.Memory(size)
    la, ta, ra, tra, outs, st = regions(mem)
    params = [la, row_stride * inner] + ([row_stride, inner] if inner > 1 else [0, 1]) + \
        [ta, ra, tra, emu.f32_bits(temperature), *outs, st, V, (-100) & 0xFFFFFFFF, n, n_chunks, total_rows, 0, 0]
    for kernel in ("chunk", "merge") if n_chunks > 1 else ("chunk",):
        ptx, warps = triton_slp_ptx(kernel, dtype, V, n, row_stride, total_rows, flags, inner)
        code = emu.entry(as_ptxas_compiles(ptx))
        for cta in ([(r, c) for r in range(n) for c in range(n_chunks)] if kernel == "chunk"
                    else range(-(-n // slp.MERGE_ROWS))):
            emu.run_cta(code, 32 * warps, params, mem.buf, cta)
    want = outputs(mem, outs)

    mem = emu.Memory(size)
    la, ta, ra, tra, outs, st = regions(mem)
    args = struct.pack("<QqqqQQQf4xQQQQQqqiiqii", la, row_stride, 0, 1, ta, ra if row_index else 0,
                       tra if per_row_t else 0, temperature, outs[0], outs[1] if entropy else 0, outs[2], outs[3], st,
                       V, -100, n, n_chunks, total_rows, 0, 0)
    tail = f"Lb{int(entropy)}ELb{int(row_index)}ELb{int(per_row_t)}E"
    chunk = emu.entry(module, f"slp_chunk_kernelI{emu.CUDA_TYPE[dtype]}Li{block_v}ELi{vec}E{tail}Lb{int(n_chunks == 1)}EEEvNS_4ArgsEi")
    for r in range(n):
        for c in range(n_chunks):
            emu.run_cta(chunk, 32, [args, chunk_v], mem.buf, (r, c))
    if n_chunks > 1:
        merge = emu.entry(module, f"slp_merge64_kernelI{emu.CUDA_TYPE[dtype]}Li32E{tail}EEvNS_4ArgsE" if n_chunks > 32 else
                      f"slp_merge_kernelI{emu.CUDA_TYPE[dtype]}Li{next_power_of_2(n_chunks)}ELi32E{tail}EEvNS_4ArgsE")
        for b in range(-(-n // 32)):
            emu.run_cta(merge, 128, [args], mem.buf, b)
    got = outputs(mem, outs)
    same = {label: torch.equal(a.view(torch.int32), b.view(torch.int32))
            for label, a, b in zip(("logp", "entropy", "row_max", "row_logsum"), want, got)
            if label != "entropy" or entropy}
    return dict(row, vec=vec, chunks=n_chunks, same_bits=same, result="equal" if all(same.values()) else "DIFFERENT")


def slp_bwd_case(module: str, dtype, V: int, n: int, seed: int, row_stride=None, entropy=True, row_index=False,
                 per_row_t=False, temperature=1.0) -> dict:
    """The backward of both implementations on the same logits and row statistics: d logits' bits."""
    row_stride = row_stride or V
    total_rows = n + 2 if row_index else n
    g, logits, target, rows, temps = slp_inputs(dtype, V, n, seed, row_stride, total_rows, row_index, per_row_t)
    z = logits[rows.clamp(0, total_rows - 1) if row_index else slice(0, n), :V].float() / \
        (temps[:, None] if per_row_t else temperature)
    row_max = z.max(1).values
    logsum = (z - row_max[:, None]).exp().sum(1).log()
    ent = torch.rand(n, generator=g) * 5
    grad_logp, grad_ent = torch.randn(n, generator=g), torch.randn(n, generator=g)
    vec = native._slp_bwd_vec(logits[:, :V])
    row = {"dtype": str(dtype)[6:], "V": V, "rows": n, "row_stride": row_stride, "entropy_grad": entropy,
           "row_index": row_index, "per_row_temperature": per_row_t, "temperature": temperature, "vec": vec}
    cfg = configs.lookup("selected_logp_bwd", "sm90", dtype, V)
    size = 2 * total_rows * max(row_stride, V) * 4 + n * 64 + (1 << 16)

    def regions(mem):
        return [mem.put(t) for t in (logits, target, rows if row_index else target, temps if per_row_t else
                                     torch.zeros(1), row_max, logsum, ent, grad_logp, grad_ent,
                                     torch.zeros(total_rows * V, dtype=dtype))]

    mem = emu.Memory(size)
    la, ta, ra, tra, ma, sa, ea, gla, gea, oa = regions(mem)
    params = [la, row_stride, 0, 1, ta, ra, tra, emu.f32_bits(temperature), ma, sa, ea, gla, gea, oa, V, V,
              (-100) & 0xFFFFFFFF, total_rows, 0, 0]
    ptx, _ = compile_triton_bwd(dtype, V, n, row_stride, total_rows,
                                dict(HAS_ROW_INDEX=row_index, PER_ROW_TEMPERATURE=per_row_t, WITH_ENTROPY_GRAD=entropy))
    code = emu.entry(as_ptxas_compiles(ptx))
    for r in range(n):
        for tile in range(-(-V // cfg.block_v)):
            emu.run_cta(code, 32 * cfg.num_warps, params, mem.buf, (r, tile))
    want = mem.get(oa, total_rows * V, dtype)

    mem = emu.Memory(size)
    la, ta, ra, tra, ma, sa, ea, gla, gea, oa = regions(mem)
    args = struct.pack("<QqQQQf4xQQQQQQqqqii", la, row_stride, ta, ra if row_index else 0, tra if per_row_t else 0,
                       temperature, ma, sa, ea if entropy else 0, gla, gea if entropy else 0, oa, V, -100, total_rows,
                       0, 0)
    unroll, threads, blocks = native.slp_bwd_launch(V, vec)
    code = emu.entry(module, f"slp_bwd_kernelI{emu.CUDA_TYPE[dtype]}Li{vec}ELi{unroll}ELb{int(entropy)}ELb{int(row_index)}ELb{int(per_row_t)}EEEvNS_7BwdArgsE")
    for r in range(n):
        for b in range(blocks):
            emu.run_cta(code, threads, [args], mem.buf, (r, b))
    got = mem.get(oa, total_rows * V, dtype)
    ints = torch.int32 if dtype == torch.float32 else torch.int16
    same = torch.equal(want.view(ints), got.view(ints))
    return dict(row, same_bits={"grad_logits": same}, result="equal" if same else "DIFFERENT")


def compile_triton_bwd(dtype, V, n, row_stride, total_rows, flags):
    cfg = configs.lookup("selected_logp_bwd", "sm90", dtype, V)

    def f(k):
        return torch.empty(max(k, 1))

    ids = torch.empty(n, dtype=torch.int64)
    args = dict(logits_ptr=torch.empty(total_rows * row_stride, dtype=dtype), stride_outer=row_stride, stride_inner=0,
                inner_size=1, target_ptr=ids, row_index_ptr=ids, temperature_ptr=f(n), temperature=1.0,
                row_max_ptr=f(n), row_logsum_ptr=f(n), entropy_ptr=f(n), grad_logp_ptr=f(n), grad_entropy_ptr=f(n),
                grad_logits_ptr=torch.empty(total_rows * V, dtype=dtype), grad_row_stride=V, V=V, ignore_index=-100,
                total_rows=total_rows, BLOCK_V=cfg.block_v, **flags)
    _, _, ptx, err = compile_for_sm90(slp._bwd_kernel, args, cfg.num_warps, cfg.num_stages)
    if err:
        raise RuntimeError(err)
    return ptx, cfg


def slp_cases():
    """Every chunk count class (1, 2, 4, 8, 16, 32 merge lanes, two warps; FINISH with both tile widths), each
    dtype, the flags, a row stride not a multiple of 16, odd V."""
    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        out += [(dtype, V, 5, {}) for V in (1000, 8000, 16000, 32000, 50257, 128256, 151936)]
    bf = torch.bfloat16
    out += [(bf, 151936, 5, dict(entropy=False)), (bf, 151936, 5, dict(row_index=True)),
            (bf, 151936, 4, dict(per_row_t=True)), (bf, 151936, 3, dict(temperature=0.7)),
            (bf, 151936, 3, dict(row_stride=151937)), (bf, 1000, 5, dict(row_stride=1008)),
            (torch.float16, 50257, 4, dict(row_stride=50264, entropy=False)), (bf, 16000, 40, {}),
            (bf, 262144, 2, {}), (torch.float32, 262144, 3, {}), (torch.float32, 151936, 40, dict(entropy=False)),
            (bf, 393216, 2, {})]
    # [B, T, V] logits: Triton's 3-D addressing against the native kernel on the [N, V] view
    out += [(bf, 151936, 6, dict(inner=3)), (torch.float16, 50257, 4, dict(inner=2)),
            (torch.float32, 32000, 6, dict(inner=3)), (bf, 8000, 4, dict(inner=2))]
    return out


def slp_bwd_cases():
    """The backward is elementwise: each dtype and vector width, the flags, odd V, strided rows."""
    bf = torch.bfloat16
    out = [(dt, V, 4, {}) for dt in (bf, torch.float16, torch.float32) for V in (4096, 5001)]
    out += [(bf, 4096, 4, dict(entropy=False)), (bf, 4096, 5, dict(row_index=True)), (bf, 4096, 4, dict(per_row_t=True)),
            (bf, 4096, 3, dict(temperature=0.7)), (bf, 4096, 3, dict(row_stride=4100)),
            (torch.float32, 2000, 3, dict(row_stride=2003, temperature=1.3)),
            # aligned rows whose last block is partial: some of a thread's vectors lie past V
            (bf, 5000, 3, {}), (torch.float32, 3000, 3, {})]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", nargs="+", default=["rmsnorm", "selected_logp"], choices=["rmsnorm", "selected_logp"])
    ap.add_argument("--out", help="write the JSON report here")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=native.NATIVE_DIR).stdout
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit.strip() or None, "triton": triton.__version__, "torch": torch.__version__,
              "nvcc_flags": list(native.BUILD_FLAGS), "ops": {}}
    for op in args.op:
        if op == "rmsnorm":
            module = native.compile_ptx("rmsnorm_kernels.cu")
            runs = [lambda case=case, i=i: rmsnorm_case(module, *case, seed=i) for i, case in enumerate(rmsnorm_cases())]
            runs += [lambda case=case, i=i: rmsnorm_bwd_case(module, *case[:4], seed=i, N=case[4], R=case[5])
                     for i, case in enumerate(rmsnorm_bwd_cases())]
        else:
            module = native.compile_ptx("selected_logp_kernels.cu")
            runs = [lambda case=case, i=i: slp_case(module, case[0], case[1], case[2], seed=i, **case[3])
                    for i, case in enumerate(slp_cases())]
            runs += [lambda case=case, i=i: dict(slp_bwd_case(module, case[0], case[1], case[2], seed=i, **case[3]),
                                                 kernel="backward")
                     for i, case in enumerate(slp_bwd_cases())]
        rows = []
        for run in runs:
            rows.append(run())
            print(op, json.dumps(rows[-1]), flush=True)
        report["ops"][op] = {"rows": rows, "different": sum(r["result"] == "DIFFERENT" for r in rows),
                             "refused": sum(r["result"].startswith("refused") for r in rows)}
        print(f"{op}: {len(rows)} cases, {report['ops'][op]['different']} different, "
              f"{report['ops'][op]['refused']} refused by the native launcher")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 1 if any(o["different"] for o in report["ops"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
