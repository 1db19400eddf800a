"""Compile kernels for the H200 (sm90) on a machine without a GPU, with their locked configs, and
report each one's shared memory against the H200's per-block limit and its register spills (ptxas
-v): a check that a kernel change builds for the real target before device time is spent on it.
It does not run anything: speed and bits still need the GPU.

    python scripts/aot_compile_check.py [--out report.json] [--baseline earlier_report.json]

Each row carries a digest of the kernel's PTX without its debug info (`.loc` / `.file` lines and
debug sections) and its MMA instructions: with --baseline, a row whose digest differs from the
earlier report's is printed CHANGED (a refactor that claims "same instructions" must print SAME).

Every member of the sm90 bf16 bit classes (configs.BIT_CLASSES: the matmul's M buckets, the decode
configs) is compiled too, and its MMA instruction families checked against the class's: a member that
compiles to another family (mma.sync instead of wgmma, another K step) leaves what the GPU gate proved.

Kernels are specialized as the JIT specializes a launch with the given argument values (aligned
pointers and ints divisible by 16 marked): that decides vector widths, so layouts and a reduction's
order; PTX compiled without it (what this script did before, and still does on a triton whose JIT
internals differ: the report's jit_specialization says) is not what runs. Needs the triton version of
the GPU machine (3.6: its ptxas ships in the wheel). Exit code 1 when
a kernel fails to compile, needs more shared memory than the H200 has, or leaves its class's families.
"""
import argparse
import collections
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback

os.environ.pop("TRITON_INTERPRET", None)  # real JIT functions, not the interpreter's

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import mangle_type  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from rlk_triton import configs  # noqa: E402

H200_SMEM_PER_BLOCK = 232448  # bytes (cudaDevAttrMaxSharedMemoryPerBlockOptin on the H200)
TARGET = GPUTarget("cuda", 90, 32)


_JIT_SPECIALIZED = [True]  # every kernel so far compiled with the JIT's specialization (the report says)


def _jit_source(fn, args: dict, num_warps: int, num_stages: int, **launch_options):
    """(ASTSource, options) as the JIT builds them at a launch with these arguments: the same
    specialization (16-byte aligned pointers and ints divisible by 16 marked, ints equal to 1 made
    constant), which decides layouts (vector widths) and so a reduction's order. None where this
    triton has no such internals."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    try:
        backend = make_backend(TARGET)
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, spec, opts = binder(**args, num_warps=num_warps, num_stages=num_stages, **launch_options)
        options, signature, constexprs, attrs = fn._pack_args(
            backend, dict(num_warps=num_warps, num_stages=num_stages, **launch_options), bound, spec, opts)
    except (ImportError, AttributeError, TypeError):
        return None
    return ASTSource(fn, signature, constexprs, attrs), options.__dict__


def compile_for_sm90(kernel, args: dict, num_warps: int, num_stages: int, **launch_options):
    """(shared bytes, spill bytes, ptx, None) or (None, None, None, error) for kernel with every argument
    given by name, specialized as the JIT specializes a launch with those values (_jit_source; the
    unspecialized signature where that is unavailable). Spill bytes: the spill stores per thread that
    ptxas -v reports for the kernel's PTX. launch_options: other options of the launch (maxnreg)."""
    kernel = getattr(kernel, "jit", kernel)  # rlk_triton.ops.launch.CachedLaunch: its JIT function
    fn = kernel.fn if hasattr(kernel, "fn") and not hasattr(kernel, "arg_names") else kernel
    args = {p.name: args[p.name] if p.name in args or not p.has_default else p.default for p in fn.params}
    jit = _jit_source(fn, args, num_warps, num_stages, **launch_options)
    _JIT_SPECIALIZED[0] = _JIT_SPECIALIZED[0] and jit is not None
    if jit is None:
        sig, consts = {}, {}
        for p in fn.params:
            if p.is_constexpr:
                sig[p.name] = "constexpr"
                consts[p.name] = args[p.name]
            else:
                sig[p.name] = mangle_type(args[p.name])
        jit = (ASTSource(fn=fn, signature=sig, constexprs=consts),
               {"num_warps": num_warps, "num_stages": num_stages, **launch_options})
    try:
        c = triton.compile(jit[0], target=TARGET, options=jit[1])
    except Exception as ex:  # noqa: BLE001 - reported
        return None, None, None, f"{type(ex).__name__}: {str(ex)[:400]}"
    return c.metadata.shared, ptxas_spill_bytes(c.asm["ptx"]), c.asm["ptx"], None


