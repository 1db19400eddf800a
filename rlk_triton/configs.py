"""The locked launch configs: one table, no autotune.

A config is a pure function of (kernel, arch, dtype, shape bucket). For most kernels the bucket is
of a non-batch dim (V, hidden, head dim), so a row is computed by the same code, with the same
reduction tree, whatever batch it is in. Two kernels also have buckets of the rows (the matmul's M,
the decode's (sequence, kv head) pairs), because small batches want other tiles; those configs are
members of a BIT CLASS (BIT_CLASSES): a set of configs claimed to give every element the same bits as
the class's reference config, because they keep its reduction order (the K order of a dot, the KV block
of attention) and change only tiling, warps, stages and scheduling. The claim is proved per build on
the GPU (tests/test_config_classes.py, torch.equal); a config whose bits differ cannot be a member.
The table is data: its fingerprint (hash of the table, the classes, the triton version and the arch)
names a build, and docs/configs.md is generated from it.
"""
from __future__ import annotations

import dataclasses
import functools

import hashlib
import json
from dataclasses import asdict, dataclass

import torch
import triton

from ._runtime import default_arch


@dataclass(frozen=True)
class LaunchConfig:
    block_v: int  # vocab elements per tile: the unit of the fixed tile order
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class MatmulConfig:
    """Tiles of a tl.dot kernel. Never a function of M (the token count) and never split-K, so an
    output row is computed by the same instructions whatever the batch: rows are batch-invariant."""
    block_m: int
    block_n: int
    block_k: int  # the K loop walks K in ascending steps of block_k: the reduction order
    group_m: int  # L2 swizzle of the launch grid: changes which program runs when, never the math
    num_warps: int
    num_stages: int
    chunk_v: int = 0  # linear_logp backward: the vocab chunk of d hidden's accumulation; 0 = unused
    # linear_logp backward: vocab chunks per pass. The d logits of that many chunks are written at
    # once and d hidden folds them in one launch (matmul FOLD_K): the bits of one pass per chunk,
    # without the fp32 d hidden round trip between chunks; costs N x chunk_v x chunks_per_pass x 2 bytes.
    chunks_per_pass: int = 1
    # linear_logp backward: the most bytes one pass's d logits may take (0 = no cap). A call with many
    # rows takes fewer chunks per pass, never fewer than one. Any count gives the same bits (above), so
    # it may follow the rows; this caps the workspace at large N instead of letting it grow with N.
    pass_workspace_max: int = 0
    # linear_logp's fused kernels: persistent programs (one per SM, tiles in grid order) reading the
    # operands through TMA tensor descriptors (matmul.dot_tile_desc). It changes how tiles are
    # loaded and scheduled, never a tile's K order: results are bitwise those of the pointer path.
    persistent_tma: bool = False
    # attention_decode: q heads per program, a divisor of the GQA group; 0 = the whole group (the kv
    # head's K / V read once for all of its q heads). Which rows share a tile, never a row's math.
    q_heads: int = 0
    # attention_decode: read the next KV block's page id one block ahead, so that the K / V loads do
    # not wait on it and pipeline (prefill chunks: 1.15x faster on the H200); decode steps, bound by
    # the cache read, are faster without. Which address is read when, never a row's math.
    page_ahead: bool = False
    # attention backward: sequences at least this long fold the blocks that every row / key of a tile
    # sees whole in a loop without the mask, before (dq) or after (dk / dv) the masked ones, in the
    # same ascending order; 0 = off (every block masked). Same bits as the masked loop (tests/
    # test_attention.py, on the interpreter and the H200; on the H200 also every shape of
    # docs/reports/h200-attention-split-thresholds-2026-12-04.json), so a speed choice.
    split_min_len: int = 0
    # attention forward: the K / V blocks read through TMA descriptors over [tokens, kv heads x D]
    # (sm90; 2-byte K / V with a head stride of D, else the pointer loads). Which unit moves the same
    # bytes, never a row's math: the same bits (tests/test_attention.py). The backward stays on
    # pointers: dkdv's q / dO through TMA were 1.26-1.54x slower, dq's K / V no faster (H200,
    # docs/reports/h200-attention-tma-2026-12-04.json).
    tma_loads: bool = False
    # attention forward: one query tile per program in a straight line, the grid-stride loop kept only
    # for tiles past the grid (a max_seqlen shorter than a sequence). The same tiles in the same order.
    flat: bool = False
    # attention forward and dq: the grid's query tiles in reverse order (program 0 takes the grid's
    # last tile), so the longest causal rows start first and the short ones fill the tail. Which
    # program runs a tile, never the tile's math. (dk / dv's longest KV blocks are its first already.)
    heavy_first: bool = False
    # attention dk / dv: the score tiles computed transposed (k @ q^T), so that p^T and ds^T feed the
    # dv / dk updates straight from their MMAs instead of through a shared-memory transpose. The same
    # products laid out the other way (another MMA operand order: the GPU's bits are the sweep's to
    # check). ptxas (triton 3.6, sm90, D 128): 128-key blocks with 8 warps, 1 stage spill 4 B / thread
    # this way against 640 untransposed; at D 256's 128 x 64 tiles 1368 against 112
    # (docs/reports/aot-sm90-2026-12-05.json).
    scores_t: bool = False
    # attention forward at head dims <= 64: ptxas's register cap per thread (0: the compiler's choice).
    # The D 64 forward uses 161 registers, one 8-warp program per SM; capped at 128 (the same PTX but
    # for the .maxnreg line, 36 B of spills: docs/reports/aot-sm90-2026-12-05.json) two fit, so one
    # program's softmax runs beside the other's MMAs. Larger heads keep the compiler's choice: D 128
    # (223 registers, 129 KB of shared memory) has no room for a second program, and capped it ran
    # 0.79x; D 256 does not compile under 128 (docs/reports/h100-attention-fwd-levers-2026-12-05.json).
    # The dq kernel takes the same field, 128 in the sm90 2-byte d<=128 row: at D 64 it uses 170
    # registers uncapped (216 with the whole-block loops), one program per SM; capped at 128, 64 (80) B
    # of spills and two programs per SM (82 KB of shared memory each): the D 64 backward 1.05x, the
    # same bits (docs/reports/h100-attention-levers-2026-12-05.json).
    maxnreg_d64: int = 0


