"""Bit classes (configs.BIT_CLASSES): configs chosen by a bucket of the rows are claimed to give the
class reference's bits. The bookkeeping is checked here on any machine; the claim itself is checked
by running every member against its reference with torch.equal: under the interpreter on the CPU
(the library's structure: tiles, masks, row layouts) and on the GPU per build (the instructions).
A member whose bits differ fails here and cannot stay locked."""
import dataclasses

import numpy as np
import pytest
import torch

from rlk_triton import configs
from rlk_triton._runtime import arch_of
from rlk_triton.attention import attention
from rlk_triton.ops import attention as attn_ops
from rlk_triton.ops.matmul import matmul_into
from rlk_triton.testing import check_batch_invariance
from rlk_triton.testing.attention_parity import cu_of
from rlk_triton.testing.matmul_parity import matmul_row_op
from test_attention import _paged  # the shuffled-page cache and block table of the decode tests

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _classes(device, kernel):
    arch = configs.table_arch(arch_of(torch.device(device)), kernel)
    return [c for c in configs.BIT_CLASSES if c.reference[0] == kernel and c.reference[1] == arch]


# ---- bookkeeping ----

def test_every_class_member_is_locked_and_the_reference_is_a_member():
    assert configs.BIT_CLASSES
    for c in configs.BIT_CLASSES:
        assert c.reference in c.members
        for key in c.members:
            assert key in configs.LOCKED_CONFIGS, (c.name, key)


def test_every_row_bucket_has_a_class():
    """A config chosen by the rows is locked only as a class member."""
    members = {k for c in configs.BIT_CLASSES for k in c.members}
    for key in configs.LOCKED_CONFIGS:
        if key[0] == "matmul" or key[0] == "attention_decode":
            assert key in members, key


def test_members_keep_the_reduction_order():
    for c in configs.BIT_CLASSES:
        ref = configs.LOCKED_CONFIGS[c.reference]
        for key in c.members:
            cfg = configs.LOCKED_CONFIGS[key]
            if c.reference[0] == "attention_fwd":  # the KV block of the online softmax
                assert cfg.block_n == ref.block_n, key
            if c.reference[1] == "interpreter" and c.reference[0] == "matmul":
                # the interpreter sums a K step with np.sum: its order depends on BLOCK_K
                assert cfg.block_k == ref.block_k, key


def test_row_buckets_and_their_boundaries():
    assert [configs.m_bucket(m) for m in (1, 2, 16, 17, 64, 65, 256, 257, 4096)] == \
        ["m<=1", "m<=16", "m<=16", "m<=64", "m<=64", "m<=256", "m<=256", "m>256", "m>256"]
    assert [configs.m_bucket(8, n) for n in (1, 4096, 4097)] == ["m<=16,n<=4096", "m<=16,n<=4096", "m<=16,n>4096"]
    assert configs.m_bucket(1, 4097) == "m<=1,n>4096"
    assert [configs.pair_bucket(p) for p in (1, 64, 65)] == ["pairs<=64", "pairs<=64", "pairs>64"]
    assert [configs.pair_bucket(8, q) for q in (1, 64, 65)] == ["pairs<=64,q<=64", "pairs<=64,q<=64", "pairs<=64,q>64"]
    for arch in ("interpreter", "sm90", "sm80"):
        for dt in DTYPES:
            ref = configs.lookup_matmul("matmul", arch, dt)
            assert ref == configs.lookup_matmul("matmul", arch, dt, rows=10**6)
            assert configs.lookup_decode(arch, dt, 128) == configs.lookup_decode(arch, dt, 128, 10**6, 10**6)


def test_fingerprint_covers_the_buckets(monkeypatch):
    before = configs.fingerprint("sm90")
    key = ("matmul", "sm90", "bfloat16", "m<=16,n<=4096")
    monkeypatch.setitem(configs.LOCKED_CONFIGS, key,
                        dataclasses.replace(configs.LOCKED_CONFIGS[key], num_stages=2))
    assert configs.fingerprint("sm90") != before


# ---- the gate: every member against its reference ----

