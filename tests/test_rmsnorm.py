"""RMSNorm (rlk_triton.ops.rmsnorm): parity with the float64 reference judged by contracts/rmsnorm.yaml,
bitwise batch invariance of values and d x, the fused residual's downcast point, dW's fixed order and
determinism, typed errors, layouts, torch.compile."""
import itertools

import numpy as np
import pytest
import torch

from rlk_triton import configs
from rlk_triton._runtime import arch_of
from rlk_triton.errors import DeviceError, DTypeError, InputError, LayoutError, ShapeError
from rlk_triton.ops.rmsnorm import rms_norm, rms_norm_fwd
from rlk_triton.reference.norms import rms_norm_grad_reference, rms_norm_reference
from rlk_triton.testing import assert_batch_invariant
from rlk_triton.testing.rowwise import NormCase, judge_rmsnorm, make_hidden, make_norm_weight, rmsnorm_row_op

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _inputs(n, H, dtype, device, seed=0, offset=0.0):
    gen = torch.Generator().manual_seed(seed)
    x = make_hidden(n, H, dtype, 1.0, gen, device)
    r = make_hidden(n, H, dtype, 2.0, gen, device)
    w = make_norm_weight(H, dtype, offset, gen, device)
    return x, r, w


# ---- the float64 reference itself ----

@pytest.mark.parametrize("residual", (False, True))
def test_reference_gradients_match_finite_differences(residual):
    rng = np.random.default_rng(0)
    h, w = rng.normal(size=(3, 7)), rng.normal(size=7)
    g, gr = rng.normal(size=(3, 7)), rng.normal(size=(3, 7)) if residual else None
    eps, off = 1e-2, 0.5

    def loss(h_, w_):
        y, _ = rms_norm_reference(h_, w_, eps, off)
        return np.sum(y * g) + (np.sum(h_ * gr) if residual else 0.0)

    dh, dw = rms_norm_grad_reference(h, w, g, eps, off, gr)
    step = 1e-6
    for idx in itertools.product(range(3), range(7)):
        e = np.zeros_like(h)
        e[idx] = step
        assert abs((loss(h + e, w) - loss(h - e, w)) / (2 * step) - dh[idx]) < 1e-7
    for j in range(7):
        e = np.zeros_like(w)
        e[j] = step
        assert abs((loss(h, w + e) - loss(h, w - e)) / (2 * step) - dw[j]) < 1e-7


# ---- parity, judged by the contract ----

CASES = [NormCase(5, H, dt, res, off, 1.0, lay, seed=i)
         for i, (H, dt, (res, off, lay)) in enumerate(itertools.product(
             (1, 64, 1000), DTYPES,
             ((False, 0.0, "contiguous"), (True, 1.0, "row_stride"), (True, 0.0, "contiguous"))))]
# Three hidden tiles on the interpreter (9000 > its 4096 tile), extreme scales, an fp32 weight.
CASES += [NormCase(3, 9000, dt, True, 0.0, 1.0, "contiguous", seed=100 + i) for i, dt in enumerate(DTYPES)]
CASES += [NormCase(4, 256, dt, True, 1.0, scale, "contiguous", seed=200 + i)
          for i, (dt, scale) in enumerate(itertools.product(DTYPES, (1e-3, 100.0)))]
CASES += [NormCase(4, 320, dt, res, 0.0, 1.0, "contiguous", weight_fp32=True, seed=300 + i)
          for i, (dt, res) in enumerate(itertools.product((torch.bfloat16, torch.float16), (False, True)))]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label().replace(" ", "-"))
def test_rmsnorm_within_contract(case, device):
    ratios = judge_rmsnorm(case, device)
    assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: error / contract bound {ratios}"
    assert {"y", "grad_x", "grad_weight"} <= set(ratios)


@pytest.mark.gpu
@pytest.mark.parametrize("H", (1, 64, 1000, 4096, 8192, 16384, 20000))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rmsnorm_within_contract_gpu(H, dtype):
    for res, off, lay in ((False, 0.0, "contiguous"), (True, 1.0, "row_stride")):
        case = NormCase(256, H, dtype, res, off, 1.0, lay, seed=H)
        ratios = judge_rmsnorm(case, "cuda")
        assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: {ratios}"


# ---- batch invariance (values and d x / d residual) ----

