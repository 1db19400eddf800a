"""attention: parity with the float64 reference (contracts/attention.yaml), bitwise pack invariance and
deterministic backward, decode / chunked prefill bitwise equal to training, context-parallel chaining,
typed errors."""
import dataclasses

import numpy as np
import pytest
import torch

from rlk_triton import configs
from rlk_triton._runtime import arch_of
from rlk_triton.attention import attention, attention_decode, attention_partial, merge_attention_partials
from rlk_triton.errors import DeviceError, DTypeError, InputError, LayoutError, ShapeError
from rlk_triton.reference.attention import attention_grad_reference, attention_reference
from rlk_triton.testing import check_batch_invariance
from rlk_triton.testing.attention_parity import (AttentionCase, _scales, attention_row_op, cu_of,
                                                 judge_attention, judge_errors)
from rlk_triton.testing.float64_checks import (assert_central_differences, central_difference_step,
                                               softmax_third_derivative_bound)

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _block_n(device, dtype, kernel="attention_fwd", head_dim=128):
    arch = arch_of(torch.device(device))
    if kernel == "attention_decode":
        return configs.lookup_decode(arch, dtype, head_dim).block_n
    return configs.lookup_attention(kernel, arch, dtype, head_dim).block_n


# ---- the float64 reference ----

def _loss_scales(q, k, v, cu, scale, dout, dlse):
    """(f_scale, {input: bound on |f'''|}) of the causal loss sum dout * out + sum dlse * lse, row by row.
    f_scale: what one evaluation adds up, each weighted by how far its rounding reaches the loss:
    out = sum_j p_j v_j adds p |v|, and p and lse carry the logits' rounding, which is relative to
    S = max_j scale sum |q k| and, through exp(s - max s), up to 2 S: (1 + 2 S) p |v| and
    (1 + |lse| + 2 S) for the lse term. f''': softmax_third_derivative_bound per row, summed over the
    rows an input reaches; f is linear in v. Both derived, not measured (the differences' errors come out
    25-200x below the bound they give)."""
    _, lse = attention_reference(q, k, v, cu, scale, True)
    G = q.shape[1] // k.shape[1]
    f_scale, third_q, third_k = 0.0, 0.0, np.zeros_like(k)
    for a, b in zip(cu[:-1], cu[1:]):
        for h in range(q.shape[1]):
            for i in range(a, b):
                js, g = np.arange(a, i + 1), h // G  # the keys row i sees
                p = np.exp(scale * k[js, g] @ q[i, h] - lse[h, i])
                big_s = scale * (np.abs(k[js, g]) @ np.abs(q[i, h])).max()
                f_scale += (np.abs(dout[i, h]) @ (p @ np.abs(v[js, g]))) * (1 + 2 * big_s)
                f_scale += abs(dlse[h, i]) * (1 + abs(lse[h, i]) + 2 * big_s)
                w_range = np.ptp(v[js, g] @ dout[i, h])
                # q[i, h, d] moves every logit of the row, at rates scale k[j, g, d]
                rates = scale * np.ptp(k[js, g], axis=0)
                third_q = max(third_q, softmax_third_derivative_bound(rates, w_range, dlse[h, i]).max())
                # k[j, g, d] moves logit j alone, at rate scale q[i, h, d]: a range only beside another key
                if len(js) > 1:
                    third_k[js, g] += softmax_third_derivative_bound(scale * np.abs(q[i, h]), w_range, dlse[h, i])
    return f_scale, {"q": third_q, "k": float(third_k.max()), "v": 0.0}


def test_reference_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(7, 4, 3)), rng.normal(size=(7, 2, 3)), rng.normal(size=(7, 2, 3))
    cu, scale = [0, 4, 7], 0.7
    dout, dlse = rng.normal(size=(7, 4, 3)), rng.normal(size=(4, 7))

    def loss(q=q, k=k, v=v):
        out, lse = attention_reference(q, k, v, cu, scale, True)
        return float((out * dout).sum() + (lse * dlse).sum())

    grads = attention_grad_reference(q, k, v, cu, scale, True, dout, dlse)
    f_scale, third = _loss_scales(q, k, v, cu, scale, dout, dlse)
    h = central_difference_step(f_scale, max(third.values()))  # where truncation and rounding balance
    for name, x, g in zip("qkv", (q, k, v), grads):
        assert_central_differences(lambda y: loss(**{name: y}), x, g, h, third[name], f_scale)


def test_reference_lse_is_logsumexp():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(5, 1, 4)), rng.normal(size=(5, 1, 4)), rng.normal(size=(5, 1, 4))
    out, lse = attention_reference(q, k, v, [0, 5], 0.5, True)
    s = 0.5 * q[4, 0] @ k[:, 0].T
    assert abs(lse[0, 4] - np.log(np.exp(s).sum())) < 1e-12
    assert abs(lse[0, 0] - 0.5 * q[0, 0] @ k[0, 0]) < 1e-12  # the first token sees itself only


# ---- parity ----

