"""linear_logp: parity with the float64 reference (contracts/linear_logp.yaml), bitwise batch
invariance of logp, entropy and d hidden, deterministic d weight / d bias, typed errors."""
import math

import pytest
import torch

from rlk_triton import configs, contracts
from rlk_triton._runtime import arch_of
from rlk_triton.errors import DTypeError, LayoutError, ShapeError, TargetIndexError, TemperatureError
from rlk_triton.logp import linear_logp
from rlk_triton.testing import check_batch_invariance
from rlk_triton.testing.linear_parity import (LinearCase, build_linear_case, judge_linear_logp,
                                              linear_logp_row_op)

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _chunk(device, dtype):
    return configs.lookup_matmul("linear_logp_dlogits", arch_of(torch.device(device)), dtype).chunk_v


@pytest.mark.parametrize("saved", ("recompute", "logits"))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,temperature,bias,scale", [
    ((19, 48, 300), 1.0, False, 3.0),     # several chunks, a partial last chunk, K tail
    ((5, 64, 128), 0.7, True, 10.0),      # exactly one chunk
    ((33, 40, 131), 1.3, True, 1.0),      # V one past a chunk; H not a multiple of block_k
])
def test_parity_within_contract(device, dtype, shape, temperature, bias, scale, saved):
    n, h, v = shape
    ratios = judge_linear_logp(LinearCase(n, h, v, dtype, temperature, scale, bias, seed=n + v, saved=saved), device)
    assert set(ratios) >= {"logp", "entropy", "d_hidden", "d_weight"}
    assert max(ratios.values()) <= 1.0, ratios


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,saved", [((64, 4096, 32000), "recompute"), ((96, 1024, 151936), "recompute"),
                                         ((33, 512, 4099), "recompute"),
                                         ((96, 1024, 151936), "logits"), ((33, 512, 4099), "logits")])
def test_parity_gpu_shapes(dtype, shape, saved):
    n, h, v = shape
    for bias, t in ((False, 1.0), (True, 0.7)):
        ratios = judge_linear_logp(LinearCase(n, h, v, dtype, t, 5.0, bias, seed=v, saved=saved), "cuda")
        assert max(ratios.values()) <= 1.0, ratios


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_batch_invariance_of_values_and_d_hidden(device, dtype):
    V = 2 * _chunk(device, dtype) + 37 if device == "cpu" else 4099
    report = check_batch_invariance(linear_logp_row_op(48 if device == "cpu" else 256, V, dtype, device),
                                    batch_sizes=(5, 21) if device == "cpu" else (5, 300))
    assert report.passed, report.failures()[:5]


@pytest.mark.gpu
def test_batch_invariance_gpu_llm_shape():
    report = check_batch_invariance(linear_logp_row_op(4096, 151936, torch.bfloat16, "cuda"),
                                    batch_sizes=(7, 1000))
    assert report.passed, report.failures()[:5]


def _fwd_bwd(hidden, weight, bias, targets, g, ge, T=0.9):
    leaves = [x.detach().clone().requires_grad_() if x is not None else None for x in (hidden, weight, bias)]
    logp, ent = linear_logp(leaves[0], leaves[1], targets, bias=leaves[2], temperature=T, return_entropy=True)
    ((logp * g).sum() + (ent * ge).sum()).backward()
    return logp, ent, [x.grad for x in leaves if x is not None]


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_d_weight_and_d_bias_bitwise_on_repeat(device, dtype):
    hidden, weight, bias, targets = build_linear_case(LinearCase(23, 40, 300, dtype, bias=True, seed=3), device)
    g, ge = torch.randn(23, device=device), torch.randn(23, device=device)
    a = _fwd_bwd(hidden, weight, bias, targets, g, ge)
    b = _fwd_bwd(hidden, weight, bias, targets, g, ge)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for x, y in zip(a[2], b[2]):
        assert torch.equal(x, y)


