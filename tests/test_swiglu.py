"""SwiGLU (rlk_triton.ops.swiglu): parity with the float64 reference judged by contracts/swiglu.yaml,
bitwise batch invariance, the fused [.., 2I] layout read in place, typed errors, torch.compile."""
import itertools

import numpy as np
import pytest
import torch

from rlk_triton.errors import DeviceError, DTypeError, LayoutError, ShapeError
from rlk_triton.ops.swiglu import swiglu
from rlk_triton.reference.norms import swiglu_grad_reference, swiglu_reference
from rlk_triton.testing import assert_batch_invariant
from rlk_triton.testing.rowwise import GluCase, judge_swiglu, swiglu_row_op

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _inputs(n, I, dtype, device, scale=3.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = (torch.randn(n, I, generator=gen) * scale).to(device, dtype)
    u = torch.randn(n, I, generator=gen).to(device, dtype)
    return g, u


def test_reference_gradients_match_finite_differences():
    rng = np.random.default_rng(1)
    g, u, dy = rng.normal(size=(2, 9)) * 4, rng.normal(size=(2, 9)), rng.normal(size=(2, 9))
    dg, du = swiglu_grad_reference(g, u, dy)
    step = 1e-6
    num_dg = (swiglu_reference(g + step, u) - swiglu_reference(g - step, u)) / (2 * step) * dy
    num_du = (swiglu_reference(g, u + step) - swiglu_reference(g, u - step)) / (2 * step) * dy
    assert np.max(np.abs(num_dg - dg)) < 1e-7 and np.max(np.abs(num_du - du)) < 1e-7
    # the tails: no overflow, the right limits
    big = np.array([-1000.0, -90.0, 0.0, 90.0, 1000.0])
    assert np.all(np.isfinite(swiglu_reference(big, np.ones(5))))
    assert swiglu_reference(big, np.ones(5))[-1] == 1000.0


CASES = [GluCase(4, I, dt, scale, layout, seed=i)
         for i, (I, dt, (scale, layout)) in enumerate(itertools.product(
             (1, 300, 5000), DTYPES, ((1.0, "separate"), (30.0, "fused"), (3.0, "separate"))))]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label().replace(" ", "-"))
def test_swiglu_within_contract(case, device):
    ratios = judge_swiglu(case, device)
    assert set(ratios) == {"y", "grad_gate", "grad_up"}
    assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: error / contract bound {ratios}"


@pytest.mark.gpu
@pytest.mark.parametrize("I", (1, 1000, 14336))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_within_contract_gpu(I, dtype):
    for scale, layout in ((1.0, "separate"), (30.0, "fused")):
        case = GluCase(256, I, dtype, scale, layout, seed=I)
        ratios = judge_swiglu(case, "cuda")
        assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: {ratios}"


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("layout", ("separate", "fused"))
def test_swiglu_batch_invariant(dtype, layout, device):
    report = assert_batch_invariant(swiglu_row_op(300, dtype, device, layout), probe_rows=2, batch_sizes=(3, 7))
    assert {r.axis for r in report.results} == {"repeat", "batch_size", "row_position", "padding_rows",
                                                "neighbours"}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("I", (1000, 14336))
def test_swiglu_batch_invariant_gpu(I, dtype):
    for layout in ("separate", "fused"):
        assert_batch_invariant(swiglu_row_op(I, dtype, "cuda", layout), probe_rows=4, batch_sizes=(5, 64, 1000))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_halves_equal_separate_tensors(dtype, device):
    """The halves of a [.., 2I] projection are read in place and give the same bits, gradients too."""
    g, u = _inputs(5, 300, dtype, device)
    gu = torch.cat([g, u], -1).requires_grad_(True)
    gl, ul = g.clone().requires_grad_(True), u.clone().requires_grad_(True)
    a, b = swiglu(gu[:, :300], gu[:, 300:]), swiglu(gl, ul)
    assert torch.equal(a, b)
    dy = torch.randn(5, 300).to(device, dtype)
    a.backward(dy)
    b.backward(dy)
    assert torch.equal(gu.grad[:, :300], gl.grad) and torch.equal(gu.grad[:, 300:], ul.grad)


def test_leading_shapes_and_empty(device):
    g, u = _inputs(6, 70, torch.float16, device)
    y3 = swiglu(g.view(2, 3, 70), u.view(2, 3, 70))
    assert y3.shape == (2, 3, 70) and torch.equal(y3.reshape(6, 70), swiglu(g, u))
    one = swiglu(g[2], u[2])
    assert one.shape == (70,) and torch.equal(one, swiglu(g, u)[2])
    e = torch.zeros(0, 8, device=device, requires_grad=True)
    y = swiglu(e, e)
    y.sum().backward()
    assert y.shape == (0, 8) and e.grad.shape == (0, 8)


def test_extreme_gates_are_finite(device):
    g = torch.tensor([[-1e4, -100.0, -88.0, -1.0, 0.0, 1.0, 88.0, 100.0, 1e4]], device=device)
    u = torch.ones_like(g)
    gl = g.clone().requires_grad_(True)
    y = swiglu(gl, u)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(gl.grad).all()
    assert y[0, -1] == 1e4 and y[0, 0] == 0.0 and gl.grad[0, -1] == 1.0 and gl.grad[0, 0] == 0.0


def test_under_torch_compile(device):
    g, u = _inputs(4, 96, torch.float32, device)

    def f(g, u):
        return (swiglu(g, u) * 1.5).sum()

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    ins_a = [t.clone().requires_grad_(True) for t in (g, u)]
    ins_b = [t.clone().requires_grad_(True) for t in (g, u)]
    a, b = f(*ins_a), compiled(*ins_b)
    a.backward()
    b.backward()
    assert torch.equal(a, b) and all(torch.equal(p.grad, q.grad) for p, q in zip(ins_a, ins_b))


@pytest.mark.parametrize("make,error,argument", [
    (lambda g, u: swiglu(g.double(), u.double()), DTypeError, "gate"),
    (lambda g, u: swiglu(g.to(torch.int32), u), DTypeError, "gate"),
    (lambda g, u: swiglu(g, u.float()), DTypeError, "up"),
    (lambda g, u: swiglu(g, u.tolist()), DTypeError, "up"),
    (lambda g, u: swiglu(g, u[:, :-1]), ShapeError, "up"),
    (lambda g, u: swiglu(g[0, 0], u[0, 0]), ShapeError, "gate"),
    (lambda g, u: swiglu(g.t(), u.t()), LayoutError, "gate"),
    (lambda g, u: swiglu(g, torch.stack([u, u], -1)[..., 0]), LayoutError, "up"),
    (lambda g, u: swiglu(g, u.to("meta")), DeviceError, "up"),
])
def test_typed_errors_name_the_argument(make, error, argument, device):
    g, u = _inputs(3, 64, torch.bfloat16, device)
    with pytest.raises(error) as e:
        make(g, u)
    assert e.value.argument == argument