def _matmul_shapes(device):
    if device == "cpu":
        return [(1, 70, 40), (3, 33, 96), (20, 65, 64), (17, 32, 33)]
    return [(1, 4096, 4096), (7, 4097, 1000), (33, 14336, 4096), (100, 6144, 4104), (257, 4096, 14336),
            (64, 1000, 129)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_members_give_the_reference_bits(device, dtype):
    gen = torch.Generator().manual_seed(5)
    (cls,) = [c for c in _classes(device, "matmul") if c.reference[2] == str(dtype).removeprefix("torch.")]
    ref_cfg = configs.LOCKED_CONFIGS[cls.reference]
    for M, N, K in _matmul_shapes(device):
        a = torch.randn(M, K, generator=gen).to(device, dtype)
        w = (torch.randn(N, K, generator=gen) / K**0.5).to(device, dtype)
        for b in (w.t(), w.t().contiguous()):  # a linear layer's weight, and a row-major B
            ref = matmul_into(a, b, torch.empty(M, N, device=device, dtype=dtype), cfg=ref_cfg)
            ref32 = matmul_into(a, b, torch.empty(M, N, device=device), cfg=ref_cfg)
            for key in cls.members:
                cfg = configs.LOCKED_CONFIGS[key]
                got = matmul_into(a, b, torch.empty(M, N, device=device, dtype=dtype), cfg=cfg)
                got32 = matmul_into(a, b, torch.empty(M, N, device=device), cfg=cfg)
                assert torch.equal(got, ref) and torch.equal(got32, ref32), (key, M, N, K)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_rows_invariant_across_buckets(device, dtype):
    """The invariance harness with batches on both sides of every bucket boundary: the probe rows
    alone (m<=16; one probe row: m<=1) and inside batches of every bucket, values and d a rows."""
    N, K = (48, 40) if device == "cpu" else (4096, 4096)
    sizes = (5, 17, 70) if device == "cpu" else (16, 17, 64, 65, 256, 257, 4096)
    report = check_batch_invariance(matmul_row_op(N, K, dtype, device), probe_rows=3, batch_sizes=sizes)
    assert report.passed, report.failures()
    report = check_batch_invariance(matmul_row_op(N, K, dtype, device), probe_rows=1, batch_sizes=(2, 17))
    assert report.passed, report.failures()


def _decode_case(device, dtype, D, lens, Hq, Hkv, gen):
    cu = [0] + list(np.cumsum(lens))
    q, k, v = (torch.randn(cu[-1], h, D, generator=gen).to(device, dtype) for h in (Hq, Hkv, Hkv))
    out, lse = attention(q, k, v, cu_of(lens, device))
    return cu, q, k, v, out, lse


def _decode_members(device, dtype, D):
    bucket = "d<=128" if D <= 128 else "d256"
    (cls,) = [c for c in _classes(device, "attention_fwd")
              if c.reference[2] == str(dtype).removeprefix("torch.") and c.reference[3] == bucket]
    return [configs.LOCKED_CONFIGS[k] for k in cls.members if k[0] == "attention_decode"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_members_give_the_training_bits(device, dtype):
    """Every decode config, on both sides of the pair and query-row buckets, gives each token the training forward's
    out and LSE: one new token per sequence, and chunks that start and end inside KV blocks."""
    gen = torch.Generator().manual_seed(11)
    on_gpu = device != "cpu"
    D = 128 if on_gpu else 16
    lens = [700, 129, 64, 1] if on_gpu else [37, 9, 1]
    for Hq, Hkv in ((4, 2), (8, 1), (2, 2)):
        cu, q, k, v, out, lse = _decode_case(device, dtype, D, lens, Hq, Hkv, gen)
        for cfg in _decode_members(device, dtype, D):
            kc, vc, bt = _paged(k, v, lens, cu, 2 * cfg.block_n, device, gen)
            sl = torch.tensor(lens, dtype=torch.int32, device=device)
            # the last token of each sequence (a decode step), then each sequence's last n tokens as a chunk
            chunks = (300, 5, 64, 1) if on_gpu else (23, 5, 17, 1)  # on the GPU, chunks past the q<=64 bucket
            for n in ([1] * len(lens), [min(L, c) for L, c in zip(lens, chunks)]):
                cuq = cu_of(n, device)
                idx = torch.cat([torch.arange(cu[b + 1] - m, cu[b + 1]) for b, m in enumerate(n)]).to(device)
                o, l = attn_ops.launch_decode(q[idx], kc, vc, bt, sl, cuq, max(n), D**-0.5, cfg=cfg)
                assert torch.equal(o, out[idx]) and torch.equal(l, lse[:, idx]), (cfg, Hq, Hkv, n)