@pytest.mark.parametrize("dtype", DTYPES)
def test_parity_within_contract(device, dtype):
    ratios = judge_attention(AttentionCase((29, 13), 4, 2, 16, dtype, True, 3.0, seed=3), device)
    assert set(ratios) == {"out", "lse", "dq", "dk", "dv"}
    assert max(ratios.values()) <= 1.0, ratios


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [((50,), 2, 2, 32, False, 2.0), ((21, 3, 40), 4, 1, 16, True, 1.0),
                                  ((1, 17, 33), 2, 1, 64, True, 5.0)])
def test_parity_more_shapes(device, dtype, case):
    sl, hq, hkv, d, causal, sigma = case
    ratios = judge_attention(AttentionCase(sl, hq, hkv, d, dtype, causal, sigma, seed=len(sl)), device)
    assert max(ratios.values()) <= 1.0, ratios


def test_parity_judge_can_fail(device):
    """A perturbed output must be judged out of contract (the tolerances are not vacuous)."""
    from rlk_triton.testing.attention_parity import attention_errors

    errors = attention_errors(AttentionCase((20,), 2, 1, 16, torch.float32, seed=2), device, with_grad=False)
    ours, ref, scale = errors["out"]
    errors["out"] = (ours * (1 + 1e-4), ref, scale)
    assert judge_errors(errors, torch.float32, arch_of(torch.device(device)))["out"] > 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_parity_gpu_shapes(dtype):
    for sl, hq, hkv, d in (((1000, 37, 700), 16, 4, 128), ((513, 64), 8, 8, 64), ((300, 45), 4, 2, 256)):
        ratios = judge_attention(AttentionCase(sl, hq, hkv, d, dtype, True, 1.0, seed=1), "cuda")
        assert max(ratios.values()) <= 1.0, (d, ratios)


# ---- pack invariance and determinism ----

def _seq(gen, L, Hq, Hkv, D, dtype, device):
    return tuple(torch.randn(L, h, D, generator=gen).to(device, dtype) for h in (Hq, Hkv, Hkv))


def _run_pack(seqs, order, ups, device, causal=True):
    """Pack seqs in `order`, run forward + backward with upstream ups[i] on sequence i; returns per
    sequence (out, lse, dq, dk, dv) unpacked."""
    lens = [seqs[i][0].shape[0] for i in order]
    leaves = [torch.cat([seqs[i][j] for i in order]).requires_grad_() for j in range(3)]
    cu = cu_of(lens, device)
    out, lse = attention(*leaves, cu, causal=causal)
    dout = torch.cat([ups[i][0] for i in order])
    dlse = torch.cat([ups[i][1] for i in order], 1)
    ((out.float() * dout).sum() + (lse * dlse).sum()).backward()
    res, starts = {}, np.cumsum([0] + lens)
    for pos, i in enumerate(order):
        a, b = int(starts[pos]), int(starts[pos + 1])
        res[i] = (out[a:b].detach(), lse[:, a:b].detach()) + tuple(x.grad[a:b] for x in leaves)
    return res


@pytest.mark.parametrize("dtype", (torch.bfloat16, pytest.param(torch.float32, marks=pytest.mark.slow)))
def test_pack_invariance_bitwise(device, dtype):
    """A sequence's out, lse, dq, dk, dv do not depend on the pack: other sequences, their lengths,
    zero-length and padding sequences, its position."""
    gen = torch.Generator().manual_seed(0)
    Hq, Hkv, D = 4, 2, 16
    lens = [35, 5, 16, 0, 23]
    seqs = [_seq(gen, L, Hq, Hkv, D, dtype, device) for L in lens]
    seqs.append(tuple(torch.zeros(9, h, D, dtype=dtype, device=device) for h in (Hq, Hkv, Hkv)))  # padding
    ups = [(torch.randn(s[0].shape[0], Hq, D, generator=gen).to(device),
            torch.randn(Hq, s[0].shape[0], generator=gen).to(device)) for s in seqs]
    base = _run_pack(seqs, [0, 1, 2], ups, device)  # without neighbours, at the front
    for order in ([5, 4, 2, 3, 1, 0], [3, 1, 5, 0, 2]):  # other neighbours, padding, other offsets
        got = _run_pack(seqs, order, ups, device)
        for i in (0, 1, 2):
            for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), base[i], got[i]):
                assert torch.equal(a, b), (order, i, name, (a.double() - b.double()).abs().max())


def test_backward_deterministic(device):
    gen = torch.Generator().manual_seed(1)
    seqs = [_seq(gen, L, 4, 1, 16, torch.bfloat16, device) for L in (33, 10)]
    ups = [(torch.randn(s[0].shape[0], 4, 16, generator=gen).to(device),
            torch.randn(4, s[0].shape[0], generator=gen).to(device)) for s in seqs]
    a = _run_pack(seqs, [0, 1], ups, device)
    b = _run_pack(seqs, [0, 1], ups, device)
    for i in (0, 1):
        assert all(torch.equal(x, y) for x, y in zip(a[i], b[i]))