def ptx_code(ptx: str) -> str:
    """The PTX without debug info: source locations and debug sections change with any edit of the
    file; the instructions are what a "same bits" refactor must keep."""
    ptx = re.sub(r"\.section\s+\.debug\w*\s*\{.*?\n\s*\}", "", ptx, flags=re.S)
    keep = [ln for ln in ptx.splitlines() if not re.match(r"\s*(\.loc|\.file|//|\$L__)", ln)]
    return "\n".join(keep)


def global_accesses(ptx: str, kind: str) -> dict:
    """Count of each global load (kind "ld") or store ("st") instruction: its width shows whether a tile
    moves as 16-byte vectors (.v4.b32) or one 2-byte element at a time (.b16)."""
    return dict(sorted(collections.Counter(re.findall(rf"\b({kind}\.global[\w.]*)", ptx)).items()))


def mma_instructions(ptx: str) -> dict:
    """Counts of the matrix instructions (wgmma / mma families) in a PTX module."""
    return dict(sorted(collections.Counter(re.findall(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)", ptx)).items()))


def _ptxas_verbose(ptx: str):
    """ptxas -v's report of a PTX module for sm_90a, or None if ptxas is unavailable."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", src, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True)
    return out.stdout + out.stderr


def ptxas_spill_bytes(ptx: str):
    """Spill-store bytes per thread of a PTX module for sm_90a (ptxas -v), or None if unavailable."""
    m = re.search(r"(\d+) bytes spill stores", _ptxas_verbose(ptx) or "")
    return int(m.group(1)) if m else None


def ptxas_registers(ptx: str):
    """Registers per thread of a PTX module for sm_90a (ptxas -v), or None if unavailable."""
    m = re.search(r"Used (\d+) registers", _ptxas_verbose(ptx) or "")
    return int(m.group(1)) if m else None


def _t(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype)


def cases():
    """(name, kernel, args, num_warps, num_stages[, launch options]) for the kernels with GPU-unverified
    changes and a verified control (the linear_logp forward on descriptors, measured on the H200)."""
    from rlk_triton.ops import advantages as adv
    from rlk_triton.ops import linear_logp as ll
    from rlk_triton.ops import matmul as mm
    from rlk_triton.ops import rl_losses as rl
    from rlk_triton.ops import rmsnorm as rn

    bf = torch.bfloat16
    out = []
    fwd = configs.lookup_matmul("linear_logp_fwd", "sm90", bf)
    f32 = torch.float32
    h, w = _t(256, 4096), _t(1024, 4096)
    stats = dict(x_ptr=h, stride_xn=4096, w_ptr=w, stride_wv=4096,
                 x_desc=TensorDescriptor.from_tensor(h, [fwd.block_m, fwd.block_k]),
                 w_desc=TensorDescriptor.from_tensor(w, [fwd.block_n, fwd.block_k]), bias_ptr=w,
                 target_local_ptr=_t(256, dtype=torch.int32), N=256, H=4096, V_local=1024, inv_t=1.0,
                 n_progs=132, HAS_BIAS=False, UPCAST=False, IEEE=False, EVEN_K=True, BLOCK_M=fwd.block_m,
                 BLOCK_N=fwd.block_n, BLOCK_K=fwd.block_k, GROUP_M=fwd.group_m, DESC=True)
    stats.update(saved_ptr=_t(256, 1024, dtype=torch.float16), stride_sn=1024)
    out.append(("linear_logp _tile_stats_kernel (descriptors)", ll._tile_stats_kernel,
                dict(stats, stats_ptr=_t(5, 4, 256, dtype=f32), n_tiles=4, save_cols=0, WITH_ENTROPY=True, SAVE=False),
                fwd.num_warps, fwd.num_stages))
    out.append(("linear_logp _tile_stats_kernel (descriptors, saved logits)", ll._tile_stats_kernel,
                dict(stats, stats_ptr=_t(5, 4, 256, dtype=f32), n_tiles=4, save_cols=512, WITH_ENTROPY=True, SAVE=True),
                fwd.num_warps, fwd.num_stages))
    dl = configs.lookup_matmul("linear_logp_dlogits", "sm90", bf)
    x = _t(256, dtype=f32)
    out.append(("linear_logp _dlogits_kernel (descriptors)", ll._dlogits_kernel,
                dict(stats, row_max_ptr=x, row_logsum_ptr=x, entropy_ptr=x, grad_logp_ptr=x, grad_entropy_ptr=x,
                     d_ptr=_t(256, 1024), stride_dn=1024, dbias_part_ptr=x, stride_pb=0, c0=0, chunk_width=1024,
                     WITH_ENTROPY_GRAD=True, BLOCK_M=dl.block_m, BLOCK_N=dl.block_n, BLOCK_K=dl.block_k,
                     GROUP_M=dl.group_m), dl.num_warps, dl.num_stages))
    out.append(("linear_logp _dlogits_saved_kernel", ll._dlogits_saved_kernel,
                dict(saved_ptr=_t(256, 1024, dtype=torch.float16), stride_sn=1024, tile_max_ptr=_t(4, 256, dtype=f32),
                     target_local_ptr=_t(256, dtype=torch.int32), row_max_ptr=x, row_logsum_ptr=x, entropy_ptr=x,
                     grad_logp_ptr=x, grad_entropy_ptr=x, d_ptr=_t(256, 1024), stride_dn=1024, dbias_part_ptr=x,
                     stride_pb=0, N=256, c0=0, chunk_width=1024, inv_t=1.0, HAS_BIAS=False, WITH_ENTROPY_GRAD=True,
                     BLOCK_M=dl.block_m, BLOCK_N=dl.block_n, PIECES=8), dl.num_warps, 1))
    # the persistent matmul: linear_logp's d hidden (fp32 accumulator), a linear layer (b = weight.t())
    # and linear_logp's d weight (a = d_logits.t())
    fold = configs.lookup_matmul("linear_logp_dlogits", "sm90", bf).chunk_v
    for label, kernel_key, b_t, out_dtype, acc, fold_k, *a_t in (
            ("d hidden tiles, fp32 accumulator", "linear_logp_dhidden", False, f32, True, 0),
            ("d hidden tiles, vocab chunks folded (FOLD_K), fp32 accumulator", "linear_logp_dhidden", False, f32,
             True, fold),
            ("d hidden tiles, a first pass's first chunk (no C_in), fp32 out", "linear_logp_dhidden", False, f32,
             False, 0),
            ("matmul tiles, b = weight.t() (B_T), bf16 out", "matmul", True, bf, False, 0),
            ("matmul tiles, a = d_logits.t() (A_T), bf16 out", "matmul", False, bf, False, 0, True)):
        cfg = configs.lookup_matmul(kernel_key, "sm90", bf)
        a_op, b_op = _t(256, 4096), _t(4096, 4096)
        a_block = [cfg.block_k, cfg.block_m] if a_t else [cfg.block_m, cfg.block_k]
        b_block = [cfg.block_n, cfg.block_k] if b_t else [cfg.block_k, cfg.block_n]
        out.append((f"matmul _matmul_desc_kernel, {label}", mm._matmul_desc_kernel,
                    dict(a_desc=TensorDescriptor.from_tensor(a_op.t().contiguous() if a_t else a_op, a_block),
                         b_desc=TensorDescriptor.from_tensor(b_op, b_block),
                         c_in_ptr=_t(256, 4096, dtype=out_dtype), stride_cm=4096,
                         out_ptr=_t(256, 4096, dtype=out_dtype), stride_om=4096,
                         bias_ptr=_t(4096, dtype=out_dtype), M=256, N=4096, K=4096, n_progs=132,
                         ACCUMULATE=acc, HAS_BIAS=not acc and out_dtype == bf, UPCAST=False, IEEE=False, B_T=b_t,
                         BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                         FOLD_K=fold_k, **({"A_T": True} if a_t else {})),
                    cfg.num_warps, cfg.num_stages))
    for ent in (True, False):  # both step sizes (16 / 32 tiles' states live in registers): their spills reported
        out.append((f"linear_logp _merge_kernel entropy={ent} (n_chunks not specialized)", ll._merge_kernel,
                    dict(stats_ptr=_t(5, 1, 256, dtype=f32), target_ptr=_t(256, dtype=torch.int64),
                         logp_ptr=_t(256, dtype=f32), entropy_ptr=_t(256, dtype=f32), row_max_ptr=_t(256, dtype=f32),
                         row_logsum_ptr=_t(256, dtype=f32), N=256, n_chunks=7, ignore_index=-100, WITH_ENTROPY=ent,
                         BLOCK=ll.MERGE_BLOCK, TILES=ll.MERGE_TILES[ent]), ll.MERGE_WARPS, 1))
    rows = configs.lookup_fixed("rl_policy_loss_rows", "sm90")
    x = _t(64, 8192, dtype=f32)
    token = dict(logp_ptr=x, old_ptr=x, adv_ptr=x, mask_ptr=_t(64, 8192, dtype=torch.uint8), ref_ptr=x, ent_ptr=x,
                 roll_ptr=x, per_token_ptr=x, T=8192, clip_lo=0.8, clip_hi=1.2, dual_c=3.0, kl_coef=0.1,
                 ent_coef=0.0, tis_cap=2.0, lr_clamp=20.0, ADV_PER_ROW=False, CISPO=False, DUAL_CLIP=True, HAS_KL=True,
                 KL_EST=3, HAS_ENTROPY=False, TIS_MODE=1, TIS_PG=True, HAS_LR_CLAMP=True, BLOCK_T=rows.block_v)
    ns = rl.N_ROW_STATS
    out.append(("rl _policy_loss_rows_kernel (refactored onto _policy_tile_sums)", rl._policy_loss_rows_kernel,
                dict(token, row_stats_ptr=_t(64, ns, dtype=f32)), rows.num_warps, rows.num_stages))
    out.append(("rl _policy_loss_tiles_kernel", rl._policy_loss_tiles_kernel,
                dict(token, tile_stats_ptr=_t(64, 8, ns, dtype=f32)), rows.num_warps, rows.num_stages))
    fold = configs.lookup_fixed("rl_policy_loss_batch", "sm90")
    out.append(("rl _policy_loss_fold_kernel", rl._policy_loss_fold_kernel,
                dict(tile_stats_ptr=_t(64, 8, ns, dtype=f32), row_stats_ptr=_t(64, ns, dtype=f32), B=64, n_tiles=8,
                     BLOCK_B=fold.block_v), fold.num_warps, 1))
    # ratio_kl's backward with an output's gradient absent (None: a zero tile in the kernel)
    c = configs.lookup_fixed("rl_ratio_kl_bwd", "sm90")
    for tag, g in (("", x), (" (only kl's gradient)", None)):
        out.append((f"rl_losses _ratio_kl_bwd_kernel{tag}", rl._ratio_kl_bwd_kernel,
                    dict(g_lr_ptr=g, g_ratio_ptr=g, g_kl_ptr=x, logp_ptr=x, old_ptr=x, ref_ptr=x,
                         mask_ptr=token["mask_ptr"], grad_ptr=x, T=8192, clamp=20.0, HAS_MASK=True, HAS_CLAMP=False,
                         HAS_REF=True, KL_EST=2, BLOCK_T=c.block_v), c.num_warps, c.num_stages))
    # GAE writes its rows' tails itself (no zero fill), and takes no bootstrap tensor as 0
    c = configs.lookup_fixed("gae", "sm90")
    for tag, boot in (("", _t(64, dtype=f32)), (" (no bootstrap values)", None)):
        out.append((f"advantages _gae_kernel{tag}", adv._gae_kernel,
                    dict(rew_ptr=x, val_ptr=x, mask_ptr=token["mask_ptr"], boot_ptr=boot, adv_ptr=x, ret_ptr=x, T=8192,
                         stride_row=8192, gamma=0.99, lam=0.95, BLOCK_T=c.block_v), c.num_warps, c.num_stages))
    for H in (4096, 8192):
        cfg = configs.lookup("rmsnorm_fwd", "sm90", bf, H)
        block = rn.hidden_tile(cfg, H)
        for r in (2, 4):
            y = _t(16, H)
            out.append((f"rmsnorm _fwd_rows_kernel H={H} rows={r}", rn._fwd_rows_kernel,
                        dict(x_ptr=y, x_row_stride=H, res_ptr=y, res_row_stride=H, w_ptr=_t(H), y_ptr=y, res_out_ptr=y,
                             rstd_ptr=_t(16, dtype=f32), N=16, H=H, h_count=float(H), eps=1e-6, weight_offset=0.0,
                             HAS_RESIDUAL=True, BLOCK_H=block, ROWS=r, STORE_RSTD=True), cfg.num_warps, 1))
    out += attention_cases()
    return out


def attention_cases():
    """The attention kernels at D = 128, bf16, with their locked sm90 configs; the plain decode step; and
    candidates for the GPU's sweeps (dk / dv scores_t, the D = 64 forward's and dq's register cap)."""
    from rlk_triton.ops import attention as at

    bf, f32, i32 = torch.bfloat16, torch.float32, torch.int32
    N, Hq, Hkv, D = 1024, 16, 8, 128
    lse, cu = _t(Hq, N, dtype=f32), _t(3, dtype=i32)

    def heads(d):
        """q-shaped and k-shaped tensors of head dim d, and the common arguments of both passes."""
        q, kv = _t(N, Hq, d), _t(N, Hkv, d)
        return q, kv, dict(q_ptr=q, k_ptr=kv, v_ptr=kv, lse_ptr=lse, cu_ptr=cu, sq_t=Hq * d, sq_h=d, sk_t=Hkv * d,
                           sk_h=d, sv_t=Hkv * d, sv_h=d, slse_h=N, qk_scale=0.1, N=N, GROUP=Hq // Hkv, HEAD_DIM=d,
                           CAUSAL=True, UPCAST=False, IEEE=False)

    def fwd_args(d, f, tma_loads, flat):
        q, kv, common = heads(d)
        desc = TensorDescriptor(kv, [N, Hkv * d], [Hkv * d, 1], [f.block_n, d]) if tma_loads else kv
        return dict(common, k_desc=desc, v_desc=desc, out_ptr=q, so_t=Hq * d, so_h=d, m_st_ptr=lse, l_st_ptr=lse,
                    acc_st_ptr=q, s_st_h=N, sacc_t=Hq * d, sacc_h=d, kv_lo=0, kv_hi=N, STATE_IN=False,
                    STATE_OUT=False, BLOCK_M=f.block_m, BLOCK_N=f.block_n, TMA=tma_loads, FLAT=flat,
                    HEAVY_FIRST=f.heavy_first)

    def bwd_args(d):
        """Both backward kernels' arguments (each takes its own): dq / dk / dv written over the inputs."""
        q, kv, common = heads(d)
        return dict(common, do_ptr=q, delta_ptr=lse, dq_ptr=q, dk_ptr=kv, dv_ptr=kv, sdo_t=Hq * d, sdo_h=d,
                    sdq_t=Hq * d, sdq_h=d, sdk_t=Hkv * d, sdk_h=d, sdv_t=Hkv * d, sdv_h=d, scale=0.07,
                    split_min_len=1)

    rows = []
    f = configs.lookup_attention("attention_fwd", "sm90", bf, D)
    for tma_loads, flat in ((f.tma_loads, f.flat), (not f.tma_loads, f.flat), (f.tma_loads, not f.flat)):
        # the locked row, then each load / schedule option flipped (configs: the same tiles either way)
        tag = "" if (tma_loads, flat) == (f.tma_loads, f.flat) else f" (tma_loads={tma_loads}, flat={flat})"
        rows.append((f"attention _fwd_kernel{tag}", at._fwd_kernel, fwd_args(D, f, tma_loads, flat),
                     f.num_warps, f.num_stages))
    # D 64: the forward uncapped and with configs maxnreg_d64 (two programs per SM; locked at 128)
    f64 = configs.lookup_attention("attention_fwd", "sm90", bf, 64)
    for cap in sorted({0, 128, f64.maxnreg_d64}):
        rows.append(("attention _fwd_kernel D=64" + (f" (maxnreg={cap})" if cap else ""), at._fwd_kernel,
                     fwd_args(64, f64, f64.tma_loads, f64.flat), f64.num_warps, f64.num_stages,
                     {"maxnreg": cap} if cap else {}))
    d = configs.lookup_decode("sm90", bf, D)
    q, _, _ = heads(D)
    cache = _t(64, 256, Hkv, D)
    rows.append(("attention _decode_kernel", at._decode_kernel,
                 dict(q_ptr=q, kc_ptr=cache, vc_ptr=cache, out_ptr=q, lse_ptr=lse, cuq_ptr=cu, kvlen_ptr=cu,
                      bt_ptr=_t(2, 32, dtype=i32), sq_t=Hq * D, sq_h=D, skc_p=256 * Hkv * D, skc_s=Hkv * D, skc_h=D,
                      svc_p=256 * Hkv * D, svc_s=Hkv * D, svc_h=D, so_t=Hq * D, so_h=D, slse_h=N, sbt_b=32,
                      page_size=256, qk_scale=0.1, n_q=N, n_pages=64, max_pages=32, GROUP=Hq // Hkv, HEADS=Hq // Hkv, HEAD_DIM=D, UPCAST=False, IEEE=False,
                      BLOCK_M=d.block_m, BLOCK_N=d.block_n, PAGE_AHEAD=d.page_ahead), d.num_warps, d.num_stages))
    # a decode step without offsets (one new token per sequence: cuq_ptr None, a constexpr branch)
    rows.append(("attention _decode_kernel (one token per sequence)", at._decode_kernel,
                 dict(rows[-1][2], cuq_ptr=None), d.num_warps, d.num_stages))
    # dk / dv: the locked row, and the transposed scores (configs scores_t) on 128-key tiles with 8 warps,
    # for the GPU's tile sweep to time: 64 query rows with 1 stage (no prefetch of the next q / dO) and
    # 2, and 32 rows with 2; beside them the first tile untransposed, and D 256's locked tile both ways
    locked_kv = configs.lookup_attention("attention_bwd_dkdv", "sm90", bf, D)
    variants = [(locked_kv, "", D)] + [
        (dataclass_replace(locked_kv, block_m=bm, block_n=128, num_warps=8, num_stages=st, scores_t=t),
         f" ({'scores_t' if t else 'untransposed'}, {bm} x 128 tiles, 8 warps, {st} stage{'s' if st > 1 else ''})", D)
        for bm, st, t in ((64, 1, True), (64, 2, True), (32, 2, True), (64, 1, False))]
    kv256 = configs.lookup_attention("attention_bwd_dkdv", "sm90", bf, 256)
    variants += [(dataclass_replace(kv256, scores_t=t), f" D=256{' (scores_t)' if t else ''}", 256)
                 for t in sorted({kv256.scores_t, True})]
    for split in (False, True):  # the table's rows (off), and the whole-block loops a row may turn on
        tag = " (whole blocks unmasked)" if split else ""
        for c, ctag, hd in variants:
            if ctag and c == locked_kv:  # a candidate the table took: its row is the first
                continue
            rows.append((f"attention _bwd_dkdv_kernel{tag}{ctag}", at._bwd_dkdv_kernel,
                         dict(bwd_args(hd), BLOCK_M=c.block_m, BLOCK_N=c.block_n, SPLIT=split, SCORES_T=c.scores_t),
                         c.num_warps, c.num_stages))
        c = configs.lookup_attention("attention_bwd_dq", "sm90", bf, D)
        rows.append((f"attention _bwd_dq_kernel{tag}", at._bwd_dq_kernel,
                     dict(bwd_args(D), BLOCK_M=c.block_m, BLOCK_N=c.block_n, SPLIT=split, HEAVY_FIRST=c.heavy_first),
                     c.num_warps, c.num_stages))
        # D 64's dq uncapped and with configs maxnreg_d64 128 (two programs per SM), for the levers run
        c = configs.lookup_attention("attention_bwd_dq", "sm90", bf, 64)
        for cap in sorted({0, 128, c.maxnreg_d64}):
            rows.append((f"attention _bwd_dq_kernel{tag} D=64" + (f" (maxnreg={cap})" if cap else ""),
                         at._bwd_dq_kernel, dict(bwd_args(64), BLOCK_M=c.block_m, BLOCK_N=c.block_n, SPLIT=split,
                                                 HEAVY_FIRST=c.heavy_first),
                         c.num_warps, c.num_stages, {"maxnreg": cap} if cap else {}))
    return rows


def mma_families(mma: dict) -> list:
    """The instruction families of an mma count: the instruction with its N size dropped (a wgmma tile
    of 64 or 256 columns is one family; mma.sync vs wgmma, the K step or the operand types are not)."""
    return sorted({re.sub(r"n\d+k", "nNk", name) for name in mma})


def class_cases():
    """Every member of the sm90 bf16 bit classes (configs.BIT_CLASSES), with its class: each must
    compile to MMA families that the class lists (the families the GPU gate proved bit-equal)."""
    from rlk_triton.ops import attention as at
    from rlk_triton.ops import matmul as mm

    f32, i32 = torch.float32, torch.int32
    out = []
    for cls in configs.BIT_CLASSES:
        if cls.reference[1] != "sm90" or cls.reference[2] != "bfloat16" or cls.reference[3] == "d256":
            continue
        for key in cls.members:
            cfg = configs.LOCKED_CONFIGS[key]
            name = f"class {cls.name}: {key[0]} [{key[3]}]"
            if key[0] == "matmul":
                M, N, K = 64, 4096, 4096
                a_op, w = _t(M, K), _t(N, K)
                if cfg.persistent_tma:
                    args = dict(a_desc=TensorDescriptor.from_tensor(a_op, [cfg.block_m, cfg.block_k]),
                                b_desc=TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k]),
                                c_in_ptr=_t(M, N), stride_cm=N, out_ptr=_t(M, N), stride_om=N, bias_ptr=_t(N),
                                M=M, N=N, K=K, n_progs=132, ACCUMULATE=False, HAS_BIAS=False, UPCAST=False,
                                IEEE=False, B_T=True, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                                BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m)
                    out.append((cls, name + " (descriptors)", mm._matmul_desc_kernel, args, cfg.num_warps,
                                cfg.num_stages))
                else:
                    args = dict(a_ptr=a_op, stride_am=K, stride_ak=1, b_ptr=w, stride_bk=1, stride_bn=K,
                                c_in_ptr=_t(M, N), stride_cm=N, stride_cn=1, out_ptr=_t(M, N), stride_om=N,
                                stride_on=1, bias_ptr=_t(N), M=M, N=N, K=K, ACCUMULATE=False, HAS_BIAS=False,
                                UPCAST=False, IEEE=False, EVEN_K=True, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                                BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m)
                    out.append((cls, name + " (pointers)", mm._matmul_kernel, args, cfg.num_warps, cfg.num_stages))
            elif key[0] == "attention_decode":
                Hq, Hkv, D, N = 16, 8, 128, 64
                q, lse, cu, cache = _t(N, Hq, D), _t(Hq, N, dtype=f32), _t(65, dtype=i32), _t(64, 256, Hkv, D)
                group = Hq // Hkv
                args = dict(q_ptr=q, kc_ptr=cache, vc_ptr=cache, out_ptr=q, lse_ptr=lse, cuq_ptr=cu, kvlen_ptr=cu,
                            bt_ptr=_t(64, 32, dtype=i32), sq_t=Hq * D, sq_h=D, skc_p=256 * Hkv * D, skc_s=Hkv * D,
                            skc_h=D, svc_p=256 * Hkv * D, svc_s=Hkv * D, svc_h=D, so_t=Hq * D, so_h=D, slse_h=N,
                            sbt_b=32, page_size=256, qk_scale=0.1, n_q=1024, n_pages=64, max_pages=32, GROUP=group, HEADS=at.decode_heads(cfg, group),
                            HEAD_DIM=D, UPCAST=False, IEEE=False, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, PAGE_AHEAD=cfg.page_ahead)
                out.append((cls, name, at._decode_kernel, args, cfg.num_warps, cfg.num_stages))
    return out


def dataclass_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="write the rows as JSON")
    ap.add_argument("--baseline", help="an earlier --out report: say per kernel whether its PTX is the same")
    args = ap.parse_args()
    before = {}
    if args.baseline:
        with open(args.baseline) as f:
            before = {r["kernel"]: r.get("ptx_sha256") for r in json.load(f)["rows"]}
    rows, ok = [], True
    for name, kernel, kargs, warps, stages, *options in cases():  # options: other launch options (maxnreg)
        try:
            shared, spills, ptx, err = compile_for_sm90(kernel, kargs, warps, stages, **(options[0] if options else {}))
        except Exception:  # noqa: BLE001 - a broken case is a failure of the check, reported
            shared, spills, ptx, err = None, None, None, traceback.format_exc()[-600:]
        fits = shared is not None and shared <= H200_SMEM_PER_BLOCK
        ok &= fits
        digest = hashlib.sha256(ptx_code(ptx).encode()).hexdigest() if ptx else None
        mma = mma_instructions(ptx) if ptx else None
        rows.append({"kernel": name, "num_warps": warps, "num_stages": stages, "shared_bytes": shared,
                     "spill_store_bytes": spills, "registers": ptxas_registers(ptx) if ptx else None,
                     "fits_h200": fits, "ptx_sha256": digest, "mma": mma,
                     "global_loads": global_accesses(ptx, "ld") if ptx else None,
                     "global_stores": global_accesses(ptx, "st") if ptx else None, "error": err})
        same = "" if name not in before else ("  SAME PTX" if before[name] == digest else "  CHANGED PTX")
        print(f"{'OK ' if fits else 'BAD'} {name}: shared {shared} B, spill stores {spills} B, mma {mma}{same}"
              + (f"  {err}" if err else ""), flush=True)
    for cls, name, kernel, kargs, warps, stages in class_cases():
        try:
            shared, spills, ptx, err = compile_for_sm90(kernel, kargs, warps, stages)
        except Exception:  # noqa: BLE001
            shared, spills, ptx, err = None, None, None, traceback.format_exc()[-600:]
        fams = mma_families(mma_instructions(ptx)) if ptx else []
        outside = sorted(set(fams) - set(cls.families))
        fits = shared is not None and shared <= H200_SMEM_PER_BLOCK and not outside
        ok &= fits
        rows.append({"kernel": name, "class": cls.name, "num_warps": warps, "num_stages": stages,
                     "shared_bytes": shared, "spill_store_bytes": spills, "fits_h200": fits,
                     "mma_families": fams, "outside_class_families": outside, "error": err})
        print(f"{'OK ' if fits else 'BAD'} {name}: shared {shared} B, spill stores {spills} B, families {fams}"
              + (f"  OUTSIDE the class's {list(cls.families)}" if outside else "") + (f"  {err}" if err else ""),
              flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"triton": triton.__version__, "target": "cuda sm90", "smem_limit": H200_SMEM_PER_BLOCK,
                       "jit_specialization": _JIT_SPECIALIZED[0], "rows": rows}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