# V buckets, by their upper bound (inclusive). The last bucket is open.
V_BUCKETS = (1024, 8192, None)

_DTYPES = ("bfloat16", "float16", "float32")


# Row buckets (upper bounds, inclusive; the last is open). Matmul: M, the rows of a launch. Decode:
# the (sequence, kv head) pairs of a step, the programs of the whole-group layout, and the query rows
# per pair (max_seqlen_q x the GQA group: a decode step has a few, a prefill chunk many). The
# matmul's small-M tiles also depend on N (a weight dim, not the batch): how many programs a row of
# tiles makes.
M_BUCKETS = (1, 16, 64, 256, None)
N_BUCKETS = (4096, None)
PAIR_BUCKETS = (64, None)
Q_BUCKETS = (64, None)


def _row_bucket(prefix, bounds, n):
    for hi in bounds:
        if hi is None or n <= hi:
            return f"{prefix}>{bounds[-2]}" if hi is None else f"{prefix}<={hi}"
    raise AssertionError("unreachable: the last bucket is open")


def m_bucket(M: int, N: int | None = None) -> str:
    """The matmul's bucket: of M, and with N given, "m...,n..." (the table's keys)."""
    m = _row_bucket("m", M_BUCKETS, M)
    return m if N is None else f"{m},{_row_bucket('n', N_BUCKETS, N)}"


def pair_bucket(pairs: int, q_rows: int | None = None) -> str:
    """attention_decode's bucket: of the pairs, and with q_rows given, "pairs...,q..." (the table's)."""
    p = _row_bucket("pairs", PAIR_BUCKETS, pairs)
    return p if q_rows is None else f"{p},{_row_bucket('q', Q_BUCKETS, q_rows)}"


M_BUCKET_NAMES = tuple(m_bucket(m if m is not None else M_BUCKETS[-2] + 1, n if n is not None else N_BUCKETS[-2] + 1)
                       for m in M_BUCKETS for n in N_BUCKETS)  # the last one: the class reference's
PAIR_BUCKET_NAMES = tuple(pair_bucket(p if p is not None else PAIR_BUCKETS[-2] + 1, q if q is not None else Q_BUCKETS[-2] + 1)
                          for p in PAIR_BUCKETS for q in Q_BUCKETS)


def _bucket_name(v_max):
    return "v>8192" if v_max is None else f"v<={v_max}"