def _with_descriptor_path(monkeypatch, device, dtype, flag):
    """Set persistent_tma on the locked linear_logp rows this device uses, and on the matmul row of d
    weight (d_logits^T @ hidden: A^T through a descriptor)."""
    import dataclasses

    arch = arch_of(torch.device(device))
    dt = str(dtype).removeprefix("torch.")
    for kernel, bucket in (("linear_logp_fwd", "any"), ("linear_logp_dlogits", "any"), ("linear_logp_dhidden", "any"),
                           ("matmul", configs.M_BUCKET_NAMES[-1])):
        key = (kernel, configs.table_arch(arch, kernel), dt, bucket)
        monkeypatch.setitem(configs.LOCKED_CONFIGS, key,
                            dataclasses.replace(configs.LOCKED_CONFIGS[key], persistent_tma=flag))


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_descriptor_path_gives_the_pointer_path_bits(device, dtype, monkeypatch, kernel_spy):
    """The persistent TMA-descriptor kernels change loading and scheduling only: every output and
    gradient must be bitwise the pointer kernels' (tails in rows, vocab and K included; a vocab of
    16-byte d logits rows, so that d weight reads them through a descriptor)."""
    n, h, v = (37, 48, 304) if device == "cpu" else (300, 520, 9000)
    hidden, weight, bias, targets = build_linear_case(LinearCase(n, h, v, dtype, bias=True, seed=5), device)
    g, ge = torch.randn(n, device=device), torch.randn(n, device=device)
    from rlk_triton.ops import matmul as mm

    launches = []
    kernel_spy(mm, "_matmul_desc_kernel", lambda _, meta: launches.append((meta["A_T"], meta["B_T"])))
    runs = []
    for flag in (False, True):
        _with_descriptor_path(monkeypatch, device, dtype, flag)
        runs.append(_fwd_bwd(hidden, weight, bias, targets, g, ge))
    assert (True, False) in launches and (False, False) in launches  # d weight (A^T) and d hidden ran
    (lp0, e0, g0), (lp1, e1, g1) = runs
    assert torch.equal(lp0, lp1) and torch.equal(e0, e1)
    for x, y in zip(g0, g1):
        assert torch.equal(x, y)


@pytest.mark.parametrize("saved", ("recompute", "logits"))
def test_chunks_per_pass_gives_the_chunk_by_chunk_bits(device, saved, monkeypatch):
    """configs chunks_per_pass: d logits of several vocab chunks per pass and d hidden folding them in
    one launch (matmul FOLD_K) give every gradient the bits of one pass per chunk (bias, a vocab tail,
    a last pass of fewer chunks, both saved-state policies). bf16 runs the same launchers (and the
    matmul test checks the fold for 2-byte operands through descriptors)."""
    import dataclasses

    dtype = torch.float32  # fp32 gradients: no final rounding to hide another summation order
    arch = arch_of(torch.device(device))
    key = ("linear_logp_dlogits", configs.table_arch(arch, "linear_logp_dlogits"), "float32", "any")
    C = configs.LOCKED_CONFIGS[key].chunk_v
    n, h, v = (29, 48, 5 * C + 44) if device == "cpu" else (300, 520, 5 * C + 300)
    hidden, weight, bias, targets = build_linear_case(LinearCase(n, h, v, dtype, bias=True, seed=12), device)
    g, ge = torch.randn(n, device=device), torch.randn(n, device=device)
    runs = []
    for per_pass in (1, 2, 4):
        monkeypatch.setitem(configs.LOCKED_CONFIGS, key,
                            dataclasses.replace(configs.LOCKED_CONFIGS[key], chunks_per_pass=per_pass))
        leaves = [x.detach().clone().requires_grad_() for x in (hidden, weight, bias)]
        logp, ent = linear_logp(*leaves[:2], targets, bias=leaves[2], temperature=0.9, return_entropy=True,
                                saved=saved)
        ((logp * g).sum() + (ent * ge).sum()).backward()
        runs.append([x.grad for x in leaves])
    for other in runs[1:]:
        for x, y in zip(runs[0], other):
            assert torch.equal(x, y)


