"""RoPE: tables, parity with float64 (contracts/rope.yaml), bitwise invariance across prefill /
decode / packed varlen batches, the harness's axes, typed errors."""
import itertools

import numpy as np
import pytest
import torch

from rlk_triton import contracts, errors
from rlk_triton._runtime import arch_of
from rlk_triton.ops.rope import apply_rope, rope_inv_freq, rope_position_ids, rope_tables
from rlk_triton.reference.rope_embedding import (rope_grad_reference, rope_inv_freq_reference, rope_reference,
                                                 rope_scale, rope_tables_reference)
from rlk_triton.testing import assert_batch_invariant
from rlk_triton.testing.float64_checks import assert_central_differences, power_evaluations_bound
from rlk_triton.testing.positional import DTYPES, ROPE_LAYOUTS, SCALINGS, RopeCase, judge_rope, rope_row_op

# ---- tables ----


@pytest.mark.parametrize("scaling", list(SCALINGS))
@pytest.mark.parametrize("base,rotary_dim", ((10000.0, 128), (500000.0, 64), (1e6, 96)))
def test_tables_are_float64_rounded_once_to_fp32(scaling, base, rotary_dim):
    P = 32768
    cos, sin = rope_tables(P, rotary_dim, base=base, scaling=SCALINGS[scaling])
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape == (P, rotary_dim // 2)
    ref_cos, ref_sin = rope_tables_reference(P, rotary_dim, base, SCALINGS[scaling])
    angle = np.arange(P, dtype=np.float64)[:, None] * rope_inv_freq_reference(rotary_dim, base, SCALINGS[scaling])
    for ours, ref in ((cos, ref_cos), (sin, ref_sin)):
        err = np.abs(ours.double().numpy() - ref)
        half_ulp = 0.5 * np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
        # correctly rounded, up to the float64 rounding of the angle (a few 2^-53 * angle rad)
        assert np.all(err <= half_ulp + 8 * 2.0**-53 * angle)


def test_inv_freq_matches_reference_and_scaling_rules():
    for name, scaling in SCALINGS.items():
        for R in (2, 64, 128):
            # two float64 evaluations of base ** (-2i / R): per side the exponent, pow, 1 / x or the
            # reciprocal power, and llama3's band rule (2 pi / theta, old / wavelen - lo, / (hi - lo),
            # 1 - smooth, * theta, / f, smooth * theta, +): at most 8 roundings a side
            np.testing.assert_allclose(rope_inv_freq(R, 10000.0, scaling), rope_inv_freq_reference(R, 10000.0, scaling),
                                       rtol=power_evaluations_bound(10000.0, roundings=16), atol=0)
    plain = rope_inv_freq(128, 500000.0)
    # linear scaling divides by the factor: by 4 that is exact in binary floating point
    assert np.array_equal(rope_inv_freq(128, 500000.0, SCALINGS["linear4"]), plain / 4)
    llama = rope_inv_freq(128, 500000.0, SCALINGS["llama3"])
    wavelen = 2 * np.pi / plain
    assert np.array_equal(llama[wavelen < 8192 / 4], plain[wavelen < 8192 / 4])  # high frequencies kept
    assert np.array_equal(llama[wavelen > 8192], plain[wavelen > 8192] / 8)  # low ones / factor: exact, by 8
    assert llama[0] == 1.0 and rope_inv_freq(128, 10000.0, {"rope_type": "default"})[0] == 1.0


@pytest.mark.parametrize("bad", [
    {"type": "dynamic", "factor": 2.0}, {"type": "yarn", "factor": 2.0}, {"type": "linear"},
    {"type": "linear", "factor": 0.0}, {"type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                        "high_freq_factor": 1.0, "original_max_position_embeddings": 8192},
    "linear"])
def test_unsupported_scaling_is_a_typed_error(bad):
    with pytest.raises(errors.InputError) as e:
        rope_tables(16, 8, scaling=bad)
    assert e.value.argument.startswith("scaling")


@pytest.mark.parametrize("kwargs,argument", [
    (dict(max_positions=16, rotary_dim=7), "rotary_dim"), (dict(max_positions=16, rotary_dim=0), "rotary_dim"),
    (dict(max_positions=-1, rotary_dim=8), "max_positions"), (dict(max_positions=16, rotary_dim=8, base=0.0), "base"),
    (dict(max_positions=16, rotary_dim=8, base=float("inf")), "base")])
def test_bad_table_arguments(kwargs, argument):
    with pytest.raises(errors.InputError) as e:
        rope_tables(**kwargs)
    assert e.value.argument == argument


# ---- parity with float64 ----

CASES = [RopeCase(10, 3, 2, 32, dt, il, rd, 4096, 10000.0, sc, 1.0, lay, seed=i)
         for i, (dt, il, lay, (rd, sc)) in enumerate(itertools.product(
             DTYPES, (False, True), ROPE_LAYOUTS, ((None, "none"), (16, "llama3"))))]
# large positions and values, tiny values, odd head dims
CASES += [RopeCase(8, 2, 1, 48, dt, il, None, 131072, 500000.0, "ntk8", scale, "contiguous", seed=100 + i)
          for i, (dt, il, scale) in enumerate(itertools.product(DTYPES, (False, True), (1e-3, 300.0)))]
CASES += [RopeCase(6, 1, 1, 10, dt, il, 6, 64, 10000.0, "linear4", 1.0, "bthd", seed=200 + i)
          for i, (dt, il) in enumerate(itertools.product(DTYPES, (False, True)))]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label().replace(" ", "-"))
def test_rope_within_contract(case, device):
    ratios = judge_rope(case, device)
    assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: error / contract bound {ratios}"


def test_reference_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    cos, sin = rope_tables_reference(50, 8)
    pos = np.array([3, 0, 49])
    for interleaved in (False, True):
        x = rng.standard_normal((3, 2, 12))  # rotary dim 8 of 12: dims 8..11 pass through
        up = rng.standard_normal((3, 2, 12))
        grad = rope_grad_reference(up, cos, sin, pos, interleaved)
        # linear in x: no truncation error, only the rounding of sums whose terms add up to f_scale
        assert_central_differences(lambda v: np.sum(up * rope_reference(v, cos, sin, pos, interleaved)), x, grad,
                                   f_scale=float(np.sum(np.abs(up * rope_reference(x, cos, sin, pos, interleaved)))))


# ---- bitwise: the same token in prefill, decode with a cache offset, packed varlen ----

def _seq(n, H, Hk, D, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, H, D, generator=g).to(device=device, dtype=dtype),
            torch.randn(n, Hk, D, generator=g).to(device=device, dtype=dtype))