# (kernel, arch, dtype, bucket) -> LaunchConfig.
# "cuda" is the row set for CUDA archs without rows of their own (not tuned; same semantics).
# sm90 rows come from a sweep on an H200 (scripts/gpu_tune.py at b0aabeb, docs/reports/h200-tune-2026-12-02.json):
# at [16384 x 151936] bf16 one warp per row with 2048-wide tiles read the logits at 1.03x the
# copy rate (2-4 warps: 0.92-1.04x; 8 warps: 0.70x); the backward peaked at 2048-wide tiles, 2 warps.
# 4-byte logits take half as wide tiles, so that a tile is the same number of bytes.
def _rows():
    t = {}
    for dt in _DTYPES:
        two_byte = dt != "float32"
        for arch in ("sm90", "cuda"):
            t[("selected_logp_fwd", arch, dt, "v<=1024")] = LaunchConfig(1024, 1, 3)
            t[("selected_logp_fwd", arch, dt, "v<=8192")] = LaunchConfig(2048 if two_byte else 1024, 1, 3)
            t[("selected_logp_fwd", arch, dt, "v>8192")] = LaunchConfig(2048 if two_byte else 1024, 1, 3)
            t[("selected_logp_bwd", arch, dt, "v<=1024")] = LaunchConfig(1024, 2, 1)
            t[("selected_logp_bwd", arch, dt, "v<=8192")] = LaunchConfig(2048 if two_byte else 1024, 2, 1)
            t[("selected_logp_bwd", arch, dt, "v>8192")] = LaunchConfig(2048 if two_byte else 1024, 2, 1)
            # The forward's vocab split (ops/selected_logp.py): block_v = CHUNK_V, the columns of one
            # (row, chunk) program, a multiple of the forward's block_v; num_warps = the merge kernel's.
            # A function of V's bucket only, so every row count folds a row the same way; a row of at
            # most 8192 columns is one chunk (the unsplit kernel's bits). V > 8192: 8192 2-byte columns
            # (4 forward tiles; fp32: 4096, the same bytes). H200, 151936 bf16 columns, with the earlier
            # sequential merge (docs/reports/h200-decode-sweep-2026-12-04.json): chunks of 16384 / 8192 /
            # 4096 took 26 / 37 / 50 us at 64 rows, dominated by that merge's ~0.65 us per chunk; the
            # one-step merge removes the chain, so the chunk is narrower (h200-decode-2026-12-04.json).
            # 4 merge warps: its state tiles compile without spills (2 warps spill; triton 3.6, sm90).
            t[("selected_logp_chunk", arch, dt, "v<=1024")] = LaunchConfig(16384 if two_byte else 8192, 4, 1)
            t[("selected_logp_chunk", arch, dt, "v<=8192")] = LaunchConfig(16384 if two_byte else 8192, 4, 1)
            t[("selected_logp_chunk", arch, dt, "v>8192")] = LaunchConfig(8192 if two_byte else 4096, 4, 1)
        # The interpreter pays about 1 ms per program-iteration: few, wide tiles.
        for kernel in ("selected_logp_fwd", "selected_logp_bwd"):
            t[(kernel, "interpreter", dt, "v<=1024")] = LaunchConfig(1024, 4, 1)
            t[(kernel, "interpreter", dt, "v<=8192")] = LaunchConfig(8192, 4, 1)
            t[(kernel, "interpreter", dt, "v>8192")] = LaunchConfig(16384, 4, 1)
        # Interpreter chunks: two forward tiles, so that CPU tests past 32768 columns cover several
        # chunks, a chunk of several tiles and a partial last chunk (V <= 8192 is always one chunk).
        t[("selected_logp_chunk", "interpreter", dt, "v<=1024")] = LaunchConfig(2048, 4, 1)
        t[("selected_logp_chunk", "interpreter", dt, "v<=8192")] = LaunchConfig(16384, 4, 1)
        t[("selected_logp_chunk", "interpreter", dt, "v>8192")] = LaunchConfig(32768, 4, 1)
    # Per-token RL kernels over fp32 [B, T] (block_v = the tile of the dim a program streams: tokens
    # of a row, rows of the batch, members of a group). One bucket: they never depend on B or T.
    # The "cuda" rows are untuned defaults; the interpreter rows keep tests cheap.
    rl = {  # kernel: (cuda block, cuda warps, interpreter block, interpreter warps)
        "rl_ratio_kl_fwd": (1024, 4, 256, 4), "rl_ratio_kl_bwd": (1024, 4, 256, 4),
        "rl_policy_loss_rows": (1024, 4, 256, 4), "rl_policy_loss_batch": (1024, 4, 64, 4),
        "rl_policy_loss_bwd": (1024, 4, 256, 4),
        "gae": (1024, 4, 512, 1), "group_stats": (256, 2, 1024, 1),
    }
    for kernel, (cb, cw, ib, iw) in rl.items():
        t[(kernel, "cuda", "float32", "any")] = LaunchConfig(cb, cw, 1)
        t[(kernel, "interpreter", "float32", "any")] = LaunchConfig(ib, iw, 1)
    # policy_loss's row sums: block_v = 1 runs (row, tile) programs and an in-order fold (the same
    # bits as one program per row, B x tiles programs instead of B). On the H200 at [64 x 8192] the
    # fwd+bwd device time goes from 0.061 to 0.037 ms (docs/reports/h200-round4-2026-12-03.json).
    t[("rl_policy_loss_split", "cuda", "float32", "any")] = LaunchConfig(1, 1, 1)
    t[("rl_policy_loss_split", "interpreter", "float32", "any")] = LaunchConfig(1, 1, 1)
    # RoPE and embedding (rlk_triton/ops/rope.py, embedding.py). block_v = (token, head) rows per
    # program for "rope" (bucket: head_dim), hidden columns per program for the embedding kernels
    # (bucket: hidden size). The math is elementwise or per-id, so the tile never changes a result;
    # never a function of the token count. "cuda" rows are untuned defaults.
    positional = {  # kernel: (cuda block, cuda warps, interpreter block)
        "rope": (32, 4, 256), "embedding_fwd": (1024, 4, 4096), "embedding_bwd": (1024, 4, 4096),
    }
    for kernel, (cb, cw, ib) in positional.items():
        for dt in _DTYPES:
            for v_max in V_BUCKETS:
                t[(kernel, "cuda", dt, _bucket_name(v_max))] = LaunchConfig(cb, cw, 1)
                t[(kernel, "interpreter", dt, _bucket_name(v_max))] = LaunchConfig(ib, 4, 1)
    # RMSNorm and SwiGLU (rlk_triton/ops/rmsnorm.py, swiglu.py); bucket: the hidden / intermediate
    # size. block_v is the widest tile over that dim (the tile is min(next_pow2(H), block_v), so a
    # row up to 16384 wide is one tile on CUDA); one row per program unless "rmsnorm_fwd_rows"
    # (block_v = rows per forward program, one-tile rows only) is > 1. "rmsnorm_dw_rows": block_v =
    # R, rows per dW partial (the fixed row partition of dW), its warps / stages unused;
    # "rmsnorm_dw_reduce": block_v = partials per lane tile (reduction.py). RMSNorm backward rows
    # (R = 64, 128 lanes, 8 warps): the H200 sweep's best common choice for H = 4096 and 8192
    # (docs/reports/h200-round2-2026-12-03.json: 0.821x / 0.834x copy); the other rows untuned.
    # Forward rows: 2 rows per program for 2-byte dtypes in the H bucket (1024, 8192], the H200 sweep's best at
    # H = 4096 and 8192 (h200-round4-2026-12-03.json: 0.887x / 0.949x copy against 0.875x / 0.925x
    # for one row, same run).
    # The interpreter rows are narrow so that tests cover several tiles, blocks and lane groups.
    for dt in _DTYPES:
        two_byte = dt != "float32"
        for v_max, (tile, warps) in zip(V_BUCKETS, ((1024, 4), (8192, 8), (16384, 16))):
            b = _bucket_name(v_max)
            t[("rmsnorm_fwd", "cuda", dt, b)] = LaunchConfig(tile, warps, 1)
            t[("rmsnorm_bwd", "cuda", dt, b)] = LaunchConfig(tile, warps, 1)
            t[("rmsnorm_fwd_rows", "cuda", dt, b)] = LaunchConfig(2 if two_byte and v_max == 8192 else 1, 1, 1)
            t[("rmsnorm_dw_rows", "cuda", dt, b)] = LaunchConfig(64, 1, 1)
            t[("rmsnorm_dw_reduce", "cuda", dt, b)] = LaunchConfig(128, 4, 2)
            t[("swiglu_fwd", "cuda", dt, b)] = LaunchConfig(2048 if two_byte else 1024, 4, 1)
            t[("swiglu_bwd", "cuda", dt, b)] = LaunchConfig(2048 if two_byte else 1024, 8, 1)
        for v_max, tile, glu_tile in zip(V_BUCKETS, (1024, 8192, 4096), (256, 1024, 4096)):
            b = _bucket_name(v_max)
            t[("rmsnorm_fwd", "interpreter", dt, b)] = LaunchConfig(tile, 4, 1)
            t[("rmsnorm_bwd", "interpreter", dt, b)] = LaunchConfig(tile, 4, 1)
            t[("rmsnorm_fwd_rows", "interpreter", dt, b)] = LaunchConfig(1, 1, 1)
            t[("rmsnorm_dw_rows", "interpreter", dt, b)] = LaunchConfig(4, 1, 1)
            t[("rmsnorm_dw_reduce", "interpreter", dt, b)] = LaunchConfig(2, 4, 1)
            t[("swiglu_fwd", "interpreter", dt, b)] = LaunchConfig(glu_tile, 4, 1)
            t[("swiglu_bwd", "interpreter", dt, b)] = LaunchConfig(glu_tile, 4, 1)
    return t


