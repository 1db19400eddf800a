"""The rms_norm backward's row loop in sm90 SASS, the native kernel beside Triton's: instructions per
row by opcode, registers per thread and the forward branches inside the loop, on a machine without a
GPU. It reproduces docs/native.md's counts at bf16 H 4096 (the native loop: 323 instructions at
91a5ec3; 289 at 10fea7d, of which a row without the d residual ran 257; 227 since 5ab2257, the d
residual a template flag; Triton's: 259). Speed is the GPU's to say (scripts/gpu_native.py); this
only counts.

    PYTHONPATH=/path/to/triton-3.6 python scripts/native_sass_loop.py [--dtype bfloat16] [--H 4096]
        [--native-source FILE] [--json OUT]

Needs nvcc and the GPU machine's Triton (3.6: its wheel ships ptxas and nvdisasm). Triton's kernel
is compiled as the JIT specializes the launch (scripts/aot_compile_check.py) with the locked
"rmsnorm_bwd" tile and "rmsnorm_dw_rows" rows, dW on, no residual gradient; the native one is the
instantiation its launcher picks for that tile on full, aligned rows (FULL, no residual gradient read
or d residual written; sources before 5ab2257 had no d residual flag).
--native-source counts another version of native/rmsnorm_kernels.cu (`git show REV:...` into a file).
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402

from aot_compile_check import compile_for_sm90  # noqa: E402
from rlk_triton import configs, native  # noqa: E402
from rlk_triton.ops import rmsnorm  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
MANGLED = {torch.float32: "f", torch.float16: "6__half", torch.bfloat16: "13__nv_bfloat16"}


def sass_functions(cubin: Path) -> dict:
    """{function name: ([(address, instruction text)], {label: index of the instruction it marks})} of a
    cubin, from nvdisasm."""
    out = subprocess.run([str(BIN / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    funcs, name, labels = {}, None, {}
    for line in out.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            name = m.group(1)
            funcs[name] = []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if name and m:
            funcs[name].append((int(m.group(1), 16), m.group(2)))
            continue
        m = re.match(r"\s*\.?(L_x_\d+):", line)
        if name and m:
            labels[(name, m.group(1))] = len(funcs[name])  # the index of the next instruction
    return {n: (ins, {lab: i for (f, lab), i in labels.items() if f == n}) for n, ins in funcs.items()}


def _target(text: str):
    m = re.search(r"\bBRA\b.*?`?\(?\.?(L_x_\d+)", text)
    return m.group(1) if m else None


def row_loop(ins: list, labels: dict) -> dict:
    """The longest loop (a branch back to an earlier label): its instruction count, opcode counts, and
    the forward branches inside it with the instructions each jumps over. A path the compiler
    duplicated (one copy per value of a runtime flag) is counted in full by "instructions", though a
    row runs one copy: the branches show which."""
    start = end = None
    for i, (_, text) in enumerate(ins):
        lab = _target(text)
        if lab and labels.get(lab, i + 1) <= i and (start is None or i + 1 - labels[lab] > end - start):
            start, end = labels[lab], i + 1
    if start is None:
        return {"instructions": 0, "opcodes": {}, "forward_branches": []}
    body = ins[start:end]
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for _, t in body)
    branches = [{"at": hex(a), "instruction": t, "skips": labels[_target(t)] - (start + k) - 1}
                for k, (a, t) in enumerate(body)
                if _target(t) and start + k < labels.get(_target(t), -1) <= end]
    return {"instructions": len(body), "opcodes": dict(ops.most_common()), "forward_branches": branches}


def registers(ptxas_log: str, name: str):
    m = re.search(re.escape(name) + r".*?Used (\d+) registers", ptxas_log, flags=re.S)
    return int(m.group(1)) if m else None


def triton_loop(dtype, H: int, tmp: Path) -> dict:
    cfg = configs.lookup("rmsnorm_bwd", "sm90", dtype, H)
    block, R = rmsnorm.hidden_tile(cfg, H), configs.lookup("rmsnorm_dw_rows", "sm90", dtype, H).block_v
    x, w, r = torch.empty(16, H, dtype=dtype), torch.empty(H, dtype=dtype), torch.empty(16)
    args = dict(grad_y_ptr=x, grad_res_ptr=x, h_ptr=x, h_row_stride=H, w_ptr=w, rstd_ptr=r, dx_ptr=x, dres_ptr=x,
                partial_ptr=r, N=16384, H=H, h_count=float(H), weight_offset=0.0, HAS_GRAD_RES=False, WITH_DW=True,
                WITH_DRES=False, ROWS_PER_BLOCK=R, BLOCK_H=block, ONE_TILE=block >= H)
    _, _, ptx, err = compile_for_sm90(rmsnorm._bwd_kernel, args, cfg.num_warps, cfg.num_stages)
    if err:
        raise RuntimeError(err)
    (tmp / "t.ptx").write_text(ptx)
    log = subprocess.run([str(BIN / "ptxas"), "-v", "--gpu-name", "sm_90a", str(tmp / "t.ptx"), "-o",
                          str(tmp / "t.cubin")], capture_output=True, text=True, check=True).stderr
    (name, (ins, labels)), = sass_functions(tmp / "t.cubin").items()
    return {"kernel": name, "block_h": block, "num_warps": cfg.num_warps, "registers": registers(log, name),
            **row_loop(ins, labels)}


def native_loop(dtype, H: int, source: Path, tmp: Path) -> dict:
    cfg = configs.lookup("rmsnorm_bwd", "sm90", dtype, H)
    block = rmsnorm.hidden_tile(cfg, H)
    E = block // (cfg.num_warps * 32)
    vec = min(16 // torch.empty(0, dtype=dtype).element_size(), E)
    tag = f"rms_norm_bwd_kernelI{MANGLED[dtype]}Li{E}ELi{cfg.num_warps}ELi{vec}ELb1ELb0E"
    nvcc = native._nvcc()
    if nvcc is None:
        raise RuntimeError("no nvcc")
    log = subprocess.run([nvcc, *native.BUILD_FLAGS, "-Xptxas", "-v", "-cubin", str(source),
                          "-o", str(tmp / "n.cubin")], capture_output=True, text=True, check=True).stderr
    funcs = sass_functions(tmp / "n.cubin")
    # FULL, no residual gradient, then no d residual (the flag since 5ab2257; none before it)
    name = next(n for n in funcs if tag + "Lb0EE" in n or tag + "EE" in n)
    ins, labels = funcs[name]
    return {"kernel": name, "block_h": block, "num_warps": cfg.num_warps, "registers": registers(log, name),
            **row_loop(ins, labels)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--H", type=int, default=4096)
    ap.add_argument("--native-source", default=str(native.NATIVE_DIR / "rmsnorm_kernels.cu"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        report = {"dtype": args.dtype, "H": args.H, "triton": triton.__version__,
                  "triton_loop": triton_loop(dtype, args.H, tmp),
                  "native_loop": native_loop(dtype, args.H, Path(args.native_source), tmp)}
    for side in ("triton_loop", "native_loop"):
        r = report[side]
        top = ", ".join(f"{k} {v}" for k, v in list(r["opcodes"].items())[:12])
        print(f"{side:12s} {r['instructions']:4d} instructions in the loop, {r['registers']} registers: {top}")
        for b in r["forward_branches"]:
            print(f"{'':12s} at {b['at']}: {b['instruction']} jumps over {b['skips']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
