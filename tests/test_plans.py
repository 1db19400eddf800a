"""Per-shape plans (ops.launch.planned): a call answered from a warm plan store gives the bits of the
same call with every store emptied (configs.forget), across calls that share shapes but not strides,
flags or runtime values (eps, temperature, row counts): a plan's key holds every fact it was made from."""
import functools

import torch

from rlk_triton import configs
from rlk_triton._runtime import arch_of
from rlk_triton.attention import attention_decode
from rlk_triton.logp import selected_logp
from rlk_triton.losses import gspo_loss, policy_loss
from rlk_triton.ops.matmul import matmul
from rlk_triton.ops.rmsnorm import rms_norm
from rlk_triton.ops.rope import apply_rope, rope_tables


def _calls(device):
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    a, wide, w, bias = randn(5, 32), randn(5, 48), randn(24, 32), randn(24)
    x, xwide, rw, res = randn(6, 32), randn(6, 48), randn(32), randn(6, 32)
    cos, sin = rope_tables(64, 16, device=device)
    qkv = randn(5, 8, 16)  # a fused q / k / v buffer: q and k are strided views into it
    q, k, pos = randn(5, 4, 16), randn(5, 2, 16), torch.tensor([0, 3, 7, 9, 63], device=device)
    logits, target = randn(3, 100), torch.tensor([1, 50, 99], device=device)
    page = configs.lookup_decode(arch_of(torch.device(device)), torch.float32, 16).block_n  # one KV block a page
    kc, vc, qd, qwide = randn(4, page, 2, 16), randn(4, page, 2, 16), randn(2, 4, 16), randn(2, 8, 16)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=device)
    lens = torch.tensor([page + 3, 5], dtype=torch.int32, device=device)
    return [
        lambda: attention_decode(qd, kc, vc, table, lens),
        lambda: attention_decode(qwide[:, :4], kc, vc, table, lens),  # q's token stride 128
        lambda: attention_decode(qd[:1], kc, vc, table[:1], lens[:1]),  # one sequence
        lambda: attention_decode(qd, kc, vc, table[:, :1], torch.minimum(lens, torch.full_like(lens, page))),
        lambda: matmul(a, w.t()),
        lambda: matmul(wide[:, :32], w.t()),  # a's row stride 48
        lambda: matmul(a, w.t().contiguous()),  # b row-major
        lambda: matmul(a[:3], w.t(), bias),  # fewer rows, a bias
        lambda: rms_norm(x, rw),
        lambda: rms_norm(xwide[:, :32], rw, eps=1e-3),
        lambda: rms_norm(x, rw, residual=res, weight_offset=1.0),
        lambda: rms_norm(x[:2], rw),
        lambda: apply_rope(q, k, cos, sin, pos),
        lambda: apply_rope(qkv[:, :4], qkv[:, 4:6], cos, sin, pos),
        lambda: apply_rope(qkv[:, :4], k, cos, sin, pos),  # q's strides only
        lambda: apply_rope(q, None, cos, sin, pos),
        lambda: apply_rope(q[:2], k[:2], cos, sin, pos[:2], interleaved=True),
        lambda: selected_logp(logits, target),
        lambda: selected_logp(logits.view(1, 3, 100), target.view(1, 3), temperature=0.7, return_entropy=True),
        lambda: selected_logp(logits[:1], target[:1], ignore_index=1),
        *_rms_norm_backward_calls(randn),
        *_policy_calls(randn, device),
    ]


def _rms_norm_backward_calls(randn):
    """rms_norm's backward across the facts its plans are keyed by (row stride, which gradients flow,
    an upstream gradient of the residual output) and the values they are not (rows, weight_offset)."""
    x, xwide, w, res, dy, dres = randn(6, 32), randn(6, 48), randn(32), randn(6, 32), randn(6, 32), randn(6, 32)

    def run(rows=6, strided=False, weight_grad=True, residual=None, residual_grad=False, **kw):
        xs = (xwide[:rows, :32] if strided else x[:rows]).detach().requires_grad_()
        ws = w.detach().requires_grad_(weight_grad)
        if residual is None:
            y = rms_norm(xs, ws, **kw)
            return (y, *torch.autograd.grad(y, [t for t in (xs, ws) if t.requires_grad], dy[:rows]))
        r = res[:rows].detach().requires_grad_()
        y, h = rms_norm(xs, ws, residual=r, **kw)
        outs, ups = ((y, h), (dy[:rows], dres[:rows])) if residual_grad else ((y,), (dy[:rows],))
        return (y, h, *torch.autograd.grad(outs, [t for t in (xs, ws, r) if t.requires_grad], ups))

    return [functools.partial(run, **kw) for kw in (
        {}, dict(rows=3), dict(strided=True), dict(weight_grad=False), dict(weight_offset=1.0),
        dict(residual=True), dict(residual=True, residual_grad=True), dict(residual=True, weight_grad=False),
    )]