def _with_rows(monkeypatch, device, dtype, kernels, **fields):
    """Replace `fields` in the locked d<=128 rows of `kernels` that this device uses."""
    arch = arch_of(torch.device(device))
    dt = str(dtype).removeprefix("torch.")
    for kernel in kernels:
        key = (kernel, configs.table_arch(arch, kernel), dt, "d<=128")
        monkeypatch.setitem(configs.LOCKED_CONFIGS, key, dataclasses.replace(configs.LOCKED_CONFIGS[key], **fields))


def _with_backward_split(monkeypatch, device, dtype, min_len):
    """Set split_min_len on the locked backward rows this device uses (0: off, the table's value)."""
    _with_rows(monkeypatch, device, dtype, ("attention_bwd_dkdv", "attention_bwd_dq"), split_min_len=min_len)


def _tailed_pack(device, dtype, seed):
    """(lens, sequences, upstream gradients) of a GQA pack with tails and a one-token sequence, long
    enough on the GPU to cross the backward's whole-block threshold."""
    gen = torch.Generator().manual_seed(seed)
    Hq, Hkv, D = 4, 2, 16
    lens = [53, 16, 9, 40, 1] if device == "cpu" else [4100, 700, 33, 2048, 1]
    seqs = [_seq(gen, L, Hq, Hkv, D, dtype, device) for L in lens]
    ups = [(torch.randn(s[0].shape[0], Hq, D, generator=gen).to(device),
            torch.randn(Hq, s[0].shape[0], generator=gen).to(device)) for s in seqs]
    return lens, seqs, ups


@pytest.mark.parametrize("causal", (True, False))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_backward_whole_block_loops_give_the_masked_bits(device, dtype, causal, monkeypatch):
    """configs split_min_len: sequences at least that long fold their whole blocks without the mask.
    Every output and gradient keeps the all-masked bits, for sequences on both sides of the threshold,
    tails, GQA and a pack of them (a per-sequence rule: batch invariance is untouched)."""
    lens, seqs, ups = _tailed_pack(device, dtype, 7)
    order = list(range(len(seqs)))
    runs = []
    for min_len in (0, 17 if device == "cpu" else 1024):
        _with_backward_split(monkeypatch, device, dtype, min_len)
        runs.append(_run_pack(seqs, order, ups, device, causal=causal))
    for i in order:
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), runs[0][i], runs[1][i]):
            assert torch.equal(a, b), (lens[i], name, (a.double() - b.double()).abs().max())


@pytest.mark.parametrize("dtype, causal", ((torch.bfloat16, True), (torch.bfloat16, False), (torch.float16, True)))
def test_forward_load_paths_give_the_same_bits(device, dtype, causal):
    """configs tma_loads / flat / heavy_first / maxnreg_d64: K and V through TMA descriptors, one tile per
    program in a straight line, the grid's tiles in reverse order, ptxas's register cap. All are how the
    forward moves and schedules the same tiles, so out and lse keep the pointer path's
    bits: for a pack with tails and GQA, with a max_seqlen shorter than the longest sequence (the tiles
    past the grid), for K / V sliced from one tensor, for K / V that TMA cannot read (a head stride
    other than D: the pointer loads), for the first sequence beside infs in the next one's V (a TMA
    block reads past the sequence), and for a context-parallel key range continued from a state."""
    for D in ((16,) if device == "cpu" else (128, 64)):  # on the GPU also D 64, where the register cap acts
        _check_forward_load_paths(device, dtype, causal, D)