def _matmul_rows():
    """tl.dot kernels: the generic matmul and linear_logp's fused kernels. One shape bucket ("any"):
    tiles depend on (kernel, arch, dtype) only. fp32 runs as IEEE fp32 (no TF32) on CUDA cores."""
    t = {}
    for arch in ("sm90", "cuda"):
        for dt in ("bfloat16", "float16"):
            # TMA descriptors exist from sm90 (Hopper) on: the generic CUDA rows keep the pointer path.
            tma = arch == "sm90"
            # The matmul on its persistent descriptor kernel where the operands allow it: 0.98-1.06x
            # cuBLAS against 0.77-0.93x on pointers at 8192^3 and LLM shapes, the same bits
            # (docs/reports/h200-matmul6-2026-12-03.json).
            # M > 256 is the class reference: 0.98-1.06x cuBLAS at large M. Small M is memory-bound
            # (the weight read once): narrow tiles along N for more programs, long K steps, deep
            # pipelines. Same K order of k16 MMA steps, so the same bits (bit class "matmul").
            for bucket in M_BUCKET_NAMES:
                t[("matmul", arch, dt, bucket)] = _SMALL_M[arch].get(
                    bucket, MatmulConfig(128, 256, 64, 8, 8, 3, persistent_tma=tma))
            t[("linear_logp_fwd", arch, dt, "any")] = MatmulConfig(128, 256, 64, 16, 8, 3, persistent_tma=tma)
            # 16 chunks per pass up to a 1 GiB workspace (8192 rows at chunk_v 4096 in bf16; 8 at 16384 rows).
            # On the H100 at 1, 2, 4, 8 chunks per pass, fwd+bwd device time (recompute) fell at every
            # LM-head shape: 8192 x 4096 x 151936 64.4 -> 61.3 ms, 16384 x 2048 x 128256 54.5 -> 52.9,
            # 4096 x 5120 x 151936 39.7 -> 38.3 (docs/reports/h100-linear-logp-passes-2026-12-05.json); 16
            # against 8, each timing between two of the other: 1.027x at 1024 rows, 1.005x at 4096, 1.007x at
            # 8192 (x 4096 and x 8192), for up to 0.5 GiB more (8192 rows: the 1 GiB workspace against 0.5); as
            # many as the cap allows (38, 32, 16) 1.017x / 1.008x / the same config at 8192, for up to 0.75
            # GiB more (docs/reports/h100-linear-logp-2026-12-05-chunks16.json).
            # The same bits at every count. At 1024 rows the host time of 38 short passes goes too (H200:
            # 9.9 -> 8.7 ms wall, docs/reports/h200-linear-logp-passes-2026-12-04.json).
            t[("linear_logp_dlogits", arch, dt, "any")] = MatmulConfig(128, 256, 64, 8, 8, 3, chunk_v=4096,
                                                                       persistent_tma=tma, chunks_per_pass=16,
                                                                       pass_workspace_max=1 << 30)
            # d hidden += d_logits @ W_chunk: matmul's tiles on its persistent descriptor kernel
            # (matmul_into's _matmul_desc_kernel): 618 TFLOP/s against 559 on the pointer kernel, the
            # same bits (docs/reports/h200-round4-2026-12-03.json). d weight = d_logits^T @ hidden takes
            # the "matmul" row, and with it the descriptor kernel (A_T): 1.08x the pointer kernel at 1024
            # tokens, 1.03x at 8192, the same bits (H100, h100-linear-logp-gemms-2026-12-05.json).
            t[("linear_logp_dhidden", arch, dt, "any")] = MatmulConfig(128, 256, 64, 8, 8, 3, persistent_tma=tma)
        for b in M_BUCKET_NAMES:  # fp32 (IEEE FMA, not a decode dtype): one config for every M
            t[("matmul", arch, "float32", b)] = MatmulConfig(64, 64, 32, 8, 4, 2)
        t[("linear_logp_fwd", arch, "float32", "any")] = MatmulConfig(64, 64, 32, 8, 4, 2)
        t[("linear_logp_dlogits", arch, "float32", "any")] = MatmulConfig(64, 64, 32, 8, 4, 2, chunk_v=4096)
        t[("linear_logp_dhidden", arch, "float32", "any")] = MatmulConfig(64, 64, 32, 8, 4, 2)
    # The interpreter pays per program-iteration: small problems, so small tiles and chunks that
    # still give tests several chunks and several K steps.
    for dt in _DTYPES:
        # The interpreter's dot sums a K step with np.sum, whose order depends on BLOCK_K: its
        # buckets change BLOCK_M / BLOCK_N only, so CPU tests cross a bucket boundary with equal bits.
        for b in M_BUCKET_NAMES:
            small = b.split(",")[0] in ("m<=1", "m<=16")
            t[("matmul", "interpreter", dt, b)] = MatmulConfig(16 if small else 32, 32 if small else 64, 32, 4, 4, 1)
        t[("linear_logp_fwd", "interpreter", dt, "any")] = MatmulConfig(16, 64, 32, 4, 4, 1)
        t[("linear_logp_dlogits", "interpreter", dt, "any")] = MatmulConfig(16, 64, 32, 4, 4, 1, chunk_v=128)
        t[("linear_logp_dhidden", "interpreter", dt, "any")] = MatmulConfig(32, 64, 32, 4, 4, 1)
    # Attention (rlk_triton/ops/attention.py): block_m = query rows per tile, block_n = the KV block
    # of the online softmax (the reduction order), block_k = 0 (the head dim is the whole K), group_m
    # unused. Bucket: the head dim ("d<=128", "d256": a property of the model, never of the batch).
    # attention_decode MUST equal attention_fwd in block_m, block_n and num_warps: the decode path
    # then runs the training forward's tiles, so a token's out / LSE are the same bits. d<=128 bf16 /
    # fp16 rows: 1.01x / 0.95x SDPA flash on the H200 (docs/reports/h200-pending-2026-12-03.json);
    # d256 forward rows: smaller tiles so that q, the K/V stages and the fp32 accumulators fit.
    # Backward rows (dkdv, dq): a speed choice with no cross-path bit requirement, and on the H200 the
    # tiles below gave the old tiles' bits anyway (each MMA adds its k16 steps in order, whatever the
    # tile: docs/reports/h200-attention-tiles-2026-12-04.json). bf16 / fp16: d256 dkdv 128 x 64, 8 warps,
    # 1 stage and dq 128 x 32, 8 warps, 3 stages: the backward 2.54x faster than 32 x 32 tiles (24.0 ->
    # 9.5 ms at 4 x 4096, 32 / 8 heads); d<=128 dq 128 x 64, 8 warps, 3 stages: 1.06x (dkdv kept: no
    # tile beat 64 x 64, 4 warps, 2 stages). dq's row also sets the delta preprocess launch. Other
    # CUDA archs (less shared memory, untimed) and fp32 keep the first tiles.
    bwd_h200 = {"d<=128": ((64, 64, 4, 2), (128, 64, 8, 3)), "d256": ((128, 64, 8, 1), (128, 32, 8, 3))}
    bwd_first = {"d<=128": ((64, 64, 4, 2), (64, 64, 4, 2)), "d256": ((32, 32, 4, 1), (32, 32, 4, 1))}
    for arch in ("sm90", "cuda"):
        bwd_2byte = bwd_h200 if arch == "sm90" else bwd_first
        for dt, fwd, fwd256, bwd in (("bfloat16", (128, 64, 8, 3), (64, 32, 4, 2), bwd_2byte),
                                     ("float16", (128, 64, 8, 3), (64, 32, 4, 2), bwd_2byte),
                                     ("float32", (64, 32, 4, 3), (32, 32, 4, 1), bwd_first)):
            for bucket, f in (("d<=128", fwd), ("d256", fwd256)):
                # sm90 2-byte forward, measured on the H200 with the same bits as these rows: K / V through
                # TMA with the straight-line first tile (d<=128) 1.10x at 4 x 8192, 1.06x at 16 x 2048,
                # 1.08x on a 64..4096 mix (D=128), 0.98x at D=64; TMA alone 1.30x at d256 (flat: 0.98x)
                # (docs/reports/h200-attention-tma-2026-12-04.json); on, and the attention GPU tests run
                # with them (docs/reports/h200-attention-2026-12-05.json). The register cap at D <= 64
                # (two programs per SM): 1.30x at 4 x 8192, D=64, the same bits
                # (docs/reports/h100-attention-fwd-levers-2026-12-05.json).
                hopper_2byte = arch == "sm90" and dt != "float32"
                t[("attention_fwd", arch, dt, bucket)] = MatmulConfig(
                    f[0], f[1], 0, 1, f[2], f[3], tma_loads=hopper_2byte, flat=hopper_2byte and bucket == "d<=128",
                    maxnreg_d64=128 if hopper_2byte and bucket == "d<=128" else 0)
                for pairs in PAIR_BUCKET_NAMES:
                    t[("attention_decode", arch, dt, f"{bucket},{pairs}")] = _decode_row(arch, dt, bucket, pairs, f)
                # split_min_len 2048 on the H200 (bf16 / fp16): backward 1.10x at 4 x 8192, 1.13x at D=64,
                # 1.05x at D=256, 1.02x on a 64..4096 mix, 1.01x at 16 x 2048; at 1024 it costs 10% at
                # 64 x 1024 (h200-attention-split-thresholds-2026-12-04.json)
                split = 2048 if arch == "sm90" and dt != "float32" else 0
                # dq's register cap at D <= 64 (two programs per SM): the D 64 backward 9.20 -> 8.74 ms
                # (1.05x) at 4 x 8192, the same bits (docs/reports/h100-attention-levers-2026-12-05.json)
                for kernel, b in zip(("attention_bwd_dkdv", "attention_bwd_dq"), bwd[bucket]):
                    cap = 128 if kernel == "attention_bwd_dq" and hopper_2byte and bucket == "d<=128" else 0
                    t[(kernel, arch, dt, bucket)] = MatmulConfig(b[0], b[1], 0, 1, b[2], b[3], split_min_len=split,
                                                                 maxnreg_d64=cap)
    for dt in _DTYPES:  # interpreter: 16 x 16 tiles so tiny tests still cover several blocks
        for kernel in ("attention_fwd", "attention_bwd_dkdv", "attention_bwd_dq"):
            for bucket in ("d<=128", "d256"):
                t[(kernel, "interpreter", dt, bucket)] = MatmulConfig(16, 16, 0, 1, 4, 1)
        for bucket in ("d<=128", "d256"):  # the forward's TMA loads on 2-byte dtypes, so CPU tests cover them
            t[("attention_fwd", "interpreter", dt, bucket)] = MatmulConfig(16, 16, 0, 1, 4, 1, tma_loads=dt != "float32")
        for bucket in ("d<=128", "d256"):  # both head layouts, so CPU tests cover both
            for pairs in PAIR_BUCKET_NAMES:
                t[("attention_decode", "interpreter", dt, f"{bucket},{pairs}")] = MatmulConfig(
                    16, 16, 0, 1, 4, 1, q_heads=1 if pairs.startswith("pairs<=64") else 0,
                    page_ahead=pairs.endswith("q>64"))
    return t


