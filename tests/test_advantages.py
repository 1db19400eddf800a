"""Advantage estimators against float64 references, judged by contracts/advantages.yaml."""
import numpy as np
import pytest
import torch

from rlk_triton import contracts, errors
from rlk_triton._runtime import arch_of
from rlk_triton.advantages import BACKENDS, gae, group_advantages, reinforce_pp_baseline
from rlk_triton.reference.advantages import (gae_reference, group_advantages_reference,
                                             reinforce_pp_baseline_reference)
from rlk_triton.testing import RowOp, assert_batch_invariant


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Both backends meet the same contract rows: the tests that take this fixture run for each."""
    return request.param


def _bound(output, device):
    return contracts.judgment("advantages", torch.float32, "forward_accuracy",
                              arch_of(torch.device(device)))["outputs"][output]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _gae_case(B, T, seed, device, p_active=0.8, scale=1.0):
    g = _gen(seed)
    r = (torch.randn(B, T, generator=g) * scale).to(device)
    v = (torch.randn(B, T, generator=g) * scale).to(device)
    m = (torch.rand(B, T, generator=g) < p_active).to(device)
    boot = (torch.randn(B, generator=g) * scale).to(device)
    return r, v, m, boot


@pytest.mark.parametrize("T", (1, 2, 31, 1000, 1025, 2500))
@pytest.mark.parametrize("gamma,lam", ((1.0, 1.0), (0.99, 0.95), (0.9, 0.0)))
def test_gae_within_contract(T, gamma, lam, device, backend):
    r, v, m, boot = _gae_case(4, T, T, device)
    m[1] = False  # a fully masked row
    if T > 3:
        m[2, : T // 2] = False  # a prompt-like masked prefix
        m[3, -3:] = False  # right padding
    adv, ret = gae(r, v, m, gamma=gamma, lam=lam, bootstrap_values=boot, backend=backend)
    ra, rr, sc = gae_reference(r.cpu().numpy(), v.cpu().numpy(), m.cpu().numpy(), boot.cpu().numpy(), gamma, lam)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert not adv[~m].any() and not ret[~m].any()
    assert contracts.scaled_abs_ratio(adv.cpu(), ra, sc, _bound("gae_advantages", device)) <= 1.0
    assert contracts.scaled_abs_ratio(ret.cpu(), rr, sc, _bound("gae_returns", device)) <= 1.0


def test_gae_defaults_and_empty(device, backend):
    r, v, _, _ = _gae_case(3, 9, 1, device)
    adv, ret = gae(r, v, gamma=1.0, lam=1.0, backend=backend)
    ra, rr, sc = gae_reference(r.cpu().numpy(), v.cpu().numpy(), np.ones((3, 9), bool), None, 1.0, 1.0)
    assert contracts.scaled_abs_ratio(adv.cpu(), ra, sc, _bound("gae_advantages", device)) <= 1.0
    a0, r0 = gae(torch.empty(0, 5, device=device), torch.empty(0, 5, device=device), gamma=1.0, lam=1.0,
                 backend=backend)
    assert a0.shape == (0, 5) and r0.shape == (0, 5)


def test_gae_rows_are_batch_invariant(device, backend):
    T = 1100 if torch.cuda.is_available() else 600  # several tiles under every config

    def make_rows(n, g):
        r = torch.randn(n, T, generator=g).to(device)
        v = torch.randn(n, T, generator=g).to(device)
        m = (torch.rand(n, T, generator=g) < 0.8).to(device)
        return r, v, m

    op = RowOp(f"gae.{backend}", lambda r, v, m: gae(r, v, m, gamma=0.99, lam=0.95, backend=backend), make_rows)
    assert_batch_invariant(op, probe_rows=2, batch_sizes=(3, 5))


def _group_case(B, groups, seed, device):
    g = _gen(seed)
    s = (torch.randn(B, generator=g) * 2 + 1).to(device)
    gid = torch.randint(0, groups, (B,), generator=g).to(device)
    ok = (torch.rand(B, generator=g) > 0.15).to(device)
    return s, gid, ok


@pytest.mark.parametrize("mode", ("mean", "mean_std", "rloo"))
@pytest.mark.parametrize("B,groups", ((1, 1), (8, 2), (64, 9), (2100, 300)))
def test_group_advantages_within_contract(mode, B, groups, device, backend):
    s, gid, ok = _group_case(B, groups, B, device)
    out = group_advantages(s, gid, num_groups=groups + 2, mode=mode, valid=ok, backend=backend)  # two empty groups
    ref, sc = group_advantages_reference(s.cpu().numpy(), gid.cpu().numpy(), ok.cpu().numpy(), mode)
    assert torch.isfinite(out).all() and not out[~ok].any()
    assert contracts.scaled_abs_ratio(out.cpu(), ref, sc, _bound("group_advantages", device)) <= 1.0


def test_single_member_and_fully_masked_groups_give_zero(device, backend):
    s = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], device=device)
    gid = torch.tensor([0, 1, 1, 2, 2], device=device)
    ok = torch.tensor([True, True, True, False, False], device=device)
    for mode in ("mean", "mean_std", "rloo"):
        out = group_advantages(s, gid, num_groups=3, mode=mode, valid=ok, backend=backend)
        assert out[0] == 0 and not out[3:].any() and torch.isfinite(out).all()
    equal = group_advantages(torch.ones(4, device=device), torch.zeros(4, dtype=torch.long, device=device),
                             num_groups=1, mode="mean_std", backend=backend)
    assert not equal.any()  # no spread: 0, not NaN


def test_a_group_does_not_depend_on_the_other_groups_or_its_place(device, backend):
    s, gid, ok = _group_case(40, 6, 3, device)
    probe = gid == 2
    base = group_advantages(s, gid, num_groups=6, valid=ok, backend=backend)[probe]
    others = ~probe
    extra_s, extra_gid, extra_ok = _group_case(70, 6, 4, device)
    extra_keep = extra_gid != 2
    moved_s = torch.cat([extra_s[extra_keep], s[probe], s[others]])
    moved_gid = torch.cat([extra_gid[extra_keep], gid[probe], gid[others]])
    moved_ok = torch.cat([extra_ok[extra_keep], ok[probe], ok[others]])
    n_extra = int(extra_keep.sum())
    moved = group_advantages(moved_s, moved_gid, num_groups=6, valid=moved_ok, backend=backend)[n_extra:n_extra + int(probe.sum())]
    assert torch.equal(base, moved)


def test_reinforce_pp_baseline_within_contract(device, backend):
    s, gid, ok = _group_case(24, 5, 7, device)
    mask = (torch.rand(24, 13, generator=_gen(8)) < 0.7).to(device)
    out = reinforce_pp_baseline(s, gid, mask, num_groups=5, valid=ok, backend=backend)
    ref, sc = reinforce_pp_baseline_reference(s.cpu().numpy(), gid.cpu().numpy(), mask.cpu().numpy(), ok.cpu().numpy())
    assert contracts.scaled_abs_ratio(out.cpu(), ref, sc, _bound("group_advantages", device)) <= 1.0
    given = reinforce_pp_baseline(s, gid, mask, num_groups=5, valid=ok, token_mean=0.0, token_std=1.0,
                                  backend=backend)
    assert torch.isfinite(given).all()


def test_typed_errors(device):
    r, v, m, _ = _gae_case(2, 5, 0, device)
    cases = [
        (lambda: gae(r, v[:, :4], m, gamma=1.0, lam=1.0), errors.ShapeError, "values"),
        (lambda: gae(r.long(), v, m, gamma=1.0, lam=1.0), errors.DTypeError, "rewards"),
        (lambda: gae(r, v, m, gamma=1.5, lam=1.0), errors.InputError, "gamma"),
        (lambda: gae(r, v, m[:, :3], gamma=1.0, lam=1.0), errors.ShapeError, "mask"),
        (lambda: gae(r, v, m, gamma=1.0, lam=1.0, bootstrap_values=torch.zeros(3, device=device)),
         errors.ShapeError, "bootstrap_values"),
        (lambda: group_advantages(r[0], torch.zeros(5, dtype=torch.long, device=device), num_groups=1, mode="median"),
         errors.InputError, "mode"),
        (lambda: group_advantages(r[0], torch.full((5,), 3, device=device), num_groups=2), errors.InputError, "group_ids"),
        (lambda: group_advantages(r[0], torch.zeros(5, device=device), num_groups=1), errors.DTypeError, "group_ids"),
        (lambda: group_advantages(r[0], torch.zeros(4, dtype=torch.long, device=device), num_groups=1),
         errors.ShapeError, "group_ids"),
    ]
    for fn, err, arg in cases:
        with pytest.raises(err) as e:
            fn()
        assert e.value.argument == arg


@pytest.mark.gpu
def test_gae_and_groups_at_scale_gpu():
    r, v, m, boot = _gae_case(64, 8192, 11, "cuda")
    adv, ret = gae(r, v, m, gamma=0.99, lam=0.95, bootstrap_values=boot)
    ra, rr, sc = gae_reference(r.cpu().numpy(), v.cpu().numpy(), m.cpu().numpy(), boot.cpu().numpy(), 0.99, 0.95)
    assert contracts.scaled_abs_ratio(adv.cpu(), ra, sc, _bound("gae_advantages", "cuda")) <= 1.0
    assert contracts.scaled_abs_ratio(ret.cpu(), rr, sc, _bound("gae_returns", "cuda")) <= 1.0
    a2, _ = gae(r, v, m, gamma=0.99, lam=0.95, bootstrap_values=boot)
    assert torch.equal(adv, a2)
    s, gid, ok = _group_case(4096, 512, 12, "cuda")
    for mode in ("mean", "mean_std", "rloo"):
        out = group_advantages(s, gid, num_groups=512, mode=mode, valid=ok)
        ref, sc = group_advantages_reference(s.cpu().numpy(), gid.cpu().numpy(), ok.cpu().numpy(), mode)
        assert contracts.scaled_abs_ratio(out.cpu(), ref, sc, _bound("group_advantages", "cuda")) <= 1.0


def test_gae_right_padding_changes_no_bit(device, backend):
    """Frameworks pad T to the batch's longest sequence: a row's GAE must not see it."""
    r, v, m, boot = _gae_case(3, 700, 21, device)
    m[:, 650:] = False
    outs = []
    for T in (700, 1300):  # the padding crosses tile edges
        pad = T - 700
        z = torch.zeros(3, pad, device=device)
        outs.append(gae(torch.cat([r, z], 1), torch.cat([v, z], 1), torch.cat([m, z.bool()], 1),
                        gamma=0.99, lam=0.95, bootstrap_values=boot, backend=backend))
    assert torch.equal(outs[0][0], outs[1][0][:, :700]) and torch.equal(outs[0][1], outs[1][1][:, :700])


def test_gae_writes_every_element_and_takes_no_bootstrap_as_zero(device, nan_filled_buffers):
    """The kernel writes every output element, 0 past a row's last active token (the outputs get no
    zero fill), and without bootstrap values takes 0 in the kernel: the bits of a [B] of zeros."""
    r, v, m, _ = _gae_case(4, 1300, 5, device)  # 1300: the tail crosses tile edges on every device
    m[0, 600:] = False  # a tail longer than a tile
    m[1] = False  # no active token
    m[2, -1] = True  # active to the end
    ref = gae(r, v, m, gamma=0.99, lam=0.95, bootstrap_values=torch.zeros(4, device=device))
    nan_filled_buffers()
    got = gae(r, v, m, gamma=0.99, lam=0.95)
    for name, a, b in zip(("advantages", "returns"), ref, got):
        assert torch.equal(a, b), name
        assert not b.isnan().any() and (b[~m] == 0).all(), name


def test_every_mask_dtype_gives_the_bits_of_a_bool_mask(device):
    """The kernels read a mask of KERNEL_MASK_DTYPES as it is (nonzero = active) and any other dtype
    converted: gae's and masked_whiten's bits do not depend on how the caller typed the mask."""
    from rlk_triton.advantages import KERNEL_MASK_DTYPES, masked_whiten

    r, v, m, boot = _gae_case(3, 300, 9, device)
    m[1] = False
    ref_gae = gae(r, v, m, gamma=0.99, lam=0.95, bootstrap_values=boot)
    ref_white = masked_whiten(r, m)
    for dtype in KERNEL_MASK_DTYPES + (torch.float64, torch.int16):
        typed = m.to(dtype)
        if dtype in (torch.int32, torch.int64, torch.int16):  # nonzero, not only 1, is active (a float mask is 0 / 1)
            typed = typed * 3
        got = gae(r, v, typed, gamma=0.99, lam=0.95, bootstrap_values=boot)
        assert torch.equal(got[0], ref_gae[0]) and torch.equal(got[1], ref_gae[1]), dtype
        assert torch.equal(masked_whiten(r, typed.t().contiguous().t()), ref_white), dtype  # a strided mask too


@pytest.mark.parametrize("id_dtype", (torch.int32, torch.int64))
def test_group_counts_are_the_histogram_of_the_valid_ids(device, id_dtype):
    """The group statistics find each group's members by searching the sorted keys: every count is
    the histogram of the valid ids (empty groups, invalid rows, no rows and no groups included), and
    each group's mean and m2 are the bits of its valid members alone, in batch order (the stats
    kernel reads the run the search gives it)."""
    from rlk_triton.ops import advantages as adv_ops

    g = _gen(17)
    for B, G in ((300, 40), (7, 1), (0, 5), (9, 0)):
        gid = torch.randint(0, max(G, 1), (B,), generator=g).to(id_dtype)
        ok = torch.rand(B, generator=g) < 0.7
        s = torch.randn(B, generator=g)
        mean, m2, count = adv_ops.launch_group_stats(s.to(device), gid.to(device), ok.to(device), G)
        want = torch.bincount(gid[ok].long(), minlength=G)[:G] if G else torch.zeros(0, dtype=torch.int64)
        assert count.dtype == torch.int32 and torch.equal(count.cpu().long(), want), (B, G)
        for grp in range(G):
            members = s[ok & (gid.long() == grp)].to(device)
            if members.numel():
                alone = adv_ops.launch_group_stats(members, torch.zeros_like(members, dtype=id_dtype),
                                                   torch.ones_like(members, dtype=torch.bool), 1)
                assert torch.equal(mean[grp:grp + 1], alone[0]) and torch.equal(m2[grp:grp + 1], alone[1]), (B, G, grp)
