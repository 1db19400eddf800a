"""How a public call reaches its kernels: the torch.library custom op when torch traces the call
(torch.compile, export, fake or functional tensors), a plain autograd.Function in eager.

Every op is a torch.library custom op with register_autograd: torch.compile needs that (an opaque
node with a fake implementation, fullgraph-safe). In eager the custom op's autograd wrapper is a
generated autograd.Function that re-dispatches below autograd, and on a call that records a graph it
costs about as much host time as everything else in a forward + backward (measured with the
launches stubbed: 234 against 117 us per rms_norm forward + backward on a 2-core CI-class CPU). The
eager path runs the same implementation, setup_context and backward in a plain autograd.Function:
the same kernels with the same arguments, so the same bits, without that round trip. Backward
functions call the backward custom ops through `direct`: the implementation in eager, the op when
traced (AOTAutograd traces backward with fake tensors). On the H200's host the custom op's dispatch
from the autograd thread cost more than the kernels it launched (scripts/gpu_host_profile.py).
"""
from __future__ import annotations

import inspect
from typing import Callable

import torch

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _traced(args) -> bool:
    """True when torch is tracing this call: then only the custom op is correct (fake tensors have no
    data; compiled graphs must see an opaque node)."""
    if torch.compiler.is_compiling():
        return True
    return any(isinstance(a, torch.Tensor) and type(a) not in _PLAIN for a in args)


def wants_grad(args) -> bool:
    """True when a call on these arguments would record an autograd graph."""
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


OP, EAGER, IMPL = "op", "eager", "impl"


def route(args) -> str:
    """Where a public call goes: OP (the custom op) when _traced(args), else EAGER (the autograd.Function)
    when wants_grad(args), else IMPL. Both checks in one pass over the arguments (a small op's host
    time is the point)."""
    if torch.compiler.is_compiling():
        return OP
    grad, record = torch.is_grad_enabled(), False
    for a in args:
        if type(a) in _PLAIN:
            record = record or (grad and a.requires_grad)
        elif isinstance(a, torch.Tensor):  # fake or functional: traced
            return OP
    return EAGER if record else IMPL


def autograd_op(op, backward: Callable, setup_context: Callable) -> Callable:
    """Register (backward, setup_context) on the custom op `op` and return the callable the public
    functions use: `op` itself under tracing, else the op's own implementation, inside an
    autograd.Function when a graph is recorded. Positional arguments only, all of them given (the
    custom op's setup_context then sees the same inputs on both paths)."""
    op.register_autograd(backward, setup_context=setup_context)
    impl = getattr(op, "_init_fn", None)  # the decorated function (torch._library.custom_ops.CustomOpDef)
    if impl is None:  # a torch that keeps it elsewhere: the dispatcher path, same results, slower
        return op

    n_args = len(inspect.signature(impl).parameters)

    def forward(ctx, *args):
        out = impl(*args)
        setup_context(ctx=ctx, inputs=args, output=out)
        return out

    name = getattr(op, "_name", "op")
    Eager = type(f"Eager_{name}", (torch.autograd.Function,),
                 {"forward": staticmethod(forward), "backward": staticmethod(backward)})

    def call(*args):
        if len(args) != n_args:  # setup_context unpacks every input, defaults included
            raise TypeError(f"rlk_triton::{name} takes all {n_args} arguments positionally, got {len(args)}")
        where = route(args)
        if where is IMPL:
            return impl(*args)
        return Eager.apply(*args) if where is EAGER else op(*args)

    call.op, call.eager = op, Eager
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"rlk_triton::{name}: the custom op under tracing, its implementation in eager (ops.dispatch)."
    return call


def direct(op) -> Callable:
    """The callable a backward function uses for the backward custom op `op`: `op` itself under
    tracing or when a graph would be recorded through it (create_graph: the op then raises for lack
    of an autograd formula instead of returning gradients that silently do not depend on the inputs),
    else the op's own implementation, the same kernels and arguments without the dispatcher."""
    impl = getattr(op, "_init_fn", None)
    if impl is None:
        return op

    def call(*args):
        if _traced(args) or wants_grad(args):
            return op(*args)
        return impl(*args)

    call.op = op
    call.__name__ = call.__qualname__ = getattr(op, "_name", "op")
    call.__doc__ = f"rlk_triton::{call.__name__}: the custom op under tracing, else its implementation (ops.dispatch)."
    return call