# Small-M matmul tiles (bf16 / fp16), from the H200 sweeps of scripts/gpu_decode.py --sweep (every
# candidate gave the reference's bits; docs/reports/h200-decode-sweep-2026-12-04.json, then
# h200-decode-sweep2-2026-12-04.json for M = 8 and M = 256): the best worst-case ratio to cuBLAS over
# the (N, K) shapes of the bucket. M <= 16 is a weight read: 16-row tiles (mma.sync: no 64-row wgmma
# tile of zeros), narrow along N for enough programs, deep along K. One row (a single sequence's
# decode step) reads the weight through TMA; 2-16 rows at N <= 4096 on pointers, 16 x 32 tiles 256 deep:
# at M = 8, N = K = 4096 9.7 us against TMA's 10.6 on the H200 (h200-decode-sweep-2026-12-04.json)
# and 9.7 against 11.0 on the H100 (h100-decode-matmul-sweep-2026-12-06.json), and no slower at
# K = 14336 (32.7 against 33.2; 43.2 against 43.2), where at M = 1 pointers lose (15.9 against
# 12.1 on the H200). The M > 256 rows are _matmul_rows' reference. "cuda" (other archs): the same
# tiles on pointers.
_SMALL_M = {"sm90": {
    "m<=1,n<=4096": MatmulConfig(16, 32, 512, 1, 4, 3, persistent_tma=True),
    "m<=1,n>4096": MatmulConfig(16, 64, 256, 1, 4, 4, persistent_tma=True),
    "m<=16,n<=4096": MatmulConfig(16, 32, 256, 1, 4, 4),
    "m<=16,n>4096": MatmulConfig(16, 64, 256, 1, 4, 4, persistent_tma=True),
    "m<=64,n<=4096": MatmulConfig(64, 32, 128, 1, 4, 4),
    "m<=64,n>4096": MatmulConfig(64, 64, 128, 1, 4, 5, persistent_tma=True),
    "m<=256,n<=4096": MatmulConfig(64, 128, 128, 8, 4, 4, persistent_tma=True),
    "m<=256,n>4096": MatmulConfig(128, 128, 64, 8, 8, 5, persistent_tma=True),
}}
_SMALL_M["cuda"] = {b: dataclasses.replace(c, persistent_tma=False) for b, c in _SMALL_M["sm90"].items()}