def _policy_calls(randn, device):
    """policy_loss's and gspo_loss's forward and backward across the facts their plans are keyed by
    (terms, aggregation, normalizer kind, which gradients flow) and the values they are not (B, T, the
    coefficients)."""
    lp, old, adv, ref, ent, roll = (randn(3, 40) * 0.1 - 2 for _ in range(6))
    mask = randn(3, 40) > -1

    def run(rows=3, tokens=40, per_token_grad=False, loss_grad=True, loss_fn=policy_loss, entropy_grad=True, **kw):
        x = lp[:rows, :tokens].clone().requires_grad_()
        e = ent[:rows, :tokens].clone().requires_grad_(entropy_grad) if "entropy" in kw else None
        kw = {k: (v[:rows, :tokens] if isinstance(v, torch.Tensor) and v.dim() == 2 else v) for k, v in kw.items()}
        if e is not None:
            kw["entropy"] = e
        a = kw.pop("advantages", adv)
        a = a[:rows] if a.dim() == 1 else a[:rows, :tokens]
        loss, per_token, diag = loss_fn(x, old[:rows, :tokens], a, mask=mask[:rows, :tokens], **kw)
        ups = (torch.ones_like(loss), torch.linspace(0, 1, per_token.numel(), device=device).view_as(per_token))
        outs = [(o, u) for o, u, on in zip((loss, per_token), ups, (loss_grad, per_token_grad)) if on]
        grads = torch.autograd.grad([o for o, _ in outs], (x,) if e is None or not entropy_grad else (x, e),
                                    [u for _, u in outs])
        return loss, per_token, *diag.values(), *grads

    return [functools.partial(run, **kw) for kw in (
        {}, dict(rows=2), dict(tokens=17), dict(normalizer=57.0), dict(normalizer=torch.tensor(57.0, device=device)),
        dict(aggregation="seq-mean-token-mean"), dict(advantages=adv[:, 0]), dict(per_token_grad=True),
        dict(ref_logp=ref, kl_coef=0.1, entropy=ent, entropy_coef=0.01), dict(ref_logp=ref, kl_coef=0.1, entropy=ent,
                                                                              entropy_coef=0.01, entropy_grad=False),
        dict(dual_clip_c=3.0, log_ratio_clamp=0.5),
        dict(loss_type="cispo", eps_high=0.3, rollout_logp=roll, tis_cap=2.0),
        dict(rollout_logp=roll, tis_cap=1.5, tis_mode="mask", tis_scope="pg"),
        *(dict(loss_fn=gspo_loss, advantages=adv[:, 0], **kw) for kw in (
            {}, dict(rows=2), dict(tokens=17), dict(normalizer=57.0), dict(aggregation="token-mean"),
            dict(per_token_grad=True), dict(per_token_grad=True, loss_grad=False),
            dict(ref_logp=ref, kl_coef=0.1, entropy=ent, entropy_coef=0.01),
            dict(ref_logp=ref, kl_coef=0.1, entropy=ent, entropy_coef=0.01, entropy_grad=False),
            dict(rollout_logp=roll, tis_cap=1.5, tis_scope="pg"))),
    )]


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out if o is not None for t in _flat(o)]


def test_warm_plans_give_the_bits_of_cold_ones(device):
    calls = _calls(device)
    configs.forget()
    warm = [_flat(call()) for call in calls for _ in range(2)][1::2]  # each call's second run: from its plan
    for call, got in zip(calls, warm):
        configs.forget()
        want = _flat(call())
        assert len(got) == len(want) and all(torch.equal(x, y) for x, y in zip(got, want))