def _check_forward_load_paths(device, dtype, causal, D):
    from rlk_triton.ops import attention as ops

    gen = torch.Generator().manual_seed(11)
    Hq, Hkv = 4, 2
    lens = [37, 9, 1, 20] if device == "cpu" else [4100, 700, 33, 2048, 1]
    N, L = sum(lens), max(lens)
    q = torch.randn(N, Hq, D, generator=gen).to(device, dtype)
    kv = torch.randn(N, 2 * Hkv, D, generator=gen).to(device, dtype)
    k, v = kv[:, :Hkv].contiguous(), kv[:, Hkv:].contiguous()
    pairs = torch.randn(N, Hkv, 2, D, generator=gen).to(device, dtype)
    cu, sc = cu_of(lens, device), D ** -0.5
    locked = ops._cfg("attention_fwd", q)
    plain = dataclasses.replace(locked, tma_loads=False, flat=False, heavy_first=False, maxnreg_d64=0)
    bn = locked.block_n
    # TMA reads a token stride other than Hkv x D (k, v sliced from one tensor), never a head stride
    # other than D (pairs: K and V of a head interleaved)
    assert ops.tma_rows_ready(kv[:, :Hkv], kv[:, Hkv:]) and not ops.tma_rows_ready(pairs[:, :, 0], pairs[:, :, 1])

    v_inf = v.clone()
    v_inf[lens[0]:] = float("inf")  # the first sequence's last KV block reaches into these tokens

    def first_seq(res):
        return res[0][:lens[0]], res[1][:, :lens[0]]

    def runs(cfg):
        return [ops.launch_forward(q, k, v, cu, L, sc, causal, cfg=cfg),
                ops.launch_forward(q, k, v, cu, locked.block_m, sc, causal, cfg=cfg),  # tiles past the grid
                ops.launch_forward(q, kv[:, :Hkv], kv[:, Hkv:], cu, L, sc, causal, cfg=cfg),
                ops.launch_forward(q, pairs[:, :, 0], pairs[:, :, 1], cu, L, sc, causal, cfg=cfg),
                first_seq(ops.launch_forward(q, k, v_inf, cu, L, sc, causal, cfg=cfg)),
                ops.launch_forward(q, k, v, cu, L, sc, causal, kv_range=(bn, 3 * bn), cfg=cfg,
                                   state_in=ops.launch_forward(q, k, v, cu, L, sc, causal, kv_range=(0, bn),
                                                               state_out=True, cfg=cfg)[2])]

    ref = runs(plain)
    for tma_loads, flat, heavy_first, cap in ((True, False, False, 0), (False, True, False, 0), (True, True, False, 0),
                                              (False, False, True, 0), (True, True, True, 0), (True, True, False, 128)):
        if cap and device == "cpu":  # the interpreter has no registers to cap: the (True, True, False, 0) run again
            continue
        got = runs(dataclasses.replace(locked, tma_loads=tma_loads, flat=flat, heavy_first=heavy_first,
                                       maxnreg_d64=cap))
        for case, a, b in zip(("pack", "short max_seqlen", "token stride", "head stride", "inf after", "kv range"), ref, got):
            for name, x, y in zip(("out", "lse"), a, b):
                assert torch.equal(x, y), (D, tma_loads, flat, heavy_first, cap, case, name,
                                           (x.double() - y.double()).abs().max())


def test_register_cap_only_at_small_heads(monkeypatch):
    """configs maxnreg_d64 caps ptxas's registers at head dims <= 64 only (larger heads spill under the
    cap or do not compile), and never under the interpreter (no registers)."""
    from rlk_triton.ops import attention as ops

    cfg = configs.lookup_attention("attention_fwd", "sm90", torch.bfloat16, 64)
    assert cfg.maxnreg_d64 == 128  # the locked sm90 2-byte rows: the forward's and dq's, never dk / dv's
    assert configs.lookup_attention("attention_bwd_dq", "sm90", torch.bfloat16, 64).maxnreg_d64 == 128
    assert configs.lookup_attention("attention_bwd_dkdv", "sm90", torch.bfloat16, 64).maxnreg_d64 == 0
    monkeypatch.setattr(ops, "interpreter_active", lambda: False)
    assert [ops.register_cap(cfg, d) for d in (32, 64, 96, 128, 256)] == [{"maxnreg": 128}] * 2 + [{}] * 3
    assert ops.register_cap(dataclasses.replace(cfg, maxnreg_d64=0), 64) == {}
    monkeypatch.setattr(ops, "interpreter_active", lambda: True)
    assert ops.register_cap(cfg, 64) == {}


def test_register_cap_reaches_the_forward_and_dq_launches(device, monkeypatch, kernel_spy):
    """The plumbing of configs maxnreg_d64: with the rows carrying it, the forward's and dq's launches
    ask for the cap at D <= 64 and not at D 128; dk / dv's never does."""
    from rlk_triton.ops import attention as ops

    asked = []

    def see(name, meta):
        asked.append((name, meta.get("maxnreg")))
        if device == "cpu":
            meta.pop("maxnreg", None)  # the interpreter has no registers to cap

    for name in ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel"):
        kernel_spy(ops, name, see)
    monkeypatch.setattr(ops, "interpreter_active", lambda: False)  # on the CPU: what a GPU launch asks
    _with_rows(monkeypatch, device, torch.bfloat16, ("attention_fwd", "attention_bwd_dq"), maxnreg_d64=128)
    gen = torch.Generator().manual_seed(2)
    for D, want in ((16, 128), (128, None)):
        asked.clear()
        q, k, v = (x.requires_grad_() for x in _seq(gen, 20, 4, 2, D, torch.bfloat16, device))
        attention(q, k, v, cu_of([20], device))[0].float().sum().backward()
        assert asked == [("_fwd_kernel", want), ("_bwd_dkdv_kernel", None), ("_bwd_dq_kernel", want)], D


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_dq_heavy_first_gives_the_same_bits(device, dtype, monkeypatch):
    """configs heavy_first on the dq row (the grid's query tiles in reverse order) and on the forward's:
    out, lse, dq, dk and dv keep their bits, for a pack with tails and GQA and with the backward's
    whole-block loops on."""
    lens, seqs, ups = _tailed_pack(device, dtype, 9)
    order = list(range(len(seqs)))
    _with_backward_split(monkeypatch, device, dtype, 17 if device == "cpu" else 1024)
    runs = []
    for heavy_first in (False, True):
        _with_rows(monkeypatch, device, dtype, ("attention_fwd", "attention_bwd_dq"), heavy_first=heavy_first)
        runs.append(_run_pack(seqs, order, ups, device))
    for i in order:
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), runs[0][i], runs[1][i]):
            assert torch.equal(a, b), (lens[i], name, (a.double() - b.double()).abs().max())


