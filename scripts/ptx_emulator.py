"""A small lockstep PTX emulator: one CTA of a kernel (straight-line code, forward branches, loops whose
back edge every active thread takes together, shuffles, shared memory, bar.sync), run on the CPU
bit-exactly for the instructions it knows (it raises NotImplementedError on others). f32 add / mul /
div / sqrt are numpy float32 (IEEE round to nearest even); fma.rn is exact (fma32); .ftz flushes
subnormals. Threads of a warp that store to one shared address in one instruction: the write kept is
the one shared_write_order models. The approximate instructions (ex2.approx.ftz, div.full) are
deterministic models, not the hardware's bits: a comparison of two kernels that use them on the same
values is valid, a comparison with a GPU's result is not. ctaid is an int (x) or a tuple (x, y); a
struct parameter is its bytes.

What it is for: checking, without a GPU, that a native/ kernel's PTX (nvcc -ptx) computes in a given
order. It reproduced the H200 gate's refusal of the first native rms_norm forward output for output,
then found the rewritten kernel equal to Triton 3.6's PTX on every gate case before any device time
was spent (docs/native.md). tests/test_native_order.py runs native/rmsnorm_kernels.cu's PTX in it
against a NumPy model of the documented order.

    run_cta(ptx_of_one_entry, nthreads, params, gmem_uint8, ctaid) -> the CTA (gmem is written in place)
    Memory(size): a gmem to lay tensors out in (put / alloc give addresses, get reads a result back)
"""
import re
import struct

import numpy as np
import torch

# nvcc's mangled name of a kernel template's element type, as entry names spell it
CUDA_TYPE = {torch.bfloat16: "13__nv_bfloat16", torch.float16: "6__half", torch.float32: "f"}

MASK = {1: 0x1, 8: 0xFF, 16: 0xFFFF, 32: 0xFFFFFFFF, 64: 0xFFFFFFFFFFFFFFFF}
PARAM_BASE = 1 << 48  # the address space of kernel parameters (an address taken with mov)


def fma32(a, b, c):
    """Correctly rounded float32 fma: the product is exact in float64; s = fl64(p + c) is corrected for
    the one case where rounding s to float32 double-rounds (s exactly a float32 midpoint, error != 0)."""
    a = a.astype(np.float64); b = b.astype(np.float64); c = c.astype(np.float64)
    p = a * b
    with np.errstate(all="ignore"):
        s = p + c
        bb = s - p
        e = (p - (s - bb)) + (c - bb)  # TwoSum: s + e == p + c exactly
        f = s.astype(np.float32)
        # is s a midpoint between two float32 neighbours? then rounding must follow e's sign
        lo = np.where(f.astype(np.float64) > s, np.nextafter(f, np.float32(-np.inf)), f)
        hi = np.nextafter(lo, np.float32(np.inf))
        mid = (lo.astype(np.float64) + hi.astype(np.float64)) / 2
        tie = (s == mid) & (e != 0) & np.isfinite(s)
        fix = np.where(e > 0, hi, lo)
    return np.where(tie, fix, f).astype(np.float32)


def flush(f):
    """Subnormal float32 values to zero of the same sign (.ftz)."""
    f = np.asarray(f, np.float32)
    return np.where(np.abs(f) < np.float32(1.1754944e-38), np.copysign(np.float32(0), f), f).astype(np.float32)


def f32(u):
    return (u & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def f32_bits(v: float) -> int:
    """The bit pattern of float32(v): how run_cta takes a .f32 parameter."""
    return struct.unpack("<I", struct.pack("<f", v))[0]


def u32(f):
    return f.astype(np.float32).view(np.uint32).astype(np.uint64)


def bf16_to_f32(u):
    return ((u & 0xFFFF).astype(np.uint32) << 16).view(np.float32)


def f16_to_f32(u):
    return (u & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)


def f32_to_bf16(f):
    return torch.from_numpy(f.astype(np.float32).copy()).to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16).astype(np.uint64)


def f32_to_f16(f):
    return f.astype(np.float32).astype(np.float16).view(np.uint16).astype(np.uint64)


