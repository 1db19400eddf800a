"""The batch-invariant matmul: parity with float64 (contracts/matmul.yaml), bitwise row invariance of
out and d a, deterministic d b / d bias, typed errors."""
import pytest
import torch

from rlk_triton.errors import DTypeError, ShapeError
from rlk_triton.ops.matmul import matmul
from rlk_triton.testing import check_batch_invariance
from rlk_triton.testing.matmul_parity import MatmulCase, build_matmul_case, judge_matmul, matmul_row_op

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,bias,scale", [((37, 70, 50), True, 1.0), ((5, 64, 96), False, 30.0),
                                              ((1, 3, 130), True, 1.0)])
def test_parity_within_contract(device, dtype, shape, bias, scale):
    m, n, k = shape
    ratios = judge_matmul(MatmulCase(m, n, k, dtype, bias, scale, seed=m + k), device)
    assert max(ratios.values()) <= 1.0, ratios


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_parity_gpu_llm_shapes(dtype):
    for m, n, k in ((256, 4096, 4096), (77, 1000, 14336)):
        ratios = judge_matmul(MatmulCase(m, n, k, dtype, True, 1.0, seed=m), "cuda")
        assert max(ratios.values()) <= 1.0, ratios


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_rows_and_row_gradients_are_batch_invariant(device, dtype):
    n, k = (70, 50) if device == "cpu" else (4096, 4096)
    report = check_batch_invariance(matmul_row_op(n, k, dtype, device),
                                    batch_sizes=(5, 40) if device == "cpu" else (5, 1000))
    assert report.passed, report.failures()[:5]