@pytest.mark.gpu
def test_dq_register_cap_gives_the_same_bits(monkeypatch):
    """configs maxnreg_d64 on the dq row at D 64 (ptxas's register cap: the same instructions, two
    programs per SM): dq, dk and dv keep their bits, with and without the whole-block loops."""
    gen = torch.Generator().manual_seed(5)
    lens = [4100, 700, 33, 2048, 1]
    seqs = [_seq(gen, L, 4, 2, 64, torch.bfloat16, "cuda") for L in lens]
    ups = [(torch.randn(s[0].shape[0], 4, 64, generator=gen).cuda(),
            torch.randn(4, s[0].shape[0], generator=gen).cuda()) for s in seqs]
    order = list(range(len(seqs)))
    for min_len in (0, 1024):
        _with_backward_split(monkeypatch, "cuda", torch.bfloat16, min_len)
        runs = []
        for cap in (0, 128):
            _with_rows(monkeypatch, "cuda", torch.bfloat16, ("attention_bwd_dq",), maxnreg_d64=cap)
            runs.append(_run_pack(seqs, order, ups, "cuda"))
        for i in order:
            for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), runs[0][i], runs[1][i]):
                assert torch.equal(a, b), (min_len, lens[i], name, (a.double() - b.double()).abs().max())


@pytest.mark.parametrize("causal", (True, False))
def test_every_output_and_gradient_element_is_written(device, causal, nan_filled_buffers):
    """Neither pass zero-fills its outputs: the kernels must write every element of every sequence.
    With every new float buffer (torch.empty / empty_like) pre-filled with NaN, a pack with tails, GQA,
    a one-token and an empty sequence gives the normal run's bits (torch.equal fails on any NaN left
    behind)."""
    gen = torch.Generator().manual_seed(5)
    Hq, Hkv, D = 4, 2, 16
    lens = [35, 0, 16, 1, 23] if device == "cpu" else [1100, 0, 640, 1, 3000]
    seqs = [_seq(gen, L, Hq, Hkv, D, torch.bfloat16, device) for L in lens]
    ups = [(torch.randn(L, Hq, D, generator=gen).to(device), torch.randn(Hq, L, generator=gen).to(device))
           for L in lens]
    order = list(range(len(seqs)))
    ref = _run_pack(seqs, order, ups, device, causal=causal)
    nan_filled_buffers()  # the outputs, lse and the backward's delta
    got = _run_pack(seqs, order, ups, device, causal=causal)
    for i in order:
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), ref[i], got[i]):
            assert torch.equal(a, b), (lens[i], name)


def _with_scores_t(monkeypatch, device, dtype):
    """The dk / dv row with transposed scores (configs scores_t) on keys blocks twice the query blocks
    (the shape they are for: on the GPU the 64 x 128, 8-warp tile they compile spill-free; on the
    interpreter 16 x 32, so that BLOCK_N != BLOCK_M and the diagonal spans two query blocks)."""
    gpu = device != "cpu"
    _with_rows(monkeypatch, device, dtype, ("attention_bwd_dkdv",), scores_t=True, block_m=64 if gpu else 16,
               block_n=128 if gpu else 32, num_warps=8 if gpu else 4, num_stages=1)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_backward_transposed_scores_within_contract_and_invariant(device, dtype, monkeypatch):
    """configs scores_t: dk / dv from k @ q^T. Other bits than the locked row's are allowed (no other
    path shares the backward's), so: within contract, deterministic, pack-invariant bitwise, and the
    whole-block loops still give the masked loop's bits. (On the interpreter they are the locked row's
    bits too: NumPy's products do not depend on the layout at these sizes; the GPU runs this test with
    the real tiles.) Every dk / dv launch must have run transposed."""
    from rlk_triton.ops import attention as attention_ops

    launched, kernel = [], attention_ops._bwd_dkdv_kernel

    class Spy:  # records what each dk / dv launch was asked for
        def __getitem__(self, grid):
            def call(*args, **meta):
                launched.append(meta["SCORES_T"])
                return kernel[grid](*args, **meta)
            return call

    monkeypatch.setattr(attention_ops, "_bwd_dkdv_kernel", Spy())
    _with_scores_t(monkeypatch, device, dtype)
    for causal in (True, False):
        ratios = judge_attention(AttentionCase((29, 13), 4, 2, 16, dtype, causal, 3.0, seed=3), device)
        assert max(ratios.values()) <= 1.0, (causal, ratios)
    lens, seqs, ups = _tailed_pack(device, dtype, 11)
    base = _run_pack(seqs, [0, 1, 2, 3, 4], ups, device)
    again = _run_pack(seqs, [0, 1, 2, 3, 4], ups, device)
    moved = _run_pack(seqs, [4, 3, 2, 1, 0], ups, device)
    _with_backward_split(monkeypatch, device, dtype, 17 if device == "cpu" else 1024)
    split = _run_pack(seqs, [0, 1, 2, 3, 4], ups, device)
    for i in range(len(seqs)):
        for name, a, b, c, d in zip(("out", "lse", "dq", "dk", "dv"), base[i], again[i], moved[i], split[i]):
            assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d), (lens[i], name)
    assert launched and all(launched), launched