def parse(ptx):
    """(entry name, params, shared decls, list of (label | instruction tuple))."""
    body = ptx[ptx.index(".entry"):]
    name = re.match(r"\.entry\s+(\w+)", body).group(1)
    params = [(ln.split()[1], re.sub(r"\[\d*\]$", "", ln.split()[-1].rstrip(",")))  # a .b8 array: its name
              for ln in body[:body.index(")")].splitlines() if ln.strip().startswith(".param")]
    shared = re.findall(r"\.shared\s+\.align\s+(\d+)\s+\.b8\s+(\w+)\[(\d*)\]", ptx)
    body = body[body.index("{", body.index(")")) + 1:]
    body = re.sub(r"//[^\n]*", "", body)
    body = re.sub(r"\.section.*", "", body, flags=re.S)
    prog = []
    for stmt in re.split(r";|\n", body):
        s = stmt.strip()
        if s.startswith("{"):  # inline asm block
            s = s[1:].strip()
        if not s or s.startswith(".") or s == "}":
            continue
        m = re.match(r"^(\$?[\w$]+):\s*(.*)$", s)
        if m:
            prog.append(("label", m.group(1)))
            s = m.group(2).strip()
            if not s:
                continue
        pred = None
        m = re.match(r"^@(!?)(%\w+)\s+(.*)$", s)
        if m:
            pred = (m.group(1) == "!", m.group(2))
            s = m.group(3)
        parts = s.split(None, 1)
        op = parts[0]
        args = split_args(parts[1]) if len(parts) > 1 else []
        prog.append(("ins", pred, op, args))
    return name, params, shared, prog


def split_args(s):
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip()); cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


class Memory:
    """A flat device memory for run_cta: each region 256-byte aligned (plus a byte offset), 256 bytes
    after the previous one."""

    def __init__(self, size: int):
        self.buf = np.zeros(size, np.uint8)
        self.top = 4096

    def alloc(self, nbytes: int, offset: int = 0) -> int:
        at = self.top + offset
        self.top = (at + nbytes + 255) // 256 * 256 + 256
        return at

    def put(self, t: torch.Tensor, offset: int = 0) -> int:
        b = t.contiguous().view(-1).view(torch.uint8).numpy()
        at = self.alloc(b.size, offset)
        self.buf[at:at + b.size] = b
        return at

    def get(self, at: int, n: int, dtype) -> torch.Tensor:
        size = torch.empty(0, dtype=dtype).element_size()
        ints = {2: torch.int16, 4: torch.int32}[size]
        return torch.from_numpy(self.buf[at:at + n * size].copy()).view(ints).view(dtype)


