"""The packed layout: pad / unpad are exact, and the RL operators give the same bits in it."""
import pytest
import torch

from rlk_triton import errors
from rlk_triton.advantages import gae
from rlk_triton.losses import policy_loss
from rlk_triton.packing import pad, sequence_ids, unpad


def _packed(lengths, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    n = int(cu[-1])
    return torch.randn(n, generator=g).to(device), cu.to(device)


def test_pad_unpad_roundtrip_and_mask(device):
    x, cu = _packed([3, 0, 5, 1], device)
    padded, mask = pad(x, cu, 6)
    assert padded.shape == (4, 6) and mask.sum() == x.numel()
    assert not padded[~mask].any() and mask[1].sum() == 0
    assert torch.equal(unpad(padded, cu), x)
    assert sequence_ids(cu, x.numel()).tolist() == [0, 0, 0, 2, 2, 2, 2, 2, 3]
    x2 = torch.randn(9, 2, device=device)
    p2, _ = pad(x2, cu, 5)
    assert p2.shape == (4, 5, 2) and torch.equal(unpad(p2, cu), x2)


def test_gradients_pass_through(device):
    x, cu = _packed([2, 4], device, 1)
    x = x.requires_grad_(True)
    padded, mask = pad(x, cu, 4)
    (padded * torch.arange(8.0, device=device).view(2, 4)).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 4.0, 5.0, 6.0, 7.0]


def test_rl_ops_give_the_same_bits_packed_and_padded(device):
    lengths = [5, 0, 9, 3]
    lp, cu = _packed(lengths, device, 2)
    old = lp - 0.01 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(3)).to(device)
    adv = torch.randn(lp.shape, generator=torch.Generator().manual_seed(4)).to(device)
    for T in (9, 16):  # different padding: the same bits for the real tokens
        p_lp, mask = pad(lp, cu, T)
        p_old, _ = pad(old, cu, T)
        p_adv, _ = pad(adv, cu, T)
        _, tok, _ = policy_loss(p_lp, p_old, p_adv, mask=mask)
        a, r = gae(p_adv, p_old, mask, gamma=0.99, lam=0.95)
        out = (unpad(tok, cu), unpad(a, cu), unpad(r, cu))
        if T == 9:
            first = out
        else:
            assert all(torch.equal(u, v) for u, v in zip(first, out))


def test_bad_cu_seqlens(device):
    x, cu = _packed([2, 3], device)
    for bad in (torch.tensor([1, 2, 5]), torch.tensor([0, 3, 2]), torch.tensor([0, 2, 4])):
        with pytest.raises(errors.InputError) as e:
            pad(x, bad.to(device), 8)
        assert e.value.argument == "cu_seqlens"
    with pytest.raises(errors.InputError):
        pad(x, cu, 2)  # a sequence longer than max_seqlen
    with pytest.raises(errors.DTypeError):
        pad(x, cu.float(), 8)
    with pytest.raises(errors.ShapeError):
        unpad(torch.zeros(3, 4, device=device), cu)