def _decode_row(arch, dt, d_bucket, bucket, fwd):
    """attention_decode's config: block_n is the forward's (the reduction order). On 2-byte dtypes at
    d <= 128: decode steps (<= 64 query rows per pair) run 64-row tiles of (token, q head) rows with
    the whole GQA group per program (K / V read once), 4 warps, 5 stages: a paged read of the cache.
    Prefill chunks (> 64 query rows per pair) run the forward's 128-row, 8-warp, 3-stage tiles with
    the page ids read one block ahead. H200 sweeps, every candidate bit-equal to the training forward
    (docs/reports/h200-decode-sweep2-2026-12-04.json, h200-paging-2026-12-04.json): 5 stages took
    64 x 4096 cached (16 q / 8 kv heads) from 0.82x to 0.97x SDPA and 256 x 1024 from 0.80x to 0.91x;
    page ids read ahead took a 32768-token chunk from 0.76x to 0.87x the training forward (without
    it the K / V loads waited on the page id and never overlapped the math; decode steps got slower
    with it: 0.255 -> 0.304 ms at 64 x 4096). d256 / fp32 keep the forward's tiles (untuned), also
    with the whole group per program."""
    pairs, q = bucket.split(",")
    if dt != "float32" and d_bucket == "d<=128":
        if q == "q<=64":
            return MatmulConfig(64, fwd[1], 0, 1, 4, 5)
        return MatmulConfig(128, fwd[1], 0, 1, 8, 3, page_ahead=True)
    return MatmulConfig(fwd[0], fwd[1], 0, 1, fwd[2], fwd[3])