@pytest.mark.slow
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_batch_invariance_harness(device, dtype):
    """The shared harness, rows = whole sequences of one length."""
    report = check_batch_invariance(attention_row_op(19, 2, 1, 16, dtype, device), probe_rows=2,
                                    batch_sizes=(3, 5))
    assert report.passed, report.failures()[:5]


@pytest.mark.gpu
def test_pack_invariance_gpu():
    gen = torch.Generator().manual_seed(0)
    seqs = [_seq(gen, L, 8, 2, 128, torch.bfloat16, "cuda") for L in (1000, 37, 4100, 1)]
    ups = [(torch.randn(s[0].shape[0], 8, 128, generator=gen).cuda(),
            torch.randn(8, s[0].shape[0], generator=gen).cuda()) for s in seqs]
    base = _run_pack(seqs, [0], ups, "cuda")[0]
    for order in ([0, 1, 2, 3], [3, 2, 1, 0]):
        got = _run_pack(seqs, order, ups, "cuda")[0]
        assert all(torch.equal(a, b) for a, b in zip(base, got))


# ---- decode / chunked prefill: bitwise equal to training ----

def _paged(k, v, lens, cu, page_size, device, gen):
    """A paged cache holding the sequences' k / v on shuffled pages, and its block table."""
    Hkv, D = k.shape[1], k.shape[2]
    per_seq = max(-(-L // page_size) for L in lens) + 1
    n_pages = per_seq * len(lens) + 2
    kc = torch.randn(n_pages, page_size, Hkv, D, generator=gen).to(device, k.dtype)  # garbage elsewhere
    vc = torch.randn(n_pages, page_size, Hkv, D, generator=gen).to(device, k.dtype)
    perm = torch.randperm(n_pages, generator=gen)
    bt = perm[:per_seq * len(lens)].reshape(len(lens), per_seq).to(torch.int32)
    for b, L in enumerate(lens):
        t = torch.arange(L)
        kc[bt[b, t // page_size].long(), t % page_size] = k[cu[b]:cu[b] + L].to(kc.device)
        vc[bt[b, t // page_size].long(), t % page_size] = v[cu[b]:cu[b] + L].to(vc.device)
    return kc, vc, bt.to(device)


def _decode_in_chunks(q, kc, vc, bt, lens, cu, chunks, device):
    """Feed each sequence's tokens in chunks (chunks[b]: list of sizes, first = the prefill)."""
    out, lse = torch.zeros_like(q), torch.zeros(q.shape[1], q.shape[0], device=device)
    pos = [0] * len(lens)
    step = 0
    while any(p < L for p, L in zip(pos, lens)):
        n = [min(ch[step] if step < len(ch) else ch[-1], L - p) for ch, p, L in zip(chunks, pos, lens)]
        cuq = cu_of(n, device)
        qq = torch.cat([q[cu[b] + pos[b]:cu[b] + pos[b] + n[b]] for b in range(len(lens))])
        sl = torch.tensor([p + m for p, m in zip(pos, n)], dtype=torch.int32, device=device)
        # one token per sequence: the plain decode call (cu_seqlens_q None)
        o, l = attention_decode(qq, kc, vc, bt, sl, None if all(m == 1 for m in n) else cuq)
        for b in range(len(lens)):
            out[cu[b] + pos[b]:cu[b] + pos[b] + n[b]] = o[cuq[b]:cuq[b + 1]]
            lse[:, cu[b] + pos[b]:cu[b] + pos[b] + n[b]] = l[:, cuq[b]:cuq[b + 1]]
        pos = [p + m for p, m in zip(pos, n)]
        step += 1
    return out, lse


@pytest.mark.parametrize("dtype,page_mult,chunks", [
    (torch.bfloat16, 1, [[40], [7, 3], [16, 5]]),         # whole prefill; chunks straddling blocks
    (torch.float16, 2, [[20, 1], [1], [17, 2]]),           # prefill then decode one token at a time
    (torch.float32, 4, [[16, 9], [5], [20, 1]]),
    (torch.bfloat16, 1, [[32, 1], [8, 1], [20, 1]]),      # prefill, then one plain decode step (no offsets)
])
def test_decode_bitwise_equals_training(device, dtype, page_mult, chunks):
    gen = torch.Generator().manual_seed(7)
    lens, Hq, Hkv, D = [33, 9, 21], 4, 2, 16
    cu = [0] + list(np.cumsum(lens))
    N = cu[-1]
    q, k, v = (torch.randn(N, h, D, generator=gen).to(device, dtype) for h in (Hq, Hkv, Hkv))
    out, lse = attention(q, k, v, cu_of(lens, device))
    page_size = page_mult * _block_n(device, dtype, "attention_decode")
    kc, vc, bt = _paged(k, v, lens, cu, page_size, device, gen)
    o2, l2 = _decode_in_chunks(q, kc, vc, bt, lens, cu, chunks, device)
    assert torch.equal(o2, out), (o2.double() - out.double()).abs().max()
    assert torch.equal(l2, lse), (l2 - lse).abs().max()


def test_decode_and_forward_share_the_kv_block():
    """Bitwise decode rests on every decode config folding the forward's KV blocks (block_n: the
    reduction order) and being a member of the forward's bit class (the GPU gate proves the rest)."""
    n = 0
    for (kernel, arch, dt, b), cfg in configs.LOCKED_CONFIGS.items():
        if kernel == "attention_fwd":
            for pairs in configs.PAIR_BUCKET_NAMES:
                dec = configs.LOCKED_CONFIGS[("attention_decode", arch, dt, f"{b},{pairs}")]
                assert dec.block_n == cfg.block_n
                cls = next(c for c in configs.BIT_CLASSES if c.reference == (kernel, arch, dt, b))
                assert ("attention_decode", arch, dt, f"{b},{pairs}") in cls.members
                n += 1
    assert n >= 2 * 3 * 3


@pytest.mark.gpu
@pytest.mark.parametrize("D", (64, 128, 256))
def test_decode_bitwise_gpu(D):
    gen = torch.Generator().manual_seed(0)
    lens, Hq, Hkv = [700, 129, 64], 8, 2
    cu = [0] + list(np.cumsum(lens))
    q, k, v = (torch.randn(cu[-1], h, D, generator=gen).to("cuda", torch.bfloat16) for h in (Hq, Hkv, Hkv))
    out, lse = attention(q, k, v, cu_of(lens, "cuda"))
    for page_mult, chunks in ((1, [[500, 1], [100, 1], [1]]), (4, [[300, 77], [129], [10, 7]])):
        kc, vc, bt = _paged(k, v, lens, cu, page_mult * _block_n("cuda", torch.bfloat16, "attention_decode", D),
                            "cuda", gen)
        o2, l2 = _decode_in_chunks(q, kc, vc, bt, lens, cu, chunks, "cuda")
        assert torch.equal(o2, out) and torch.equal(l2, lse)


# ---- context parallelism ----

@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_cp_chained_states_bitwise(device, dtype):
    gen = torch.Generator().manual_seed(3)
    lens = [45, 20]
    q, k, v = (torch.randn(65, h, 16, generator=gen).to(device, dtype) for h in (4, 2, 2))
    cu = cu_of(lens, device)
    out, lse = attention(q, k, v, cu)
    bn = _block_n(device, dtype)
    state = None
    for lo, hi in ((0, bn), (bn, 2 * bn), (2 * bn, None)):
        o, l, state = attention_partial(q, k, v, cu, kv_start=lo, kv_end=hi, state=state)
    assert torch.equal(o, out) and torch.equal(l, lse)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cp_merge_within_contract(device, dtype):
    """Independent ranges (aligned and not) merged from normalized partials: within the contract."""
    from rlk_triton.reference.attention import attention_reference
    from rlk_triton.testing.attention_parity import _scales

    gen = torch.Generator().manual_seed(4)
    lens = [45, 20]
    q, k, v = (torch.randn(65, h, 16, generator=gen).to(device, dtype) for h in (4, 2, 2))
    cu = cu_of(lens, device)
    bn = _block_n(device, dtype)
    parts = [attention_partial(q, k, v, cu, kv_start=lo, kv_end=hi) for lo, hi in ((0, bn), (bn, 2 * bn), (2 * bn, None))]
    out, lse = merge_attention_partials([p[0] for p in parts], [p[1] for p in parts])
    q64, k64, v64 = (x.double().cpu().numpy() for x in (q, k, v))
    cu64 = cu.cpu().numpy().astype(np.int64)
    ref_o, ref_l = attention_reference(q64, k64, v64, cu64, 0.25, True)
    so, sl, *_ = _scales(q64, k64, v64, None, None, cu64, 0.25, True, ref_o, dtype)
    ratios = judge_errors({"out": (out.double().cpu().numpy(), ref_o, so),
                           "lse": (lse.double().cpu().numpy(), ref_l, sl)}, dtype, arch_of(torch.device(device)))
    assert max(ratios.values()) <= 1.0, ratios
    with pytest.raises(InputError, match="kv_start"):
        attention_partial(q, k, v, cu, kv_start=bn + 1)


# ---- typed errors ----

def test_typed_errors(device):
    q = torch.randn(10, 4, 16, device=device)
    k = torch.randn(10, 2, 16, device=device)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=device)
    with pytest.raises(DTypeError, match="^k"):
        attention(q, k.half(), k, cu)
    with pytest.raises(ShapeError, match="^k"):
        attention(q, torch.randn(10, 3, 16, device=device), torch.randn(10, 3, 16, device=device), cu)
    with pytest.raises(ShapeError, match="^q"):
        attention(torch.randn(10, 4, 24, device=device), torch.randn(10, 2, 24, device=device),
                  torch.randn(10, 2, 24, device=device), cu)
    with pytest.raises(LayoutError, match="^q"):
        attention(torch.randn(10, 4, 32, device=device)[:, :, ::2], k, k, cu)
    with pytest.raises(DTypeError, match="^cu_seqlens"):
        attention(q, k, k, cu.long())
    with pytest.raises(InputError, match="^cu_seqlens"):
        attention(q, k, k, torch.tensor([0, 4, 9], dtype=torch.int32, device=device))
    with pytest.raises(InputError, match="^max_seqlen"):
        attention(q, k, k, cu, max_seqlen=3)
    with pytest.raises(InputError, match="^scale"):
        attention(q, k, k, cu, scale=float("nan"))
    bn = _block_n(device, torch.float32, "attention_decode")
    kc = torch.randn(4, bn + 1, 2, 16, device=device)
    bt = torch.zeros(1, 2, dtype=torch.int32, device=device)
    sl = torch.tensor([3], dtype=torch.int32, device=device)
    with pytest.raises(LayoutError, match="^k_cache"):
        attention_decode(q[:1], kc, kc, bt, sl)
    kc = torch.randn(4, bn, 2, 16, device=device)
    with pytest.raises(DTypeError, match="^block_table"):
        attention_decode(q[:1], kc, kc, bt.long(), sl)
    with pytest.raises(InputError, match="^cache_seqlens"):
        attention_decode(q[:1], kc, kc, bt, torch.tensor([2 * bn + 1], dtype=torch.int32, device=device))
    with pytest.raises(ShapeError, match="^q"):
        attention_decode(q[:2], kc, kc, bt, sl)
    if device == "cpu":
        with pytest.raises(DeviceError):
            attention(q, k.to("meta"), k.to("meta"), cu)


def test_lse_gradient_only(device):
    """Backward through the LSE alone (dout None) matches the reference."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(20, h, 16, generator=gen, dtype=torch.float64).float().to(device).requires_grad_()
               for h in (2, 1, 1))
    _, lse = attention(q, k, v)
    w = torch.randn(2, 20, generator=gen).to(device)
    (lse * w).sum().backward()
    q64, k64, v64 = (x.detach().double().cpu().numpy() for x in (q, k, v))
    cu, do, w64 = np.array([0, 20]), np.zeros((20, 2, 16)), w.double().cpu().numpy()
    ref = attention_grad_reference(q64, k64, v64, cu, 0.25, True, do, w64)
    out64, _ = attention_reference(q64, k64, v64, cu, 0.25, True)
    _, _, *sens = _scales(q64, k64, v64, do, w64, cu, 0.25, True, out64, torch.float32)
    ratios = judge_errors({name: (x.grad.double().cpu().numpy(), r, s)
                           for name, x, r, s in zip(("dq", "dk", "dv"), (q, k, v), ref, sens)},
                          torch.float32, arch_of(torch.device(device)))
    assert max(ratios.values()) <= 1.0, ratios


def test_custom_op_fake_and_autograd_registration(device):
    from rlk_triton.ops.attention import attention_fwd

    q = torch.randn(10, 4, 16, device=device, requires_grad=True)
    k = torch.randn(10, 2, 16, device=device, requires_grad=True)
    v = torch.randn(10, 2, 16, device=device, requires_grad=True)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=device)
    torch.library.opcheck(attention_fwd, (q, k, v, cu, 6, 0.25, True),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_package_level_call_is_attention(device):
    """The issue's spelling, rlk_triton.attention(q, k, v, ...), is the same function."""
    import rlk_triton

    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(30, h, 16, generator=gen).to(device) for h in (2, 1, 1))
    cu = cu_of([30], device)
    a = rlk_triton.attention(q, k, v, cu)
    b = attention(q, k, v, cu)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_an_unused_lse_costs_no_zeros_in_the_backward(device, monkeypatch):
    """Only out gets a gradient: the backward receives no lse gradient (None, so the preprocess
    kernel's HAS_DLSE branch is off) instead of a materialized [Hq, N] of zeros, and the gradients are
    the ones a zero lse gradient gives, bit for bit."""
    from rlk_triton.ops import attention as attention_ops

    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(20, 2, 16, generator=gen).to(device) for _ in range(3))
    dout = torch.randn(20, 2, 16, generator=gen).to(device)
    seen, real = [], attention_ops.call_attention_bwd

    def spy(*args):
        seen.append(args[1])
        return real(*args)

    monkeypatch.setattr(attention_ops, "call_attention_bwd", spy)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = attention(*leaves)
    alone = torch.autograd.grad(out, leaves, dout)
    assert seen == [None]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = attention(*leaves)
    with_zero = torch.autograd.grad((out, lse), leaves, (dout, torch.zeros_like(lse)))
    assert seen[1] is not None
    for a, b in zip(alone, with_zero):
        assert torch.equal(a, b)