@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("residual", (False, True))
def test_rmsnorm_batch_invariant(dtype, residual, device):
    report = assert_batch_invariant(rmsnorm_row_op(300, dtype, device, residual, 1.0 if residual else 0.0),
                                    probe_rows=2, batch_sizes=(3, 7))
    assert {r.axis for r in report.results} == {"repeat", "batch_size", "row_position", "padding_rows",
                                                "neighbours"}


def test_rmsnorm_batch_invariant_multi_tile(device):
    assert_batch_invariant(rmsnorm_row_op(8300, torch.float16, device, True), probe_rows=1, batch_sizes=(3,))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", (1000, 4096, 8192, 20000))
def test_rmsnorm_batch_invariant_gpu(H, dtype):
    for residual in (False, True):
        assert_batch_invariant(rmsnorm_row_op(H, dtype, "cuda", residual), probe_rows=4, batch_sizes=(5, 64, 1000))


@pytest.mark.parametrize("rows", (2, 4))
@pytest.mark.parametrize("residual", (False, True))
def test_multi_row_forward_within_contract_and_invariant(rows, residual, device, monkeypatch):
    """The [rows, H] forward kernel (configs "rmsnorm_fwd_rows" > 1): within the contract, and a
    row's bits do not depend on which slot of a program's tile it lands in (batch size, position,
    neighbours, padding)."""
    arch = arch_of(torch.device(device))
    H = 300 if device == "cpu" else 4096
    for dt in (torch.bfloat16, torch.float32):
        key = ("rmsnorm_fwd_rows", configs.table_arch(arch, "rmsnorm_fwd_rows"), str(dt).removeprefix("torch."),
               configs.v_bucket(H))
        monkeypatch.setitem(configs.LOCKED_CONFIGS, key, configs.LaunchConfig(rows, 1, 1))
        case = NormCase(7, H, dt, residual, 1.0 if residual else 0.0, 1.0, "contiguous", seed=rows)
        ratios = judge_rmsnorm(case, device)
        assert all(r <= 1.0 for r in ratios.values()), ratios
        assert_batch_invariant(rmsnorm_row_op(H, dt, device, residual), probe_rows=2,
                               batch_sizes=(3, 9) if device == "cpu" else (5, 1001))


@pytest.mark.parametrize("rows", (1, 2))
@pytest.mark.parametrize("residual", (False, True))
def test_a_call_without_a_graph_gives_the_bits_of_one_that_saves_rstd(rows, residual, device, monkeypatch):
    """A forward that records no graph (a rollout) runs the kernels with the rstd store compiled out
    (STORE_RSTD): y and the residual stream are the bits of the forward that saves rstd for backward,
    on the one-tile, multi-tile and rows kernels. Rollout (no grad) and training (grad) agreeing
    bitwise rests on this."""
    from rlk_triton.ops import rmsnorm as module

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("with_rstd", True))
        return launch_forward(*args, **kwargs)

    launch_forward = module.launch_forward
    monkeypatch.setattr(module, "launch_forward", spy)
    for H in (300, 5000) if device == "cpu" else (4096, 20000):
        for dt in (torch.bfloat16, torch.float32):
            key = ("rmsnorm_fwd_rows", configs.table_arch(arch_of(torch.device(device)), "rmsnorm_fwd_rows"),
                   str(dt).removeprefix("torch."), configs.v_bucket(H))
            monkeypatch.setitem(configs.LOCKED_CONFIGS, key, configs.LaunchConfig(rows, 1, 1))
            x, r, w = _inputs(5, H, dt, device, seed=H)
            kw = dict(residual=r) if residual else {}
            with torch.no_grad():
                rollout = rms_norm(x, w, eps=1e-5, **kw)
            training = rms_norm(x.clone().requires_grad_(), w, eps=1e-5, **kw)
            for a, b in zip(*((o,) if not residual else o for o in (rollout, training))):
                assert torch.equal(a, b.detach()), (H, dt)
    assert seen == [False, True] * 4, "a no-grad call took the path that stores rstd, or a recording one did not"


# ---- the downcast point of the fused residual ----

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", (300, 9000))
def test_fused_residual_equals_norm_of_the_returned_stream(H, dtype, device):
    """h = dtype(x + residual) is what gets normalized: fused == unfused on h, bitwise."""
    x, r, w = _inputs(3, H, dtype, device)
    y, h = rms_norm(x, w, residual=r, eps=1e-5)
    if not (dtype == torch.bfloat16 and device == "cpu"):  # the interpreter truncates bf16 stores
        assert torch.equal(h, (x.float() + r.float()).to(dtype))
    assert torch.equal(y, rms_norm(h, w, eps=1e-5))