def _rope_with_grads(q, k, cos, sin, pos, interleaved, up_q, up_k):
    q, k = q.detach().clone().requires_grad_(True), k.detach().clone().requires_grad_(True)
    qr, kr = apply_rope(q, k, cos, sin, pos, interleaved=interleaved)
    ((qr * up_q).sum() + (kr * up_k).sum()).backward()
    return qr.detach(), kr.detach(), q.grad, k.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", (False, True))
def test_same_token_same_bits_in_prefill_decode_and_varlen(dtype, interleaved, device):
    H, Hk, D = 4, 2, 32
    cos, sin = rope_tables(2048, D, base=10000.0, device=device)
    qa, ka = _seq(9, H, Hk, D, dtype, device, 1)  # the sequence under test
    qb, kb = _seq(5, H, Hk, D, dtype, device, 2)
    qc, kc = _seq(4, H, Hk, D, dtype, device, 3)
    g = torch.Generator().manual_seed(4)
    up_qa = torch.randn(9, H, D, generator=g).to(device=device, dtype=dtype)
    up_ka = torch.randn(9, Hk, D, generator=g).to(device=device, dtype=dtype)

    def run(parts, cu, offsets, a_rows, a_tokens):
        """parts: [(q, k, up_q, up_k)] packed in order; a_rows: rows of the batch holding tokens
        a_tokens of sequence A. Returns A's rows of the outputs and gradients."""
        q = torch.cat([p[0] for p in parts])
        k = torch.cat([p[1] for p in parts])
        uq = torch.cat([p[2] for p in parts])
        uk = torch.cat([p[3] for p in parts])
        pos = rope_position_ids(torch.tensor(cu, device=device),
                                None if offsets is None else torch.tensor(offsets, device=device))
        outs = _rope_with_grads(q, k, cos, sin, pos, interleaved, uq, uk)
        return [o[a_rows] for o in outs]

    def noise(q, k, seed):
        g2 = torch.Generator().manual_seed(seed)
        return (torch.randn(q.shape, generator=g2).to(device=device, dtype=dtype),
                torch.randn(k.shape, generator=g2).to(device=device, dtype=dtype))

    A = (qa, ka, up_qa, up_ka)
    B = (qb, kb, *noise(qb, kb, 5))
    C = (qc, kc, *noise(qc, kc, 6))
    all_a = torch.arange(9)
    prefill = run([A], [0, 9], None, all_a, all_a)
    # packed varlen: A between two other sequences, positions restart at each sequence
    varlen = run([B, A, C], [0, 5, 14, 18], None, torch.arange(5, 14), all_a)
    # chunked prefill with a cache offset: A's tokens 4..8 after 4 cached ones, with B's first chunk
    chunk = run([tuple(t[:3] for t in B), tuple(t[4:] for t in A)], [0, 3, 8], [0, 4], torch.arange(3, 8), all_a[4:])
    # decode steps: A's last token alone at cache length 8, and inside a batch of decode steps
    single = run([tuple(t[8:] for t in A)], [0, 1], [8], torch.arange(1), all_a[8:])
    batch = run([tuple(t[:1] for t in B), tuple(t[8:] for t in A), tuple(t[:1] for t in C)], [0, 1, 2, 3],
                [700, 8, 3], torch.arange(1, 2), all_a[8:])
    for name, got, tokens in (("varlen", varlen, all_a), ("chunked prefill", chunk, all_a[4:]),
                              ("decode alone", single, all_a[8:]), ("decode batch", batch, all_a[8:])):
        for what, a, b in zip(("q", "k", "dq", "dk"), [o[tokens] for o in prefill], got):
            assert torch.equal(a, b), f"{name}: {what} differs from prefill"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved,rotary_dim", ((False, None), (True, None), (False, 16)))