class _Table(dict):
    """The locked-config table: a dict whose every change empties the lookups' memo (tests and sweep
    scripts replace rows in-process; a lookup never answers from a row that is no longer there)."""

    @staticmethod
    def _changed():
        forget()

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key):
        super().__delitem__(key)
        self._changed()

    def clear(self):
        super().clear()
        self._changed()

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self._changed()

    def pop(self, *args):
        out = super().pop(*args)
        self._changed()
        return out

    def popitem(self):
        out = super().popitem()
        self._changed()
        return out

    def setdefault(self, key, default=None):
        out = super().setdefault(key, default)
        self._changed()
        return out

    def __ior__(self, other):
        self.update(other)
        return self


# (lookup function, its arguments) -> config: a launch's lookup is a dict hit (host time of small ops),
# emptied on every change of the table and when it grows past _MEMO_MAX (row counts are arguments).
_MEMO: dict = {}
_MEMO_MAX = 4096
_PLAN_STORES: list = []  # the ops' per-shape plans (plan_store): made from table rows, emptied with the memo


def plan_store() -> dict:
    """A dict for one call site's per-shape plans (ops.launch.planned), which hold configs looked up
    from the table: emptied, like the lookups' memo, on every change of the table."""
    store: dict = {}
    _PLAN_STORES.append(store)
    return store


def forget() -> None:
    """Empties the lookups' memo and every plan store: the next call of each op looks its rows up
    again (the table changed, or a test wraps a lookup function to see what an op reads)."""
    _MEMO.clear()
    table_arch.cache_clear()
    for store in _PLAN_STORES:
        store.clear()