def test_weight_and_bias_gradients_bitwise_on_repeat(device):
    a, b, bias, g = build_matmul_case(MatmulCase(45, 33, 70, torch.bfloat16, seed=5), device)
    grads = []
    for _ in range(2):
        lb, lbias = b.detach().requires_grad_(), bias.detach().requires_grad_()
        matmul(a, lb, lbias).backward(g)
        grads.append((lb.grad, lbias.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_linear_layout_and_leading_dims(device):
    a, b, _, _ = build_matmul_case(MatmulCase(8, 20, 30, torch.float32, bias=False), device)
    weight = b.t().contiguous()  # [N, K] as nn.Linear holds it
    flat = matmul(a, weight.t())
    assert torch.equal(matmul(a.view(2, 4, 30), weight.t()).reshape(8, 20), flat)
    assert torch.equal(flat, matmul(a, b))


def test_typed_errors(device):
    a, b, bias, _ = build_matmul_case(MatmulCase(4, 6, 8, torch.float32), device)
    with pytest.raises(ShapeError, match="b"):
        matmul(a, b[:-1])
    with pytest.raises(DTypeError, match="b"):
        matmul(a, b.half())
    with pytest.raises(ShapeError, match="bias"):
        matmul(a, b, bias[:-1])
    with pytest.raises(DTypeError, match="a"):
        matmul(a.double(), b)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_descriptor_kernel_gives_the_pointer_kernel_bits(device, dtype):
    """matmul_into's persistent TMA-descriptor kernel changes loading and scheduling only: with
    C_in accumulation, a bias, a transposed b (weight.t()), a transposed a (linear_logp's d weight,
    d_logits.t()), and tails in M, N and K, every output bit equals the pointer kernel's."""
    import dataclasses

    from rlk_triton import configs
    from rlk_triton._runtime import arch_of
    from rlk_triton.ops.matmul import matmul_into, tma_ready

    gen = torch.Generator().manual_seed(7)
    M, K, N = (40, 72, 136) if device == "cpu" else (1000, 4104, 4160)  # M x 2 bytes 16-aligned: A^T rows
    a = torch.randn(M, K, generator=gen).to(device, dtype)
    b = torch.randn(K, N, generator=gen).to(device, dtype)
    c_in = torch.randn(M, N, generator=gen).to(device)
    bias = torch.randn(N, generator=gen).to(device, dtype)
    assert tma_ready(a, b)
    base = configs.lookup_matmul("matmul", arch_of(torch.device(device)), dtype)
    outs = []
    w = b.t().contiguous()  # a linear layer's weight [N, K]: b = w.t() reaches the kernel as B^T
    a_rows = a.t().contiguous()  # [K, M]: a = a_rows.t() reaches the kernel as A^T
    assert tma_ready(w, a_rows)
    for flag in (False, True):
        cfg = dataclasses.replace(base, persistent_tma=flag)
        outs.append((matmul_into(a, b, torch.empty(M, N, device=device), c_in=c_in, cfg=cfg, bias=bias),
                     matmul_into(a, b, torch.empty(M, N, device=device, dtype=dtype), cfg=cfg),
                     matmul_into(a, w.t(), torch.empty(M, N, device=device, dtype=dtype), cfg=cfg, bias=bias),
                     matmul_into(a_rows.t(), b, torch.empty(M, N, device=device, dtype=dtype), cfg=cfg),
                     matmul_into(a_rows.t(), w.t(), torch.empty(M, N, device=device), c_in=c_in, cfg=cfg)))
    for x, y in zip(*outs):
        assert torch.equal(x, y)


def test_a_remembered_plan_checks_each_calls_alignment_and_keeps_no_tensor(device):
    """matmul_into decides once per shape, strides, dtype, device and flags (_Plan): a call of the same
    key whose base is 2 bytes off 16 takes the pointer kernel (the descriptor kernel needs aligned
    bases), with the bits of an aligned copy; a transposed layout of equal values is another plan with
    the same bits; and no plan keeps a caller's tensor alive."""
    import dataclasses
    import gc
    import weakref

    from rlk_triton import configs
    from rlk_triton._runtime import arch_of
    from rlk_triton.ops import matmul as mm

    gen = torch.Generator().manual_seed(5)
    M, K, N = 24, 64, 48
    cfg = dataclasses.replace(configs.lookup_matmul("matmul", arch_of(torch.device(device)), torch.bfloat16),
                              persistent_tma=True)
    buf = torch.randn(M * K + 8, generator=gen).to(device, torch.bfloat16)
    aligned, off = buf[:M * K].view(M, K), buf[1:M * K + 1].view(M, K)
    assert mm.tma_ready(aligned) and not mm.tma_ready(off)
    w = torch.randn(N, K, generator=gen).to(device, torch.bfloat16)
    keys = set(mm._PLANS)
    got = [mm.matmul_into(x, w.t(), torch.empty(M, N, device=device), cfg=cfg) for x in (aligned, off)]
    assert len(set(mm._PLANS) - keys) == 1  # one shape, strides and flags: one plan
    want = [mm.matmul_into(x.clone(), w.t().contiguous(), torch.empty(M, N, device=device), cfg=cfg)
            for x in (aligned, off)]
    assert len(set(mm._PLANS) - keys) == 2  # b row-major: another plan
    for x, y in zip(got, want):
        assert torch.equal(x, y)
    ref = weakref.ref(w)
    del w
    gc.collect()
    assert ref() is None


def test_broadcast_operands_take_the_pointer_loads(device):
    """A row-stride-0 operand (expand) is not a TMA descriptor's matrix: tma_ready refuses it, as a
    (transposed) a or b, and the matmul gives the bits of its materialized copy."""
    import dataclasses

    from rlk_triton import configs
    from rlk_triton._runtime import arch_of
    from rlk_triton.ops.matmul import matmul_into, tma_ready

    gen = torch.Generator().manual_seed(3)
    col = torch.randn(40, 1, generator=gen).to(device, torch.bfloat16)
    a = col.expand(40, 64)  # strides (1, 0): a.t() has row stride 0
    b = torch.randn(64, 32, generator=gen).to(device, torch.bfloat16)
    assert not tma_ready(a.t()) and not tma_ready(b[:1].expand(64, 32)) and tma_ready(b)
    cfg = dataclasses.replace(configs.lookup_matmul("matmul", arch_of(torch.device(device)), torch.bfloat16),
                              persistent_tma=True)
    a_dense = torch.randn(40, 64, generator=gen).to(device, torch.bfloat16)
    for x, y in ((a, b), (a_dense, b[:1].expand(64, 32))):  # a broadcast a, then a broadcast b
        got = matmul_into(x, y, torch.empty(x.shape[0], y.shape[1], device=device), cfg=cfg)
        want = matmul_into(x.contiguous(), y.contiguous(), torch.empty(x.shape[0], y.shape[1], device=device),
                           cfg=dataclasses.replace(cfg, persistent_tma=False))
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
@pytest.mark.parametrize("tma", (False, True))
def test_folded_k_ranges_give_the_chained_calls_bits(device, dtype, tma):
    """fold_k: one launch summing K in ranges of fold_k, chained in fp32, gives the bits of one call per
    range with c_in = the previous call's fp32 out (linear_logp's d hidden over vocab chunks): with and
    without a first c_in, a K tail inside the last range, an fp32 or a low-precision final output,
    the pointer and the descriptor kernel."""
    import dataclasses

    from rlk_triton import configs
    from rlk_triton._runtime import arch_of
    from rlk_triton.ops.matmul import matmul_into, tma_ready

    gen = torch.Generator().manual_seed(11)
    base = configs.lookup_matmul("linear_logp_dhidden", arch_of(torch.device(device)), dtype)
    if tma and not (dtype != torch.float32):
        pytest.skip("descriptors take 2-byte operands")
    cfg = dataclasses.replace(base, persistent_tma=tma)
    fold = 2 * cfg.block_k
    M, N = (37, 40) if device == "cpu" else (1000, 4160)
    K = 3 * fold + (cfg.block_k // 2 if dtype == torch.float32 else 8)  # a tail inside the last range
    a = torch.randn(M, K, generator=gen).to(device, dtype)
    b = torch.randn(K, N, generator=gen).to(device, dtype)
    c0 = torch.randn(M, N, generator=gen).to(device)
    if tma:
        assert tma_ready(a, b[:fold])
    for c_in in (None, c0):
        for out_dtype in (torch.float32, dtype):
            acc = c_in
            for k0 in range(0, K, fold):  # one call per range, chained through an fp32 total
                last = k0 + fold >= K
                out = torch.empty(M, N, device=device, dtype=out_dtype if last else torch.float32)
                acc = matmul_into(a[:, k0:k0 + fold], b[k0:k0 + fold], out, c_in=acc, cfg=cfg)
            folded = matmul_into(a, b, torch.empty(M, N, device=device, dtype=out_dtype), c_in=c_in, cfg=cfg,
                                 fold_k=fold)
            assert torch.equal(folded, acc), (c_in is None, out_dtype)
            whole = matmul_into(a, b, torch.empty(M, N, device=device, dtype=torch.float32), c_in=c_in, cfg=cfg)
            assert not torch.equal(whole, folded.float()) or out_dtype != torch.float32  # the fold is another order