def test_chunks_per_pass_stay_within_the_pass_workspace_cap():
    """configs.pass_workspace_max: a call takes the table's chunks_per_pass until one pass's d logits would
    pass the cap, then fewer, never fewer than one (the bits are the same either way: the test above)."""
    import dataclasses

    from rlk_triton.ops.linear_logp import pass_chunks

    cfg = dataclasses.replace(configs.MatmulConfig(16, 64, 32, 4, 4, 1), chunk_v=64, chunks_per_pass=8,
                              pass_workspace_max=8 * 64 * 100 * 2)  # 8 chunks of 100 rows in 2 bytes
    assert pass_chunks(cfg, 1, 2) == pass_chunks(cfg, 100, 2) == 8
    assert pass_chunks(cfg, 101, 2) == 7 and pass_chunks(cfg, 200, 2) == 4 and pass_chunks(cfg, 100, 4) == 4
    assert pass_chunks(cfg, 10 ** 6, 2) == 1
    assert pass_chunks(dataclasses.replace(cfg, pass_workspace_max=0), 10 ** 6, 2) == 8
    sm90 = configs.LOCKED_CONFIGS[("linear_logp_dlogits", "sm90", "bfloat16", "any")]
    for n_rows in (1, 1024, 8192, 16384, 65536):
        per = pass_chunks(sm90, n_rows, 2)
        assert 1 <= per <= sm90.chunks_per_pass
        assert per == 1 or n_rows * sm90.chunk_v * 2 * per <= sm90.pass_workspace_max


@pytest.mark.parametrize("with_entropy", (True, False))
def test_merge_launch_gives_the_same_bits(device, with_entropy):
    """The merge's launch (rows per program, warps, tiles per unrolled step) never changes a row's
    arithmetic: every launch gives the bits of the tile-by-tile loop (TILES = 1), on the tile states of
    a real forward, with a tile count no step size divides, a row count no block divides and ignored rows."""
    from rlk_triton.ops.linear_logp import (MERGE_BLOCK, MERGE_TILES, MERGE_WARPS, _stats_and_saved, local_targets,
                                            merge)

    n, h, v = (150, 32, 37 * 64 + 5) if device == "cpu" else (1000, 256, 151700)  # 38 / 593 tiles
    hidden, weight, bias, targets = build_linear_case(LinearCase(n, h, v, torch.bfloat16, bias=True, seed=8), device)
    targets = targets.clone()
    targets[::7] = -100
    stats = _stats_and_saved(hidden, weight, bias, local_targets(targets, 0, v, -100), 0.9, with_entropy, 0)[0]
    assert stats.shape[1] % 32 and stats.shape[1] % 16 and stats.shape[1] % 8 and stats.shape[1] % 3 and n % 64
    reference = merge(stats, targets, -100, with_entropy, block=128, num_warps=4, tiles=1)
    assert torch.isfinite(reference[0]).all()
    for block, warps, tiles in ((MERGE_BLOCK, MERGE_WARPS, MERGE_TILES[with_entropy]), (32, 1, 8), (64, 2, 3),
                                (256, 4, 16), (64, 2, 32)):
        out = merge(stats, targets, -100, with_entropy, block=block, num_warps=warps, tiles=tiles)
        for name, x, y in zip(("logp", "entropy", "row_max", "row_logsum"), reference, out):
            assert torch.equal(x, y), (name, block, warps, tiles)


def test_logp_does_not_depend_on_asking_for_entropy(device):
    hidden, weight, bias, targets = build_linear_case(LinearCase(9, 32, 200, torch.float32, bias=True), device)
    lp = linear_logp(hidden, weight, targets, bias=bias, temperature=0.8)
    lp2, _ = linear_logp(hidden, weight, targets, bias=bias, temperature=0.8, return_entropy=True)
    assert torch.equal(lp, lp2)


def test_ignored_rows_give_zero_logp_and_no_logp_gradient(device):
    hidden, weight, _, targets = build_linear_case(LinearCase(6, 32, 150, torch.float32, seed=2), device)
    targets[:] = -100
    h = hidden.clone().requires_grad_()
    lp = linear_logp(h, weight, targets)
    assert torch.equal(lp, torch.zeros_like(lp))
    lp.sum().backward()
    assert torch.equal(h.grad, torch.zeros_like(h.grad))