def shared_write_order(threads, nbytes):
    """The order in which one st.shared's writes land, for threads writing the same address: a warp's
    store of nbytes a thread runs in phases of 128 / nbytes lanes (32 lanes for 4 bytes, 16 for 8, 8 for
    16) in lane order, so a later phase's write is the one kept; within a phase the lowest lane's write
    is kept. Returned as a sort key (written in increasing key order, the last write kept). A model, fitted
    to what the H200 gate showed (docs/native.md): Triton's merge, storing a row's results from 16 or 32
    lanes with st.shared.v4, keeps an upper-half lane's; an all-lane 4-byte store keeps a lower-half
    lane's. Which lane within a phase is not observed (there all lanes of a half hold the same value)."""
    lane = threads % 32
    per_phase = 32 // max(1, nbytes // 4)
    return (threads // 32) * 256 + (lane // per_phase) * 32 + (per_phase - 1 - lane % per_phase)


class CTA:
    def __init__(self, ptx, nthreads, params, gmem, ctaid):
        self.name, self.pdecl, shared_decl, self.prog = parse(ptx)
        self.n = nthreads
        self.params = params  # list of raw integer values (bit patterns) in declaration order
        self.gmem = gmem  # numpy uint8 array, addresses are indices
        self.smem = np.zeros(1 << 17, np.uint8)
        self.sym = {"global_smem": 0}
        off = 0
        for align, nm, size in shared_decl:
            off = (off + int(align) - 1) // int(align) * int(align)
            self.sym[nm] = off
            off += int(size or 0)
        self.regs = {}
        self.tid = np.arange(nthreads, dtype=np.uint64)
        self.ctaid = ctaid
        self.active = np.ones(nthreads, bool)
        self.waiting = {}  # label -> mask of threads that branched there
        self.labels = {item[1]: k for k, item in enumerate(self.prog) if item[0] == "label"}

    # ---- operands ----
    def val(self, a):
        a = a.strip()
        if a.startswith("%"):
            if a == "%tid.x":
                return self.tid.copy()
            if a in ("%tid.y", "%tid.z", "%ctaid.z"):
                return np.zeros(self.n, np.uint64)
            if a in ("%ctaid.x", "%ctaid.y"):
                cta = self.ctaid if isinstance(self.ctaid, tuple) else (self.ctaid, 0)
                return np.full(self.n, cta[a == "%ctaid.y"], np.uint64)
            if a == "%ntid.x":
                return np.full(self.n, self.n, np.uint64)
            if a in ("%laneid",):
                return self.tid % 32
            return self.regs[a]
        if re.match(r"^0[fF][0-9a-fA-F]{8}$", a):
            return np.full(self.n, int(a[2:], 16), np.uint64)
        if re.match(r"^-?\d+$", a):
            return np.full(self.n, int(a) & MASK[64], np.uint64)
        if re.match(r"^0x[0-9a-fA-F]+$", a):
            return np.full(self.n, int(a, 16), np.uint64)
        if a in self.sym:
            return np.full(self.n, self.sym[a], np.uint64)
        pidx = [p[1] for p in self.pdecl]
        if a in pidx:  # a parameter's address (nvcc takes a struct parameter's): ld.param decodes it
            return np.full(self.n, PARAM_BASE + (pidx.index(a) << 32), np.uint64)
        raise ValueError(f"operand {a}")

    def addr(self, a):
        inner = a.strip()[1:-1].strip()
        m = re.match(r"^([%\w$.]+)\s*(?:\+\s*(-?\d+))?$", inner)
        base, off = m.group(1), int(m.group(2) or 0)
        if base.startswith("%"):
            return (self.val(base) + np.uint64(off & MASK[64])) & np.uint64(MASK[64])
        pidx = [p[1] for p in self.pdecl]
        if base in pidx:
            return ("param", pidx.index(base), off)
        return np.full(self.n, self.sym[base] + off, np.uint64)

    def setr(self, d, v, mask):
        d = d.strip()
        if d == "_":
            return
        old = self.regs.get(d)
        v = np.asarray(v)
        if old is None:
            old = np.zeros(self.n, v.dtype)
        self.regs[d] = np.where(mask, v, old).astype(v.dtype)

    # ---- execution ----
    def run(self):
        i = 0
        prog = self.prog
        while i < len(prog):
            item = prog[i]
            i += 1
            if item[0] == "label":
                w = self.waiting.pop(item[1], None)
                if w is not None:
                    self.active |= w
                continue
            _, pred, op, args = item
            mask = self.active.copy()
            if pred is not None:
                p = self.regs[pred[1]].astype(bool)
                mask &= ~p if pred[0] else p
            if op.startswith("bra"):
                tgt = args[0]
                if self.labels[tgt] < i:  # a loop's back edge: taken by every active thread or by none
                    if mask.any():
                        if (mask != self.active).any():
                            raise NotImplementedError("divergent backward branch to " + tgt)
                        i = self.labels[tgt]
                    continue
                self.waiting[tgt] = self.waiting.get(tgt, np.zeros(self.n, bool)) | mask
                self.active &= ~mask
                continue
            if op.startswith("ret") or op.startswith("exit"):
                self.active &= ~mask
                continue
            self.exec(op, args, mask)

    def exec(self, op, a, mask):
        o = op.split(".")
        base = o[0]
        if base == "ld" and o[1] == "param":
            at = self.addr(a[1])
            if isinstance(at, tuple):
                _, idx, off = at
            else:  # through a register holding a parameter's address (uniform)
                at = int(at[np.nonzero(mask)[0][0]]) if mask.any() else PARAM_BASE
                idx, off = (at - PARAM_BASE) >> 32, at & 0xFFFFFFFF
            value = self.params[idx]
            regs = [x.strip() for x in a[0].strip("{} ").split(",")]  # ld.param.v2 / .v4 too
            width = int(re.sub(r"\D", "", o[-1])) // 8
            for k, reg in enumerate(regs):
                if isinstance(value, (bytes, bytearray)):  # a struct passed by value: its bytes
                    v = int.from_bytes(value[off + k * width:off + (k + 1) * width], "little")
                else:
                    assert len(regs) == 1 and off == 0, op
                    v = value
                if o[-1][0] == "s" and width < 8:  # ld.param.s32 into a 64-bit register: sign-extended
                    v &= MASK[8 * width]
                    v = v - (1 << 8 * width) if v >> (8 * width - 1) else v
                self.setr(reg, np.full(self.n, v & MASK[64], np.uint64), mask)
            return
        if base == "mov":
            d, s = a
            if s.startswith("{"):  # pack
                parts = [x.strip() for x in s[1:-1].split(",")]
                bits = {"b32": 16, "b64": 32}[o[1]]
                v = np.zeros(self.n, np.uint64)
                for k, p in enumerate(parts):
                    v |= (self.val(p) & np.uint64(MASK[bits])) << np.uint64(k * bits)
                self.setr(d, v, mask)
            elif d.startswith("{"):  # unpack
                parts = [x.strip() for x in d[1:-1].split(",")]
                bits = {"b32": 16, "b64": 32}[o[1]]
                v = self.val(s)
                for k, p in enumerate(parts):
                    self.setr(p, (v >> np.uint64(k * bits)) & np.uint64(MASK[bits]), mask)
            else:
                w = 1 if o[1] == "pred" else int(re.sub(r"\D", "", o[1]))
                self.setr(d, self.val(s) & np.uint64(MASK[w]), mask)
            return
        if base == "cvta":
            self.setr(a[0], self.val(a[1]), mask); return
        if base == "cvt":
            mods = [x for x in o[1:] if x not in ("rn", "rz", "rm", "rp", "sat", "ftz", "rni", "rzi")]
            dt, st = mods[0], mods[1]
            v = self.val(a[1])
            if st in ("bf16", "f16") and dt == "f32":
                f = bf16_to_f32(v) if st == "bf16" else f16_to_f32(v)
                self.setr(a[0], u32(f), mask)
            elif st == "f32" and dt in ("bf16", "f16"):
                conv = f32_to_bf16 if dt == "bf16" else f32_to_f16
                self.setr(a[0], conv(f32(v)), mask)
            elif st == "f32" and dt in ("bf16x2", "f16x2"):
                conv = f32_to_bf16 if dt == "bf16x2" else f32_to_f16
                hi, lo = conv(f32(self.val(a[1]))), conv(f32(self.val(a[2])))
                self.setr(a[0], (hi << np.uint64(16)) | lo, mask)
            elif st == "f32" and dt == "f32":
                self.setr(a[0], v & np.uint64(MASK[32]), mask)
            elif st[0] in "us" and dt[0] in "usb":
                sw, dw = int(st[1:]), int(dt[1:])
                v = v & np.uint64(MASK[sw])
                if st[0] == "s" and dw > sw:
                    sign = (v >> np.uint64(sw - 1)) & np.uint64(1)
                    v = np.where(sign == 1, v | (np.uint64(MASK[64]) ^ np.uint64(MASK[sw])), v)
                self.setr(a[0], v & np.uint64(MASK[dw]), mask)
            elif st in ("s32", "u32") and dt == "f32":
                v = v & np.uint64(MASK[32])
                iv = v.astype(np.uint32).view(np.int32) if st == "s32" else v.astype(np.uint32)
                self.setr(a[0], u32(iv.astype(np.float32)), mask)
            else:
                raise NotImplementedError(op)
            return
        if base == "add" and o[-1] in ("bf16", "f16", "bf16x2", "f16x2"):  # 16-bit float adds, per half
            assert "ftz" not in o and "sat" not in o, op
            to32, back = (bf16_to_f32, f32_to_bf16) if o[-1].startswith("bf16") else (f16_to_f32, f32_to_f16)
            x, y = self.val(a[1]), self.val(a[2])
            r = np.zeros(self.n, np.uint64)
            for k in range(2 if o[-1].endswith("x2") else 1):
                sh = np.uint64(16 * k)
                with np.errstate(all="ignore"):  # the fp32 sum rounded once more: the exact sum's rounding
                    h = to32((x >> sh) & np.uint64(0xFFFF)) + to32((y >> sh) & np.uint64(0xFFFF))
                r |= (back(h) & np.uint64(0xFFFF)) << sh
            self.ops.append((base, o))
            self.setr(a[0], r, mask)
            return
        if base == "ex2" and o[1:] == ["approx", "ftz", "f32"]:
            # a model of the hardware's approximation (correctly rounded 2^x, subnormals flushed): both
            # kernels compared use this instruction, so the comparison needs only a deterministic one
            x = flush(f32(self.val(a[1])))
            with np.errstate(all="ignore"):
                r = flush(np.exp2(x.astype(np.float64)).astype(np.float32))
            self.ops.append((base, o))
            self.setr(a[0], u32(r), mask)
            return
        if (base == "rcp" and o[1:] == ["approx", "ftz", "f32"]) or (base == "div" and o[1:] == ["full", "f32"]) \
                or (base in ("add", "sub") and o[1:] == ["divfull", "f32"]):
            # div.full.f32 a, b as ptxas expands it: both scaled by 1/4 when |b| > 2^126, by 2^24 when
            # |b| < 2^-126, then a' * rcp(b') (MUFU.RCP: rcp.approx.ftz, modelled as a correctly rounded
            # reciprocal with subnormals flushed, like ex2). add / sub.divfull x, a, b: x +- a / b with
            # that final product contracted into the add (contract_like_ptxas makes them).
            x = [f32(self.val(s)) for s in a[1:]]
            num, den = (np.float32(1), x[0]) if base == "rcp" else (x[-2], x[-1])
            with np.errstate(all="ignore"):
                if base != "rcp":
                    big, small = np.abs(den) > np.float32(2.0 ** 126), np.abs(den) < np.float32(2.0 ** -126)
                    num = np.where(big, num * np.float32(0.25), num).astype(np.float32)
                    den = np.where(big, den * np.float32(0.25), den).astype(np.float32)
                    num = np.where(small, num * np.float32(2.0 ** 24), num).astype(np.float32)
                    den = np.where(small, den * np.float32(2.0 ** 24), den).astype(np.float32)
                rcp = flush((np.float64(1) / flush(den).astype(np.float64)).astype(np.float32))
                if base == "rcp":
                    r = rcp
                elif base == "div":
                    r = num * rcp
                else:
                    r = fma32(rcp, num if base == "add" else -num, x[0])
            self.ops.append((base, o))
            self.setr(a[0], u32(r), mask)
            return
        if base in ("add", "sub", "mul", "div", "fma", "sqrt", "rcp", "neg", "abs", "min", "max") and "f32" in o:
            x = [f32(self.val(s)) for s in a[1:]]
            assert "approx" not in o and ("ftz" not in o or base == "fma"), op
            if base in ("sqrt", "fma", "rcp", "div"):
                assert "rn" in o, op
            if "ftz" in o:
                x = [flush(v) for v in x]
            with np.errstate(all="ignore"):
                if base == "add": r = x[0] + x[1]
                elif base == "sub": r = x[0] - x[1]
                elif base == "mul": r = x[0] * x[1]
                elif base == "div": r = x[0] / x[1]
                elif base == "sqrt": r = np.sqrt(x[0])
                elif base == "rcp": r = np.float32(1) / x[0]
                elif base == "fma": r = fma32(x[0], x[1], x[2])
                elif base == "neg": r = -x[0]
                elif base == "abs": r = np.abs(x[0])
                elif base == "min": r = np.fmin(x[0], x[1])  # PTX min / max: a NaN operand loses
                elif base == "max": r = np.fmax(x[0], x[1])
            if "ftz" in o:
                r = flush(r)
            self.ops.append((base, o))
            self.setr(a[0], u32(r), mask)
            return
        if base == "selp":
            c = self.regs[a[3]].astype(bool)
            self.setr(a[0], np.where(c, self.val(a[1]), self.val(a[2])), mask); return
        if base == "setp":
            cmp, t = o[1], o[-1]
            x, y = self.val(a[1]), self.val(a[2])
            w = int(t[1:]) if t[0] in "usb" else 32
            x = x & np.uint64(MASK[w]); y = y & np.uint64(MASK[w])
            if t[0] == "s":
                x = x.astype(np.int64) if w == 64 else (x.astype(np.uint32).view(np.int32) if w == 32 else x.astype(np.uint16).view(np.int16)).astype(np.int64)
                y = y.astype(np.int64) if w == 64 else (y.astype(np.uint32).view(np.int32) if w == 32 else y.astype(np.uint16).view(np.int16)).astype(np.int64)
            elif t == "f32":
                x, y = f32(x), f32(y)
            with np.errstate(invalid="ignore"):
                if t == "f32" and cmp.endswith("u") and cmp not in ("nu",):  # unordered: true with a NaN
                    r = {"equ": x == y, "neu": x != y, "ltu": x < y, "leu": x <= y, "gtu": x > y,
                         "geu": x >= y}[cmp] | np.isnan(x) | np.isnan(y)
                elif t == "f32" and cmp in ("num", "nan"):
                    r = (~np.isnan(x) & ~np.isnan(y)) if cmp == "num" else (np.isnan(x) | np.isnan(y))
                else:
                    r = {"lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y, "eq": x == y, "ne": x != y,
                         "lo": x < y, "ls": x <= y, "hi": x > y, "hs": x >= y}[cmp]
                    if t == "f32" and cmp == "ne":  # ordered: false with a NaN
                        r = r & ~np.isnan(x) & ~np.isnan(y)
            dests = a[0].split("|")
            self.setr(dests[0], r, mask)
            if len(dests) > 1:
                self.setr(dests[1], ~r, mask)
            return
        if base == "bfe":
            t = o[-1]; w = int(t[1:])
            v = self.val(a[1]) & np.uint64(MASK[w])
            pos = self.val(a[2]) & np.uint64(0xFF); ln = self.val(a[3]) & np.uint64(0xFF)
            assert np.all(ln > 0) and np.all(pos + ln <= w), op
            r = (v >> pos) & ((np.uint64(1) << ln) - np.uint64(1))
            if t[0] == "s":
                sign = (r >> (ln - np.uint64(1))) & np.uint64(1)
                r = np.where(sign == 1, r | (np.uint64(MASK[64]) ^ ((np.uint64(1) << ln) - np.uint64(1))), r)
            self.setr(a[0], r & np.uint64(MASK[w]), mask); return
        if base == "bfi":  # bfi.bW d, a, b, pos, len: b with bits [pos, pos + len) replaced by a's low bits
            w = int(o[-1][1:])
            pos = self.val(a[3]) & np.uint64(0xFF); ln = self.val(a[4]) & np.uint64(0xFF)
            assert np.all(pos + ln <= w), op
            field = ((np.uint64(1) << ln) - np.uint64(1)) << pos
            r = (self.val(a[2]) & ~field) | ((self.val(a[1]) << pos) & field)
            self.setr(a[0], r & np.uint64(MASK[w]), mask); return
        if base in ("and", "or", "xor", "not") and o[1] == "pred":
            x = [self.regs[s.strip()].astype(bool) for s in a[1:]]
            r = {"and": lambda: x[0] & x[1], "or": lambda: x[0] | x[1], "xor": lambda: x[0] ^ x[1], "not": lambda: ~x[0]}[base]()
            self.setr(a[0], r, mask); return
        if base in ("add", "sub", "mul", "mad", "and", "or", "xor", "shl", "shr", "not", "neg", "min", "max", "rem", "div"):
            t = o[-1]
            w = int(t[1:])
            vs = [self.val(s) for s in a[1:]]
            if base in ("mul", "mad") and o[1] == "wide":
                sw = w
                dw = 2 * w
                xs = []
                for v in vs[:2]:
                    v = v & np.uint64(MASK[sw])
                    if t[0] == "s":
                        v = v.astype(np.uint32).view(np.int32).astype(np.int64).astype(np.uint64)
                    xs.append(v)
                r = (xs[0] * xs[1])
                if base == "mad":
                    r = r + vs[2]
                self.setr(a[0], r & np.uint64(MASK[dw]), mask); return
            m = np.uint64(MASK[w])
            if base in ("shr",) and t[0] == "s":
                x = vs[0] & m
                sx = x.astype(np.int64) if w == 64 else x.astype(np.uint32).view(np.int32).astype(np.int64)
                r = (sx >> vs[1].astype(np.int64)).astype(np.uint64)
            elif base in ("min", "max", "rem", "div") and t[0] == "s":
                sx = [(v & m).astype(np.int64) if w == 64 else (v & m).astype(np.uint32).view(np.int32).astype(np.int64) for v in vs]
                with np.errstate(all="ignore"):  # inactive lanes may divide by zero: their results are dropped
                    r = {"min": lambda: np.minimum(*sx), "max": lambda: np.maximum(*sx), "rem": lambda: np.fmod(sx[0], sx[1]),
                         "div": lambda: (np.trunc(sx[0] / sx[1])).astype(np.int64)}[base]().astype(np.uint64)
            else:
                with np.errstate(all="ignore"):
                    r = {"add": lambda: vs[0] + vs[1], "sub": lambda: vs[0] - vs[1],
                         "mul": lambda: vs[0] * vs[1], "mad": lambda: vs[0] * vs[1] + vs[2],
                         "and": lambda: vs[0] & vs[1], "or": lambda: vs[0] | vs[1], "xor": lambda: vs[0] ^ vs[1],
                         "shl": lambda: vs[0] << vs[1], "shr": lambda: (vs[0] & m) >> vs[1], "not": lambda: ~vs[0],
                         "neg": lambda: (np.uint64(0) - vs[0]), "min": lambda: np.minimum(vs[0] & m, vs[1] & m),
                         "max": lambda: np.maximum(vs[0] & m, vs[1] & m), "rem": lambda: (vs[0] & m) % (vs[1] & m),
                         "div": lambda: (vs[0] & m) // (vs[1] & m)}[base]()
            self.setr(a[0], r & m, mask); return
        if base == "ld" or base == "st":
            space = o[1]
            t = o[-1]
            w = int(t[1:]) // 8
            mem = self.gmem if space == "global" else self.smem
            if base == "ld":
                regs = [x.strip() for x in a[0].strip("{} ").split(",")]
                ad = self.addr(a[1])
            else:
                regs = [x.strip() for x in a[1].strip("{} ").split(",")]
                ad = self.addr(a[0])
            idx = np.nonzero(mask)[0]
            if base == "st" and space == "shared":
                idx = idx[np.argsort(shared_write_order(idx, len(regs) * w), kind="stable")]
            for k, r in enumerate(regs):
                aa = ad[idx].astype(np.int64) + k * w
                if base == "ld":
                    v = np.zeros(len(idx), np.uint64)
                    for b in range(w):
                        v |= mem[aa + b].astype(np.uint64) << np.uint64(8 * b)
                    full = np.zeros(self.n, np.uint64)
                    full[idx] = v
                    self.setr(r, full, mask)
                else:
                    v = self.val(r)[idx]
                    for b in range(w):
                        mem[aa + b] = ((v >> np.uint64(8 * b)) & np.uint64(0xFF)).astype(np.uint8)
                    if space == "global":
                        self.stores.append((aa, w, v))
            return
        if base == "shfl":
            assert o[2] == "bfly", op
            assert np.all((self.val(a[3])[mask] & np.uint64(0xFFFFFFFF)) == 31), a
            assert np.all((self.val(a[4])[mask] & np.uint64(0xFFFFFFFF)) == 0xFFFFFFFF), a
            dests = a[0].split("|")
            v = self.val(a[1]); lane_mask = self.val(a[2])
            src = self.tid ^ (lane_mask & np.uint64(31))
            r = v[src.astype(np.int64)]
            self.setr(dests[0], r, mask)
            if len(dests) > 1:
                self.setr(dests[1], np.ones(self.n, bool), mask)
            return
        if base == "bar" or base == "membar" or base == "fence":
            return
        if base in ("ldmatrix", "stmatrix"):  # m8n8 b16 matrices; per warp, threads 8i..8i+7 give matrix i's rows
            assert "m8n8" in o and "b16" in o and mask.all(), (op, mask.sum())
            trans = "trans" in o
            nmat = int(next(x for x in o if re.match(r"^x\d$", x))[1:])
            if base == "ldmatrix":
                regs = [x.strip() for x in a[0].strip("{} ").split(",")]
                ad = self.addr(a[1]).astype(np.int64)
            else:
                regs = [x.strip() for x in a[1].strip("{} ").split(",")]
                ad = self.addr(a[0]).astype(np.int64)
            out = {r: np.zeros(self.n, np.uint64) for r in regs} if base == "ldmatrix" else None
            for w0 in range(0, self.n, 32):
                for i in range(nmat):
                    rows = ad[w0 + 8 * i: w0 + 8 * i + 8]
                    if base == "ldmatrix":
                        M = np.array([[int(self.smem[rr + 2 * c]) | (int(self.smem[rr + 2 * c + 1]) << 8) for c in range(8)]
                                      for rr in rows], np.uint64)
                        if trans:
                            M = M.T
                        for l in range(32):
                            r, c = l // 4, 2 * (l % 4)
                            out[regs[i]][w0 + l] = M[r, c] | (M[r, c + 1] << np.uint64(16))
                    else:
                        M = np.zeros((8, 8), np.uint64)
                        v = self.val(regs[i])
                        for l in range(32):
                            r, c = l // 4, 2 * (l % 4)
                            M[r, c] = v[w0 + l] & np.uint64(0xFFFF)
                            M[r, c + 1] = (v[w0 + l] >> np.uint64(16)) & np.uint64(0xFFFF)
                        if trans:
                            M = M.T
                        for k, rr in enumerate(rows):
                            for c in range(8):
                                self.smem[rr + 2 * c] = int(M[k, c]) & 0xFF
                                self.smem[rr + 2 * c + 1] = int(M[k, c]) >> 8
            if base == "ldmatrix":
                for r in regs:
                    self.setr(r, out[r], mask)
            return
        raise NotImplementedError(op)


def contract_like_ptxas(ptx):
    """Triton's PTX as ptxas compiles it: a plain mul.f32 whose result has one use, an add.f32 or
    sub.f32, becomes an fma there (ptxas contracts by default; .rn operations never). Callers check
    the count against the SASS's FFMA instructions (scripts/native_ptx_compare.py)."""
    lines = ptx.split("\n")
    count = 0
    for _ in range(2):  # products, then div.full's final product (ptxas expands it, then contracts)
        lines, n = _contract(lines, divisions=_ > 0)
        count += n
    return "\n".join(lines), count


def _contract(lines, divisions):
    lines = "\n".join(lines).split("\n")
    uses = {}
    for k, ln in enumerate(lines):
        for reg in re.findall(r"%r\d+\b", ln):
            uses.setdefault(reg, []).append(k)
    count = 0
    for k, ln in enumerate(lines):
        pattern = r"^\s*div\.full\.f32\s+(%r\d+),\s*([^,]+),\s*([^;]+);" if divisions else \
            r"^\s*mul\.f32\s+(%r\d+),\s*([^,]+),\s*([^;]+);"
        m = re.match(pattern, ln)
        if not m or len(uses[m.group(1)]) != 2:
            continue
        d, x, y = m.group(1), m.group(2).strip(), m.group(3).strip()
        j = uses[d][1]
        u = re.match(r"^(\s*)(add|sub)\.f32\s+(%r\d+),\s*([^,]+),\s*([^;]+);(.*)$", lines[j])
        if not u or d not in (u.group(4).strip(), u.group(5).strip()):
            continue
        ind, op, out, p, q, rest = u.group(1), u.group(2), u.group(3), u.group(4).strip(), u.group(5).strip(), u.group(6)
        other = q if p == d else p
        if divisions:  # x +- a / b, the quotient's product contracted (only `other - a / b` or a sum)
            if op == "sub" and p == d:
                continue
            lines[j] = f"{ind}{op}.divfull.f32 {out}, {other}, {x}, {y};{rest}"
        elif op == "add":
            lines[j] = f"{ind}fma.rn.f32 {out}, {x}, {y}, {other};{rest}"
        elif p == d:  # x * y - other
            lines[j] = f"{ind}neg.f32 %rcontract{count}, {other};\n{ind}fma.rn.f32 {out}, {x}, {y}, %rcontract{count};{rest}"
        else:  # other - x * y
            lines[j] = f"{ind}neg.f32 %rcontract{count}, {x};\n{ind}fma.rn.f32 {out}, %rcontract{count}, {y}, {other};{rest}"
        count += 1
    return lines, count


def entry(module: str, key: str = "") -> str:
    """The one kernel of a PTX module whose entry name contains key, as run_cta takes it."""
    names = [n for n in re.findall(r"\.entry (\w+)\(", module) if key in n]
    assert len(names) == 1, (key, names[:6])
    i = module.index(".entry " + names[0])
    return ".visible " + module[i:module.index("\n}\n", i) + 3]


def run_cta(ptx, nthreads, params, gmem, ctaid):
    c = CTA(ptx, nthreads, params, gmem, ctaid)
    c.ops, c.stores, c.poisoned = [], [], False
    c.run()
    return c