def test_rope_batch_invariant(dtype, interleaved, rotary_dim, device):
    report = assert_batch_invariant(rope_row_op(4, 2, 32, dtype, device, interleaved, rotary_dim),
                                    probe_rows=2, batch_sizes=(3, 7))
    assert {r.axis for r in report.results} == {"repeat", "batch_size", "row_position", "padding_rows", "neighbours"}
    assert {r.what for r in report.results} >= {"output 0", "output 1", "grad of input 0", "grad of input 1"}


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_fused_qkv_views_and_bthd_equal_contiguous(dtype, device):
    T, H, Hk, D = 6, 4, 2, 32
    cos, sin = rope_tables(512, D, device=device)
    buf = torch.randn(T, (H + 2 * Hk) * D).to(device=device, dtype=dtype)
    q, k = buf[:, :H * D].view(T, H, D), buf[:, H * D:(H + Hk) * D].view(T, Hk, D)
    pos = torch.tensor([5, 0, 511, 7, 7, 100], device=device)
    up_q = torch.randn(T, H, D).to(device=device, dtype=dtype)
    up_k = torch.randn(T, Hk, D).to(device=device, dtype=dtype)
    views = _rope_with_grads(q, k, cos, sin, pos, False, up_q, up_k)
    dense = _rope_with_grads(q.contiguous(), k.contiguous(), cos, sin, pos, False, up_q, up_k)
    bthd = _rope_with_grads(q.reshape(2, 3, H, D), k.reshape(2, 3, Hk, D), cos, sin, pos.view(2, 3), False,
                            up_q.view(2, 3, H, D), up_k.view(2, 3, Hk, D))
    for a, b, c in zip(views, dense, bthd):
        assert torch.equal(a, b) and torch.equal(a, c.reshape(a.shape))
    assert bthd[0].shape == (2, 3, H, D)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_position_zero_is_the_identity_and_pass_through_dims_are_copied(dtype, device):
    cos, sin = rope_tables(64, 16, device=device)
    q, k = _seq(5, 2, 1, 24, dtype, device, 9)
    pos = torch.tensor([0, 3, 0, 63, 1], device=device)
    qr, kr = apply_rope(q, k, cos, sin, pos)
    assert torch.equal(qr[[0, 2]], q[[0, 2]]) and torch.equal(kr[[0, 2]], k[[0, 2]])
    assert torch.equal(qr[..., 16:], q[..., 16:]) and torch.equal(kr[..., 16:], k[..., 16:])
    assert not torch.equal(qr[1], q[1])


