"""Policy-loss rows of scripts/gpu_bench_rl.py: PPO (dual clip, k3 KL, TIS) fwd+bwd vs eager torch."""
import torch


def eager_ppo(logp, old, ref, adv, mask, rollout, eps=0.2, c=3.0, kl_coef=0.01, cap=2.0):
    r = torch.exp(logp - old)
    pg = torch.maximum(-adv * r, -adv * torch.clamp(r, 1 - eps, 1 + eps))
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * c), pg)
    d = ref - logp
    kl = torch.exp(d) - d - 1
    w = torch.clamp(torch.exp(old - rollout), max=cap)
    tok = w * (pg + kl_coef * kl)
    return (tok * mask).sum() / mask.sum()


def eager_gspo(logp, old, adv_seq, mask, eps_low=3e-4, eps_high=4e-4):
    n = mask.sum(-1)
    s = torch.exp(((logp - old) * mask).sum(-1) / n.clamp(min=1))
    pg = torch.maximum(-adv_seq * s, -adv_seq * torch.clamp(s, 1 - eps_low, 1 + eps_high))
    has = n > 0
    return (pg * has).sum() / has.sum().clamp(min=1)


def run(add, B, T):
    from rlk_triton.losses import gspo_loss, policy_loss

    g = torch.Generator(device="cuda").manual_seed(1)
    old = -torch.rand(B, T, device="cuda", generator=g) * 3
    logp = (old + 0.05 * torch.randn(B, T, device="cuda", generator=g)).requires_grad_(True)
    ref = old + 0.05 * torch.randn(B, T, device="cuda", generator=g)
    rollout = old + 0.01 * torch.randn(B, T, device="cuda", generator=g)
    adv = torch.randn(B, T, device="cuda", generator=g)
    mask = (torch.rand(B, T, device="cuda", generator=g) < 0.9).float()

    def eager_step():
        return torch.autograd.grad(eager_ppo(logp, old, ref, adv, mask, rollout), logp)[0]

    def ours_step():
        loss, _, _ = policy_loss(logp, old, adv, mask=mask.bool(), dual_clip_c=3.0, ref_logp=ref, kl_coef=0.01,
                                 rollout_logp=rollout, tis_cap=2.0)
        return torch.autograd.grad(loss, logp)[0]

    e = add("eager torch PPO+KL+TIS loss fwd+bwd [64 x 8192]", eager_step)
    add("rlk policy_loss PPO+KL+TIS fwd+bwd [64 x 8192]", ours_step, e)
    from rlk_triton import configs  # the (row, tile) split of the row sums, same bits: its speed
    key = ("rl_policy_loss_split", "cuda", "float32", "any")
    saved = configs.LOCKED_CONFIGS[key]
    configs.LOCKED_CONFIGS[key] = configs.LaunchConfig(1, 1, 1)
    add("rlk policy_loss PPO+KL+TIS fwd+bwd [64 x 8192], rows split into tiles", ours_step, e)
    configs.LOCKED_CONFIGS[key] = saved
    compiled = torch.compile(eager_ppo)
    add("torch.compile PPO+KL+TIS loss fwd+bwd [64 x 8192]",
        lambda: torch.autograd.grad(compiled(logp, old, ref, adv, mask, rollout), logp)[0], e)

    adv_seq = torch.randn(B, device="cuda", generator=g)
    bmask = mask.bool()
    e = add("eager torch GSPO loss fwd+bwd [64 x 8192]",
            lambda: torch.autograd.grad(eager_gspo(logp, old, adv_seq, mask), logp)[0])
    add("rlk gspo_loss fwd+bwd [64 x 8192]",
        lambda: torch.autograd.grad(gspo_loss(logp, old, adv_seq, mask=bmask)[0], logp)[0], e)
