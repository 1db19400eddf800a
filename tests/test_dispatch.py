"""rlk_triton.ops.dispatch: eager calls run each op's implementation in a plain autograd.Function and
give the custom op's bits, values and gradients; traced calls (torch.compile, fake tensors) get the
custom op."""
import pytest
import torch

import rlk_triton.ops.dispatch as dispatch
from rlk_triton import losses
from rlk_triton.ops import (attention, embedding, gspo, linear_logp, matmul, rl_losses, rmsnorm, rope, selected_logp,
                            swiglu)

# each op: (the forward the public functions call, the backward op as its backward function calls it)
OPS = {
    "attention": (attention.call_attention_fwd, attention.call_attention_bwd),
    "embedding": (embedding.call_embedding_fwd, embedding.call_embedding_bwd),
    "gspo_loss": (gspo.call_gspo_loss_fwd, gspo.call_gspo_loss_bwd),
    "linear_logp": (linear_logp.call_linear_logp_fwd, linear_logp.call_linear_logp_bwd),
    "matmul": (matmul.call_matmul, matmul._matmul_direct),
    "ratio_kl": (rl_losses.call_ratio_kl_fwd, rl_losses.call_ratio_kl_bwd),
    "policy_loss": (rl_losses.call_policy_loss_fwd, rl_losses.call_policy_loss_bwd),
    "rms_norm": (rmsnorm.call_rms_norm_fwd, rmsnorm.call_rms_norm_bwd),
    "rope": (rope.call_rope_fwd, rope.call_rope_bwd),
    "selected_logp": (selected_logp.call_selected_logp_fwd, selected_logp.call_selected_logp_bwd),
    "swiglu": (swiglu.call_swiglu_fwd, swiglu.call_swiglu_bwd),
}
CALLS = {name: fwd for name, (fwd, _) in OPS.items()}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_op_has_the_eager_path(name):
    """The fast path is in use (a torch that moved the custom op's implementation would silently put
    every eager call back on the dispatcher: this fails instead)."""
    call = CALLS[name]
    assert hasattr(call, "eager") and hasattr(call, "op"), f"{name}: eager path unavailable on this torch"


def _grads(fn, inputs):
    out = fn(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    first = out[0]
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    g = torch.autograd.grad(first, wrt, torch.ones_like(first))
    return [o.detach() for o in out if isinstance(o, torch.Tensor)], list(g)


def _rms_inputs(device):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 64, generator=g).to(device, torch.bfloat16).requires_grad_()
    w = torch.randn(64, generator=g).to(device).requires_grad_()
    r = torch.randn(5, 64, generator=g).to(device, torch.bfloat16).requires_grad_()
    return (x, w, r, 1e-6, 0.0)


def _logp_inputs(device):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 50, generator=g).to(device).requires_grad_()
    t = torch.randint(0, 50, (3,), generator=g).to(device)
    return (logits, t, None, 1.0, None, -100, True)


def _swiglu_inputs(device):
    g = torch.Generator().manual_seed(5)
    return tuple(torch.randn(4, 48, generator=g).to(device, torch.bfloat16).requires_grad_() for _ in range(2))


@pytest.mark.parametrize("name,make", [("rms_norm", _rms_inputs), ("selected_logp", _logp_inputs),
                                       ("swiglu", _swiglu_inputs)])
def test_eager_path_gives_the_custom_ops_bits(name, make, device):
    call = CALLS[name]
    a_out, a_grad = _grads(call, make(device))
    b_out, b_grad = _grads(call.op, make(device))  # the custom op through the dispatcher
    assert len(a_out) == len(b_out) and len(a_grad) == len(b_grad)
    assert all(torch.equal(x, y) for x, y in zip(a_out, b_out))
    assert all(torch.equal(x, y) for x, y in zip(a_grad, b_grad))


def test_eager_calls_record_the_plain_function_and_traced_calls_the_custom_op(device):
    x, w, r, eps, off = _rms_inputs(device)
    y, _, _ = rmsnorm.call_rms_norm_fwd(x, w, r, eps, off)
    assert type(y.grad_fn).__name__.startswith("Eager_rms_norm_fwd")
    with torch.no_grad():  # no graph: the implementation alone
        y2, _, _ = rmsnorm.call_rms_norm_fwd(x, w, r, eps, off)
    assert y2.grad_fn is None and torch.equal(y2, y.detach())
    from torch._subclasses.fake_tensor import FakeTensorMode
    xd, wd = x.detach(), w.detach()
    with FakeTensorMode() as mode:  # fake tensors: only the custom op's fake implementation can answer
        fx, fw = mode.from_tensor(xd), mode.from_tensor(wd)
        out, _, rstd = rmsnorm.call_rms_norm_fwd(fx, fw, None, eps, off)
    assert tuple(out.shape) == (5, 64) and rstd.dtype == torch.float32