def test_k_may_be_none_and_gives_the_same_q(device):
    cos, sin = rope_tables(64, 32, device=device)
    q, k = _seq(4, 3, 1, 32, torch.bfloat16, device, 11)
    pos = torch.tensor([1, 2, 60, 0], device=device)
    qa, ka = apply_rope(q, k, cos, sin, pos, interleaved=True)
    qb, kb = apply_rope(q, None, cos, sin, pos, interleaved=True)
    assert kb is None and torch.equal(qa, qb)
    leaf = q.clone().requires_grad_(True)
    apply_rope(leaf, None, cos, sin, pos)[0].float().sum().backward()
    assert leaf.grad.shape == q.shape


def test_only_k_used_downstream(device):
    """Autograd gives no gradient for the unused q output: dq is zero, dk is the inverse rotation."""
    cos, sin = rope_tables(64, 32, device=device)
    q, k = _seq(4, 2, 2, 32, torch.float32, device, 12)
    q, k = q.requires_grad_(True), k.requires_grad_(True)
    _, kr = apply_rope(q, k, cos, sin, torch.tensor([1, 2, 3, 4], device=device))
    kr.sum().backward()
    assert q.grad is None or torch.count_nonzero(q.grad) == 0
    c64, s64, up = cos.double().cpu().numpy(), sin.double().cpu().numpy(), np.ones((4, 2, 32))
    ref = rope_grad_reference(up, c64, s64, [1, 2, 3, 4])
    bound = contracts.judgment("rope", torch.float32, "gradient_accuracy", arch_of(torch.device(device)))
    assert contracts.rounding_plus_sensitivity_ratio(k.grad.double().cpu().numpy(), ref,
                                                     rope_scale(up, c64, s64, [1, 2, 3, 4]), bound) <= 1.0


def test_empty_batch(device):
    cos, sin = rope_tables(8, 8, device=device)
    q = torch.zeros(0, 2, 8, device=device, requires_grad=True)
    no_pos = torch.zeros(0, dtype=torch.long, device=device)
    qr, kr = apply_rope(q, torch.zeros(0, 1, 8, device=device), cos, sin, no_pos)
    assert qr.shape == (0, 2, 8) and kr.shape == (0, 1, 8)


def test_rope_under_torch_compile(device):
    cos, sin = rope_tables(128, 32, device=device)
    q, k = _seq(5, 2, 1, 32, torch.float32, device, 13)
    pos = torch.tensor([0, 5, 127, 3, 9], device=device)

    def f(q, k):
        return apply_rope(q, k, cos, sin, pos, validate=False)

    # The rotation and its backward compared, not a loss reduced inside the graph: inductor's sum is
    # not eager torch's (another order), so a loss would differ in its last bits for that reason alone.
    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    qa, ka = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    qb, kb = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    ya, yb = f(qa, ka), compiled(qb, kb)
    up = (torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(device),
          torch.randn(k.shape, generator=torch.Generator().manual_seed(2)).to(device))
    torch.autograd.backward(ya, up)
    torch.autograd.backward(yb, up)
    assert all(torch.equal(a, b) for a, b in zip(ya, yb))
    assert torch.equal(qa.grad, qb.grad) and torch.equal(ka.grad, kb.grad)


# ---- position ids ----

def test_position_ids_from_cu_seqlens_and_offsets(device):
    cu = torch.tensor([0, 3, 3, 5], device=device)
    assert rope_position_ids(cu).tolist() == [0, 1, 2, 0, 1]
    assert rope_position_ids(cu, torch.tensor([10, 0, 7], device=device)).tolist() == [10, 11, 12, 7, 8]
    assert rope_position_ids(cu.int(), num_tokens=5, validate=False).tolist() == [0, 1, 2, 0, 1]
    assert rope_position_ids(torch.tensor([0], device=device)).numel() == 0


@pytest.mark.parametrize("cu,offsets,argument,error", [
    ([1, 3], None, "cu_seqlens", errors.ShapeError), ([0, 3, 2], None, "cu_seqlens", errors.ShapeError),
    ([0, 3], [1, 2], "offsets", errors.ShapeError), ([0, 3], [-1], "offsets", errors.IdRangeError)])
