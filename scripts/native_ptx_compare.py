"""Run the Triton kernel's sm90 PTX and the native kernel's PTX side by side in scripts/ptx_emulator.py
and compare their outputs bit for bit: the check that a native/ kernel follows the Triton kernel's
order, done before device time is spent on `rlk-triton native admit`.

The Triton PTX is compiled with the GPU machine's Triton (3.6: put its wheel on PYTHONPATH), for each
case's exact argument values, as the JIT specializes them (scripts/aot_compile_check.py); the native
PTX with nvcc and the build's flags. Each case's native variant is the one the launcher would pick
(rlk_triton.native._rmsnorm_config); a case the native kernel refuses is reported as refused.

    PYTHONPATH=/path/to/triton-3.6 python scripts/native_ptx_compare.py [--out report.json]

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

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

import ptx_emulator as emu  # noqa: E402
from aot_compile_check import compile_for_sm90  # noqa: E402
from rlk_triton import configs, native  # noqa: E402
from rlk_triton.ops import rmsnorm  # noqa: E402

TYPE = {torch.bfloat16: "13__nv_bfloat16", torch.float16: "6__half", torch.float32: "f"}
N_ROWS = 16  # rows per case: enough that a one-ulp change of order shows in some rstd


def f2u(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def entry(module: str, name: str = "") -> str:
    names = [n for n in re.findall(r"\.entry (\w+)\(", module) if name in n]
    assert len(names) == 1, (name, names[:4])
    i = module.index(".entry " + names[0])
    return ".visible " + module[i:module.index("\n}\n", i) + 3]


def native_ptx() -> str:
    flags = [f for f in native.BUILD_FLAGS if not f.startswith("-gencode")]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "k.ptx"
        subprocess.run(["nvcc", *flags, "-arch=sm_90a", "-ptx", str(native.NATIVE_DIR / "rmsnorm_kernels.cu"),
                        "-o", str(out)], check=True, capture_output=True, timeout=900)
        return out.read_text()


class Memory:
    """A flat device memory for the emulator: each region 256-byte aligned plus a byte offset."""

    def __init__(self, size: int):
        self.buf = np.zeros(size, np.uint8)
        self.top = 4096

    def put(self, t: torch.Tensor, offset: int = 0) -> int:
        at = self.top + offset
        b = t.contiguous().view(-1).view(torch.uint8).numpy()
        self.buf[at:at + b.size] = b
        self.top = (at + b.size + 255) // 256 * 256 + 256
        return at

    def get(self, at: int, n: int, dtype) -> torch.Tensor:
        size = torch.empty(0, dtype=dtype).element_size()
        ints = {2: torch.int16, 4: torch.int32}[size]
        return torch.from_numpy(self.buf[at:at + n * size].copy()).view(ints).view(dtype)


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
                BLOCK_H=block)
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
        mem = Memory(size)
        xa, ra = mem.put(x), mem.put(r) if fused else 0
        wa = mem.put(w)
        ya, oa = mem.put(torch.zeros(N * H, dtype=dtype)), mem.put(torch.zeros(N * H, dtype=dtype)) if fused else 0
        sa = mem.put(torch.zeros(N))
        for b in range(-(-N // per_block)):
            emu.run_cta(ptx_entry, threads, params(xa, ra, wa, ya, oa, sa), mem.buf, b)
        return [mem.get(ya, N * H, dtype), mem.get(oa, N * H, dtype) if fused else None, mem.get(sa, N, torch.float32)]

    tptx, (block, warps, rows) = triton_rmsnorm_ptx(dtype, H, x_stride, r_stride or x_stride, fused, N)
    floats = [f2u(float(H)), f2u(eps), f2u(offset)]
    want = run(entry(tptx), lambda xa, ra, wa, ya, oa, sa: [xa, x_stride, ra if fused else xa,
                                                            r_stride if fused else x_stride, wa, ya, oa if fused else ya,
                                                            sa] + ([N] if rows > 1 else []) + [H] + floats + [0, 0],
               32 * warps, rows)
    block_n, warps_n, vec, rows_n = layout
    E = block_n // (32 * warps_n)
    wide = min(16 // x.element_size(), E)
    full = H == block_n and vec == wide and x_stride % vec == 0 and (not fused or r_stride % vec == 0)
    name = f"rms_norm_fwd_kernelI{TYPE[dtype]}Li{E}ELi{vec}ELi{warps_n}ELi{rows_n}ELb{int(full)}ELb{int(fused)}EE"
    got = run(entry(module, name), lambda xa, ra, wa, ya, oa, sa: [xa, x_stride, ra, r_stride or 0, wa, ya, oa, sa, N, H]
              + floats, 32 * warps_n, rows_n)
    same = {}
    for label, a, b in zip(("y", "residual_out", "rstd"), want, got):
        if a is not None:
            ints = torch.int32 if a.element_size() == 4 else torch.int16
            same[label] = torch.equal(a.view(ints), b.view(ints))
    return dict(row, vec=vec, rows_per_block=rows_n, full=full, same_bits=same,
                result="equal" if all(same.values()) else "DIFFERENT")


def rmsnorm_cases():
    """The gate's shapes (rlk_triton.native._rmsnorm_cases), with and without the residual, plus the
    row-stride kinds of the fused add (16-multiples or not, with H a 16-multiple or not)."""
    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for H in (128, 1000, 1024, 4096, 4099, 8192, 12288, 16384):
            out += [(dtype, H, H, None), (dtype, H, H, H)]
        out += [(dtype, 4096, 4160, None), (dtype, 4099, 4112, None)]
        out += [(dtype, H, xs, rs) for H, xs, rs in ((4096, 4160, 4176), (4096, 4099, 4115), (4099, 4100, 4116),
                                                     (4099, 4112, 4128), (4099, 4099, 4112), (4099, 4112, 4099))]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON report here")
    args = ap.parse_args()
    module = native_ptx()
    rows = []
    for i, case in enumerate(rmsnorm_cases()):
        rows.append(rmsnorm_case(module, *case, seed=i))
        print(json.dumps(rows[-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=native.NATIVE_DIR).stdout
    report = {"op": "rmsnorm forward", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit.strip() or None, "triton": triton.__version__, "torch": torch.__version__,
              "nvcc_flags": list(native.BUILD_FLAGS), "rows_per_case": N_ROWS,
              "rows": rows, "different": sum(r["result"] == "DIFFERENT" for r in rows),
              "refused": sum(r["result"].startswith("refused") for r in rows)}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"{len(rows)} cases: {report['different']} different, {report['refused']} refused by the native launcher")
    return 1 if report["different"] else 0


if __name__ == "__main__":
    sys.exit(main())