def test_arguments_must_all_be_given():
    x, w, r, eps, _ = _rms_inputs("cpu")
    with pytest.raises(TypeError, match="all 5 arguments"):
        rmsnorm.call_rms_norm_fwd(x, w, r, eps)


def test_the_public_functions_go_through_the_eager_path(device, monkeypatch):
    """rms_norm and policy_loss reach their kernels, forward and backward, without a custom op in eager
    (the backward functions call the backward ops through dispatch.direct)."""
    from torch._library.custom_ops import CustomOpDef
    called, original = [], CustomOpDef.__call__

    def spy(self, *args, **kwargs):
        called.append(self._name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CustomOpDef, "__call__", spy)
    x, w, _, _, _ = _rms_inputs(device)
    rmsnorm.rms_norm(x, w).float().sum().backward()
    B, T = 2, 8
    g = torch.Generator().manual_seed(6)
    logp = (-torch.rand(B, T, generator=g)).to(device).requires_grad_()
    old = (-torch.rand(B, T, generator=g)).to(device)
    adv = torch.randn(B, T, generator=g).to(device)
    mask = torch.ones(B, T, dtype=torch.bool, device=device)
    ref = (-torch.rand(B, T, generator=g)).to(device)
    loss, _, _ = losses.policy_loss(logp, old, adv, mask=mask, ref_logp=ref, kl_coef=0.1)
    loss.backward()
    assert x.grad is not None and logp.grad is not None
    assert called == [], called
    rmsnorm.rms_norm_fwd(x.detach(), w.detach(), None, 1e-6, 0.0)
    assert called == ["rms_norm_fwd"]  # the spy does see custom op calls



@pytest.mark.parametrize("name", sorted(OPS))
def test_every_backward_has_the_direct_path(name):
    assert hasattr(OPS[name][1], "op"), f"{name}: the backward runs through the dispatcher on this torch"


def test_eager_backward_gives_the_custom_ops_bits(device):
    h = torch.randn(6, 64, generator=torch.Generator().manual_seed(8)).to(device, torch.bfloat16)
    w = torch.randn(64, generator=torch.Generator().manual_seed(9)).to(device, torch.bfloat16)
    _, _, rstd = rmsnorm.rms_norm_fwd(h, w, None, 1e-6, 0.0)
    gy = torch.randn_like(h)
    args = (gy, None, h, w, rstd, 0.0, True, False)
    for a, b in zip(rmsnorm.call_rms_norm_bwd(*args), rmsnorm.rms_norm_bwd(*args)):
        assert torch.equal(a, b)


def test_double_backward_still_refuses(device):
    """With create_graph the backward op goes through the custom op, which has no autograd formula:
    a clear error, never second-order gradients that silently ignore the first-order graph."""
    x, w, _, _, _ = _rms_inputs(device)
    g, = torch.autograd.grad(rmsnorm.rms_norm(x, w).float().pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        g.float().sum().backward()


def test_traced_detects_subclasses_and_compiling():
    assert not dispatch._traced((torch.ones(1), 1.0, None))
    assert not dispatch._traced((torch.nn.Parameter(torch.ones(1)),))


def test_route_is_traced_then_wants_grad_in_one_pass():
    """dispatch.route (the public calls' one-pass check) answers as _traced, then wants_grad: the custom
    op for tensor subclasses (fake / functional tensors), the autograd.Function when a graph would
    be recorded, else the implementation."""

    class Sub(torch.Tensor):
        pass

    plain, leaf = torch.ones(2), torch.ones(2, requires_grad=True)
    sub = torch.ones(2).as_subclass(Sub)
    cases = [(plain, 1.0, None), (leaf, 3), (torch.nn.Parameter(torch.ones(2)),), (plain, sub), (leaf, sub),
             (sub, leaf), (None, True, "x"), ()]
    for grad_mode in (True, False):
        with torch.set_grad_enabled(grad_mode):
            for args in cases:
                want = (dispatch.OP if dispatch._traced(args) else
                        dispatch.EAGER if dispatch.wants_grad(args) else dispatch.IMPL)
                assert dispatch.route(args) == want, (grad_mode, args)
    assert dispatch.route((leaf,)) == dispatch.EAGER and dispatch.route((plain, sub)) == dispatch.OP