def test_bad_position_id_arguments(cu, offsets, argument, error, device):
    with pytest.raises(error) as e:
        rope_position_ids(torch.tensor(cu, device=device),
                          None if offsets is None else torch.tensor(offsets, device=device))
    assert e.value.argument == argument
    with pytest.raises(errors.DTypeError):
        rope_position_ids(torch.tensor([0.0, 1.0], device=device))


# ---- typed errors on bad input ----

def _ok(device, dtype=torch.float32):
    cos, sin = rope_tables(16, 8, device=device)
    q = torch.randn(3, 2, 8, device=device).to(dtype)
    k = torch.randn(3, 1, 8, device=device).to(dtype)
    return q, k, cos, sin, torch.tensor([0, 1, 15], device=device)


@pytest.mark.parametrize("breakage,argument,error", [
    (lambda a: a.update(q=a["q"].double()), "q", errors.DTypeError),
    (lambda a: a.update(q=[[0.0]]), "q", errors.DTypeError),
    (lambda a: a.update(q=a["q"][0]), "q", errors.ShapeError),
    (lambda a: a.update(k=a["k"].half()), "k", errors.DTypeError),
    (lambda a: a.update(k=a["k"][:2]), "k", errors.ShapeError),
    (lambda a: a.update(k=torch.zeros(3, 1, 6, device=a["q"].device)), "k", errors.ShapeError),
    (lambda a: a.update(q=torch.zeros(3, 8, 2, device=a["q"].device).transpose(1, 2)), "q", errors.LayoutError),
    (lambda a: a.update(cos=a["cos"].double()), "cos", errors.DTypeError),
    (lambda a: a.update(cos=a["cos"][0]), "cos", errors.ShapeError),
    (lambda a: a.update(sin=a["sin"][:, :2]), "sin", errors.ShapeError),
    (lambda a: a.update(cos=torch.zeros(16, 5, device=a["q"].device), sin=torch.zeros(16, 5, device=a["q"].device)),
     "cos", errors.ShapeError),
    (lambda a: a.update(position_ids=a["position_ids"].float()), "position_ids", errors.DTypeError),
    (lambda a: a.update(position_ids=a["position_ids"][:2]), "position_ids", errors.ShapeError),
])
def test_typed_errors_name_the_argument(breakage, argument, error, device):
    q, k, cos, sin, pos = _ok(device)
    args = dict(q=q, k=k, cos=cos, sin=sin, position_ids=pos)
    breakage(args)
    with pytest.raises(error) as e:
        apply_rope(**args)
    assert e.value.argument == argument


@pytest.mark.parametrize("bad", (16, -1, 10**9))
def test_out_of_table_position_names_id_and_place(bad, device):
    q, k, cos, sin, pos = _ok(device)
    pos[1] = bad
    with pytest.raises(errors.IdRangeError) as e:
        apply_rope(q, k, cos, sin, pos)
    assert e.value.argument == "position_ids" and f"position {bad} at flat position 1" in str(e.value)
    assert isinstance(e.value, IndexError)
    qr, kr = apply_rope(q, k, cos, sin, pos, validate=False)  # NaN for that token, never a wrong rotation
    assert torch.isnan(qr[1]).all() and torch.isnan(kr[1]).all()
    assert torch.isfinite(qr[[0, 2]]).all() and torch.isfinite(kr[[0, 2]]).all()


# ---- GPU ----

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", (False, True))
def test_rope_within_contract_gpu(dtype, interleaved):
    for i, (layout, (rd, sc)) in enumerate(itertools.product(ROPE_LAYOUTS, ((None, "none"), (64, "llama3")))):
        case = RopeCase(512, 32, 8, 128, dtype, interleaved, rd, 131072, 500000.0, sc, 1.0, layout, seed=i)
        ratios = judge_rope(case, "cuda")
        assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: {ratios}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", (False, True))
def test_rope_batch_invariant_gpu(dtype, interleaved):
    assert_batch_invariant(rope_row_op(32, 8, 128, dtype, "cuda", interleaved, max_positions=131072),
                           probe_rows=4, batch_sizes=(5, 64, 1000))