def _memo(fn):
    def lookup(*args, **kwargs):
        key = (fn, args, tuple(kwargs.items())) if kwargs else (fn, args)
        try:
            return _MEMO[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable argument: no memo
            return fn(*args, **kwargs)
        out = fn(*args, **kwargs)  # raises KeyError for a missing row: nothing stored
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[key] = out
        return out
    lookup.__name__, lookup.__qualname__, lookup.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    lookup.__wrapped__ = fn
    return lookup


LOCKED_CONFIGS: dict[tuple[str, str, str, str], object] = _Table({**_rows(), **_matmul_rows()})


def v_bucket(V: int) -> str:
    for v_max in V_BUCKETS:
        if v_max is None or V <= v_max:
            return _bucket_name(v_max)
    raise AssertionError("unreachable: the last bucket is open")


@functools.lru_cache(maxsize=None)  # a scan of the table; called on every launch
def table_arch(arch: str, kernel: str | None = None) -> str:
    """The table's arch key for a runtime arch: its own rows (for that kernel) if it has them, else
    the generic CUDA rows."""
    if any(k[1] == arch and (kernel is None or k[0] == kernel) for k in LOCKED_CONFIGS):
        return arch
    if arch.startswith("sm"):
        return "cuda"
    raise KeyError(f"no locked configs for arch {arch!r}")


@_memo
def lookup(kernel: str, arch: str, dtype: torch.dtype, V: int) -> LaunchConfig:
    """The locked config of a launch. Raises KeyError for a combination the table does not hold."""
    dt = str(dtype).removeprefix("torch.")
    key = (kernel, table_arch(arch, kernel), dt, v_bucket(V))
    try:
        return LOCKED_CONFIGS[key]
    except KeyError:
        raise KeyError(f"no locked config for {key}") from None


@_memo
def lookup_matmul(kernel: str, arch: str, dtype: torch.dtype, rows: int | None = None,
                  cols: int | None = None) -> MatmulConfig:
    """The locked tiles of a tl.dot kernel: a function of (kernel, arch, dtype), and for a kernel with
    row buckets (the matmul) of the buckets of `rows` (M) and `cols` (N): a member of the kernel's bit
    class. rows=None gives the class reference (callers that need one config for every row count)."""
    dt = str(dtype).removeprefix("torch.")
    arch_key = table_arch(arch, kernel)
    key = (kernel, arch_key, dt, "any")
    if key not in LOCKED_CONFIGS:
        key = (kernel, arch_key, dt, M_BUCKET_NAMES[-1] if rows is None else m_bucket(rows, cols or 1))
    try:
        return LOCKED_CONFIGS[key]
    except KeyError:
        raise KeyError(f"no locked config for {key}") from None


@_memo
def lookup_decode(arch: str, dtype: torch.dtype, head_dim: int, pairs: int | None = None,
                  q_rows: int = 1) -> MatmulConfig:
    """attention_decode's config for a step of `pairs` (sequence, kv head) pairs with `q_rows` query
    rows per pair (max_seqlen_q x the GQA group); pairs=None: the last bucket (the forward's tiles).
    Every bucket shares the forward's block_n (test_config_classes)."""
    dt = str(dtype).removeprefix("torch.")
    pb = PAIR_BUCKET_NAMES[-1] if pairs is None else pair_bucket(pairs, q_rows)
    key = ("attention_decode", table_arch(arch, "attention_decode"), dt,
           f"{'d<=128' if head_dim <= 128 else 'd256'},{pb}")
    try:
        return LOCKED_CONFIGS[key]
    except KeyError:
        raise KeyError(f"no locked config for {key}") from None


@_memo
def lookup_attention(kernel: str, arch: str, dtype: torch.dtype, head_dim: int) -> MatmulConfig:
    """The locked tiles of an attention kernel: a function of (kernel, arch, dtype, head dim) only."""
    dt = str(dtype).removeprefix("torch.")
    key = (kernel, table_arch(arch, kernel), dt, "d<=128" if head_dim <= 128 else "d256")
    try:
        return LOCKED_CONFIGS[key]
    except KeyError:
        raise KeyError(f"no locked config for {key}") from None


def lookup_fixed(kernel: str, arch: str) -> LaunchConfig:
    """The locked config of an fp32 per-token kernel with a single shape bucket."""
    key = (kernel, table_arch(arch, kernel), "float32", "any")
    try:
        return LOCKED_CONFIGS[key]
    except KeyError:
        raise KeyError(f"no locked config for {key}") from None


@dataclass(frozen=True)
class BitClass:
    """Configs claimed to give every output element the same bits as the reference config.

    What a member keeps is the reduction order of each element (the ascending k16 MMA steps of a dot,
    the KV block of attention's online softmax, the row-local softmax tree of a 64-row wgmma tile);
    what it may change is tiling, which rows share a tile, warps, stages, persistence and TMA. The
    claim holds per build: tests/test_config_classes.py runs every member against the reference with
    torch.equal on the GPU, and scripts/aot_compile_check.py reports each member's MMA instructions."""
    name: str
    reference: tuple  # a LOCKED_CONFIGS key
    members: tuple  # LOCKED_CONFIGS keys, the reference's bucket siblings (the reference among them)
    # The sm90 MMA instruction families (N size dropped) its members may compile to: those the GPU gate
    # ran bit-equal (scripts/aot_compile_check.py fails a member outside them).
    families: tuple = ()


def _families(dt: str, kernel: str) -> tuple:
    """Hopper's warpgroup MMA with k16 steps over 2-byte operands, and for the matmul also the
    16-row mma.sync of its M <= 16 tiles: the H200 sweep found both give each element the same bits
    (fp32: IEEE FMA, no tensor cores)."""
    if dt == "float32":
        return ()
    ab = "bf16.bf16" if dt == "bfloat16" else "f16.f16"
    fams = (f"wgmma.mma_async.sync.aligned.m64nNk16.f32.{ab}",)
    return fams + ((f"mma.sync.aligned.m16nNk16.row.col.f32.{ab}.f32",) if kernel == "matmul" else ())


def _bit_classes() -> tuple[BitClass, ...]:
    out = []
    for (kernel, arch, dt, bucket) in LOCKED_CONFIGS:
        if kernel == "matmul" and bucket == M_BUCKET_NAMES[-1]:
            out.append(BitClass(f"matmul/{arch}/{dt}", (kernel, arch, dt, bucket),
                                tuple(("matmul", arch, dt, b) for b in M_BUCKET_NAMES), _families(dt, kernel)))
        if kernel == "attention_fwd":
            out.append(BitClass(f"attention/{arch}/{dt}/{bucket}", (kernel, arch, dt, bucket),
                                ((kernel, arch, dt, bucket),)
                                + tuple(("attention_decode", arch, dt, f"{bucket},{p}") for p in PAIR_BUCKET_NAMES),
                                _families(dt, kernel)))
    return tuple(out)


BIT_CLASSES: tuple[BitClass, ...] = _bit_classes()


def table_as_data() -> list[dict]:
    return [
        {"kernel": k, "arch": a, "dtype": d, "v_bucket": b, **asdict(c)}
        for (k, a, d, b), c in sorted(LOCKED_CONFIGS.items())
    ]


def fingerprint(arch: str | None = None, kernels: tuple[str, ...] | None = None) -> str:
    """Hash of the locked-config table, the triton version and the arch: names the compiled semantics.
    kernels: hash only those kernels' rows (every arch, every bucket; no bit classes), the configs one
    operator's launches read (a native admission depends on its op's rows, not on the whole table).
    Memoized until the table changes (every descriptor and policy decision carries it; hashing the
    table took ~20 ms)."""
    arch = arch or default_arch()
    key = (fingerprint, arch, triton.__version__, id(BIT_CLASSES), kernels)
    if key in _MEMO:
        return _MEMO[key]
    if kernels is None:
        content = {"table": table_as_data(), "classes": [asdict(c) for c in BIT_CLASSES]}
    else:
        content = {"rows": [r for r in table_as_data() if r["kernel"] in kernels], "kernels": sorted(kernels)}
    payload = json.dumps({**content, "triton": triton.__version__, "arch": arch}, sort_keys=True)
    _MEMO[key] = out = hashlib.sha256(payload.encode()).hexdigest()[:16]
    return out