def test_residual_gradients_are_equal_and_separate(device):
    x, r, w = _inputs(4, 200, torch.bfloat16, device)
    x.requires_grad_(True)
    r.requires_grad_(True)
    y, h = rms_norm(x, w, residual=r)
    gy, gh = torch.randn_like(y), torch.randn_like(h)
    ((y * gy).sum() + (h * gh).sum()).backward()
    assert torch.equal(x.grad, r.grad) and x.grad.data_ptr() != r.grad.data_ptr()
    # a second backward accumulates into each .grad separately
    before = r.grad.clone()
    y2, _ = rms_norm(x, w, residual=r)
    (y2 * gy).sum().backward()
    assert not torch.equal(r.grad, before) and torch.equal(x.grad, r.grad)


# ---- d weight: fixed row partition, deterministic ----

def _dw(x, w, gy, residual=None):
    wl = w.detach().requires_grad_(True)
    xl = x.detach().requires_grad_(True)
    out = rms_norm(xl, wl, residual=residual)
    y = out[0] if residual is not None else out
    dx, dw = torch.autograd.grad(y, (xl, wl), gy)
    return dx, dw


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_dweight_is_run_to_run_deterministic_and_dx_independent_of_it(dtype, device):
    x, r, w = _inputs(11, 300, dtype, device)
    gy = torch.randn(11, 300).to(device, dtype)
    a, b = _dw(x, w, gy, r), _dw(x, w, gy, r)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    xl = x.detach().requires_grad_(True)
    dx_only, = torch.autograd.grad(rms_norm(xl, w, residual=r)[0], xl, gy)  # weight frozen: no dW pass
    assert torch.equal(dx_only, a[0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU contracts a * b + c into FMAs")
@pytest.mark.parametrize("H", (300, 9000))
def test_dweight_follows_the_documented_order(H, device):
    """Blocks of R rows summed in row order, then partials folded in lanes of BLOCK_B, then one sum
    (reduction.py): emulated in fp32 torch, bitwise (the interpreter rounds like NumPy)."""
    N = 11
    x, _, w = _inputs(N, H, torch.float32, device)
    gy = torch.randn(N, H).to(device)
    _, dw = _dw(x, w, gy)
    arch = arch_of(x.device)
    R = configs.lookup("rmsnorm_dw_rows", arch, torch.float32, H).block_v
    B = configs.lookup("rmsnorm_dw_reduce", arch, torch.float32, H).block_v
    rstd = rms_norm_fwd(x, w, None, 1e-6, 0.0)[2]  # the kernel's saved rstd
    terms = gy * (x * rstd[:, None])
    n_blocks = -(-N // R)
    partial = torch.zeros(n_blocks, H)
    for i in range(N):
        partial[i // R] = partial[i // R] + terms[i]
    lanes = torch.zeros(B, H)
    for b in range(n_blocks):
        lanes[b % B] = lanes[b % B] + partial[b]
    assert n_blocks > B == 2  # several blocks and lane groups; tl.sum over 2 lanes is one add
    assert torch.equal(dw, lanes[0] + lanes[1])


@pytest.mark.gpu
def test_dweight_deterministic_gpu():
    x, r, w = _inputs(16384, 4096, torch.bfloat16, "cuda")
    gy = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    ref = _dw(x, w, gy, r)
    for _ in range(3):
        got = _dw(x, w, gy, r)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


# ---- weights, offsets, shapes ----

def test_gemma_offset_equals_a_shifted_fp32_weight(device):
    x, _, _ = _inputs(4, 500, torch.bfloat16, device)
    w = torch.randn(500).to(device) * 0.1
    assert torch.equal(rms_norm(x, w, weight_offset=1.0), rms_norm(x, w + 1.0))


def test_leading_shapes_match_flattened(device):
    x, r, w = _inputs(2 * 3, 130, torch.float16, device)
    y3, h3 = rms_norm(x.view(2, 3, 130), w, residual=r.view(2, 3, 130))
    y2, h2 = rms_norm(x, w, residual=r)
    assert y3.shape == (2, 3, 130) and torch.equal(y3.reshape(6, 130), y2) and torch.equal(h3.reshape(6, 130), h2)
    one = rms_norm(x[1], w)
    assert one.shape == (130,) and torch.equal(one, rms_norm(x, w)[1])
    wide = torch.zeros(6, 200, dtype=torch.float16, device=device)
    wide[:, 10:140] = x
    assert torch.equal(rms_norm(wide[:, 10:140], w), rms_norm(x, w))  # row-strided, read in place


def test_empty_rows(device):
    x = torch.zeros(0, 64, device=device, requires_grad=True)
    w = torch.ones(64, device=device, requires_grad=True)
    y = rms_norm(x, w)
    y.sum().backward()
    assert y.shape == (0, 64) and torch.equal(w.grad, torch.zeros(64, device=device))


def test_zero_rows_are_finite(device):
    x = torch.zeros(3, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    w = torch.ones(64, dtype=torch.bfloat16, device=device)
    y = rms_norm(x, w)
    y.float().sum().backward()
    assert torch.equal(y, torch.zeros_like(y)) and torch.isfinite(x.grad.float()).all()


def test_under_torch_compile(device):
    x, r, w = _inputs(4, 96, torch.float32, device)

    def f(x, r, w):
        y, h = rms_norm(x, w, residual=r, weight_offset=1.0)
        return (y * 1.5).sum() + h.sum()

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    ins_a = [t.clone().requires_grad_(True) for t in (x, r, w)]
    ins_b = [t.clone().requires_grad_(True) for t in (x, r, w)]
    a, b = f(*ins_a), compiled(*ins_b)
    a.backward()
    b.backward()
    assert torch.equal(a, b)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(ins_a, ins_b))


# ---- typed errors ----

@pytest.mark.parametrize("make,error,argument", [
    (lambda x, w, r: rms_norm(x.double(), w.double()), DTypeError, "x"),
    (lambda x, w, r: rms_norm(x.to(torch.int32), w), DTypeError, "x"),
    (lambda x, w, r: rms_norm(x.tolist(), w), DTypeError, "x"),
    (lambda x, w, r: rms_norm(x, w.half()), DTypeError, "weight"),
    (lambda x, w, r: rms_norm(x, w[:-1]), ShapeError, "weight"),
    (lambda x, w, r: rms_norm(x, w.view(2, -1)), ShapeError, "weight"),
    (lambda x, w, r: rms_norm(x, torch.stack([w, w], 1)[:, 0]), LayoutError, "weight"),
    (lambda x, w, r: rms_norm(x, w, residual=r[:, :-1]), ShapeError, "residual"),
    (lambda x, w, r: rms_norm(x, w, residual=r.float()), DTypeError, "residual"),
    (lambda x, w, r: rms_norm(x, w, residual=torch.stack([r, r], -1)[..., 0]), LayoutError, "residual"),
    (lambda x, w, r: rms_norm(torch.stack([x, x], -1)[..., 0], w), LayoutError, "x"),
    (lambda x, w, r: rms_norm(x[:, :0], w[:0]), ShapeError, "x"),
    (lambda x, w, r: rms_norm(x, w, eps=0.0), InputError, "eps"),
    (lambda x, w, r: rms_norm(x, w, eps=float("nan")), InputError, "eps"),
    (lambda x, w, r: rms_norm(x, w, weight_offset=float("inf")), InputError, "weight_offset"),
    (lambda x, w, r: rms_norm(x, w.to("meta")), DeviceError, "weight"),
])
def test_typed_errors_name_the_argument(make, error, argument, device):
    x, r, w = _inputs(3, 64, torch.bfloat16, device)
    with pytest.raises(error) as e:
        make(x, w, r)
    assert e.value.argument == argument


@pytest.mark.gpu
def test_eps_is_a_runtime_value_gpu():
    from rlk_triton.ops.rmsnorm import _fwd_kernel

    x, _, w = _inputs(8, 4096, torch.bfloat16, "cuda")
    rms_norm(x, w, eps=1e-6)
    before = sum(len(c[0]) for c in _fwd_kernel.device_caches.values())
    for eps in (1e-5, 1e-6, 3e-7):
        rms_norm(x, w, eps=eps, weight_offset=eps)
    assert sum(len(c[0]) for c in _fwd_kernel.device_caches.values()) == before