def test_leading_dims_and_empty_batch(device):
    hidden, weight, _, targets = build_linear_case(LinearCase(8, 32, 150, torch.float32, seed=4), device)
    flat = linear_logp(hidden, weight, targets)
    shaped = linear_logp(hidden.view(2, 4, 32), weight, targets.view(2, 4))
    assert shaped.shape == (2, 4) and torch.equal(shaped.reshape(-1), flat)
    h0 = hidden[:0].clone().requires_grad_()
    w = weight.clone().requires_grad_()
    lp, ent = linear_logp(h0, w, targets[:0], return_entropy=True)
    assert lp.shape == (0,) and ent.shape == (0,)
    (lp.sum() + ent.sum()).backward()
    assert torch.equal(w.grad, torch.zeros_like(w))


def test_invalid_target_nan_without_validation(device):
    hidden, weight, _, targets = build_linear_case(LinearCase(4, 32, 150, torch.float32), device)
    targets[0] = 150
    with pytest.raises(TargetIndexError, match="target_ids"):
        linear_logp(hidden, weight, targets)
    lp = linear_logp(hidden, weight, targets, validate=False)
    assert math.isnan(float(lp[0])) and not torch.isnan(lp[2:]).any()


def test_typed_errors(device):
    hidden, weight, bias, targets = build_linear_case(LinearCase(4, 32, 150, torch.float32, bias=True), device)
    with pytest.raises(ShapeError, match="weight"):
        linear_logp(hidden, weight[:, :16], targets)
    with pytest.raises(DTypeError, match="weight"):
        linear_logp(hidden, weight.double(), targets)
    with pytest.raises(DTypeError, match="weight"):
        linear_logp(hidden, weight.half(), targets)
    with pytest.raises(ShapeError, match="bias"):
        linear_logp(hidden, weight, targets, bias=bias[:-1])
    with pytest.raises(DTypeError, match="bias"):
        linear_logp(hidden, weight, targets, bias=bias.half())
    with pytest.raises(ShapeError, match="target_ids"):
        linear_logp(hidden, weight, targets[:-1])
    with pytest.raises(DTypeError, match="target_ids"):
        linear_logp(hidden, weight, targets.float())
    with pytest.raises(LayoutError, match="weight"):
        linear_logp(hidden, weight.t().contiguous().t(), targets)
    with pytest.raises(TemperatureError):
        linear_logp(hidden, weight, targets, temperature=0.0)
    with pytest.raises(TemperatureError):
        linear_logp(hidden, weight, targets, temperature=torch.tensor(1.0))
    with pytest.raises(ShapeError, match="vocab_start_index"):
        linear_logp(hidden, weight, targets, vocab_start_index=128)
    with pytest.raises(ShapeError, match="global_vocab_size"):
        linear_logp(hidden, weight, targets, global_vocab_size=1000)


def test_contract_rows_exist_for_every_dtype():
    for dt in DTYPES:
        for j in contracts.JUDGMENTS:
            assert contracts.judgment("linear_logp", dt, j)["kind"]


@pytest.mark.gpu
def test_temperature_change_does_not_recompile():
    from rlk_triton.ops import linear_logp as op

    hidden, weight, _, targets = build_linear_case(LinearCase(64, 256, 5000, torch.bfloat16), "cuda")
    linear_logp(hidden, weight, targets, temperature=1.0)
    before = len(op._tile_stats_kernel.device_caches[0][0])
    for t in (0.5, 0.7, 1.3):
        linear_logp(hidden, weight, targets, temperature=t)
    assert len(op._tile_stats_kernel.device_caches[0][0]) == before


def test_under_torch_compile(device):
    hidden, weight, bias, targets = build_linear_case(LinearCase(9, 32, 200, torch.float32, bias=True, seed=8), device)

    def f(h, w, b, t):
        lp, ent = linear_logp(h, w, t, bias=b, temperature=0.8, return_entropy=True, validate=False)
        return (lp + 0.1 * ent).sum()

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    leaves = [x.clone().requires_grad_() for x in (hidden, weight, bias)]
    eager_leaves = [x.clone().requires_grad_() for x in (hidden, weight, bias)]
    out = compiled(*leaves, targets)
    ref = f(*eager_leaves, targets)
    out.backward()
    ref.backward()
    assert torch.equal(out, ref)
    for a, b in zip(leaves, eager_leaves):
        assert torch.equal(a.grad, b.grad)
