"""Embedding: bitwise lookup, deterministic segment-sum dW in ascending token order (judged by
contracts/embedding.yaml and checked bitwise against the fixed-order fp32 sum), typed errors."""
import numpy as np
import pytest
import torch

from rlk_triton import errors
from rlk_triton._runtime import arch_of
from rlk_triton.ops.embedding import embedding
from rlk_triton.reference.rope_embedding import embedding_grad_reference, embedding_reference
from rlk_triton.testing.float64_checks import assert_central_differences
from rlk_triton.testing import assert_batch_invariant
from rlk_triton.testing.positional import DTYPES, EmbeddingCase, embedding_row_op, judge_embedding, make_ids

CASES = [EmbeddingCase(n, V, H, dt, pad, dup, lay, scale, seed=i)
         for i, (n, V, H, dt, pad, dup, lay, scale) in enumerate([
             (40, 30, 24, dt, pad, dup, lay, scale)
             for dt in DTYPES
             for pad, dup, lay, scale in ((None, "uniform", "contiguous", 1.0), (0, "heavy", "row_stride", 30.0),
                                          (-1, "heavy", "contiguous", 1e-3))] + [
             (200, 5, 3, dt, None, "heavy", "contiguous", 1.0) for dt in DTYPES])]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label().replace(" ", "-"))
def test_embedding_within_contract(case, device):
    ratios = judge_embedding(case, device)
    assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: error / contract bound {ratios}"


def _weight(V, H, dtype, device, seed=0):
    return torch.randn(V, H, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_is_the_weight_rows_bit_for_bit(dtype, device):
    w = _weight(37, 50, dtype, device)
    w[3, 7] = float("inf")  # any bits travel: inf, -0.0, subnormals
    w[4, 1] = -0.0
    w[5, 2] = torch.finfo(dtype).tiny / 4
    ids = torch.tensor([[3, 4, 5, 0], [36, 3, 3, 12]], device=device)
    out = embedding(ids, w)
    assert out.shape == (2, 4, 50) and out.dtype == dtype and out.is_contiguous()
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(out.view(bits), w[ids].view(bits))
    wide = torch.zeros(37, 80, dtype=dtype, device=device)
    wide[:, 10:60] = w
    assert torch.equal(embedding(ids, wide[:, 10:60]), out)  # a row-strided weight is read in place
    assert torch.equal(embedding(ids.int(), w), out) and embedding(ids[0, 0], w).shape == (50,)


def _round_like_kernel(x32, dtype, device):
    """The kernel's one fp32 -> dtype rounding. The interpreter truncates bf16 stores
    (/work/shared/notes/triton-interpreter.md); GPUs round to nearest even, as torch does."""
    if dtype == torch.bfloat16 and arch_of(torch.device(device)) == "interpreter":
        return (x32.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
    return x32.to(dtype)


def _ascending_order_sum(grad, ids, V, padding_idx=None):
    """dW as the contract fixes it: per id, ((0 + g_t0) + g_t1) + ... in fp32 for t0 < t1 < ..."""
    acc = torch.zeros(V, grad.shape[1], dtype=torch.float32)
    g = grad.float().cpu()
    for t, v in enumerate(ids.reshape(-1).tolist()):
        if padding_idx is not None and v == padding_idx % V:
            continue
        acc[v] = acc[v] + g[t]
    return acc


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("duplicates", ("heavy", "one id"))
def test_dw_is_the_ascending_token_order_fp32_sum(dtype, duplicates, device):
    V, H, N = 9, 33, 150
    gen = torch.Generator().manual_seed(1)
    ids = make_ids(N, V, "heavy", gen) if duplicates == "heavy" else torch.full((N,), 4)
    # magnitudes that make fp32 addition order visible: a different order would change bits
    grad = (torch.randn(N, H, generator=gen) * torch.logspace(-4, 4, N)[:, None]).to(dtype)
    w = _weight(V, H, dtype, device).requires_grad_(True)
    embedding(ids.to(device), w, padding_idx=2).backward(grad.to(device))
    expected = _round_like_kernel(_ascending_order_sum(grad, ids, V, padding_idx=2), dtype, device)
    assert torch.equal(w.grad.cpu(), expected)
    assert torch.count_nonzero(w.grad[2]) == 0  # padding_idx gets nothing
    if duplicates == "one id":  # the order matters for these values: a reversed sum differs
        rev = _ascending_order_sum(grad.flip(0), ids, V)
        assert not torch.equal(rev[4], _ascending_order_sum(grad, ids, V)[4])


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_dw_bitwise_on_repeat_and_independent_of_other_ids(dtype, device):
    V, H = 12, 20
    gen = torch.Generator().manual_seed(2)
    ids = make_ids(60, V, "heavy", gen)
    grad = torch.randn(60, H, generator=gen).to(dtype)
    w = _weight(V, H, dtype, device)

    def dw(i, g):
        leaf = w.clone().requires_grad_(True)
        embedding(i.to(device), leaf).backward(g.to(device))
        return leaf.grad

    first = dw(ids, grad)
    assert torch.equal(first, dw(ids, grad))
    # other tokens with new ids (>= V: a bigger table) inserted anywhere; each old id keeps its
    # tokens in the same relative order, so its row must keep its bits
    w = _weight(V + 5, H, dtype, device)
    extra_ids = torch.randint(V, V + 5, (45,), generator=gen)
    extra = torch.randn(45, H, generator=gen).to(dtype)
    slots = torch.randperm(105, generator=gen)
    mixed_ids, mixed = torch.empty(105, dtype=torch.long), torch.empty(105, H, dtype=dtype)
    old_slots = slots[:60].sort().values  # ascending: the old tokens keep their order
    mixed_ids[old_slots], mixed[old_slots] = ids, grad
    mixed_ids[slots[60:]], mixed[slots[60:]] = extra_ids, extra
    assert torch.equal(dw(mixed_ids, mixed)[:V], first)


def test_padding_idx_semantics(device):
    V, H = 10, 8
    w = _weight(V, H, torch.float32, device).requires_grad_(True)
    ids = torch.tensor([9, 1, 9, 3], device=device)
    out = embedding(ids, w, padding_idx=-1)  # -1 = V - 1, as torch
    assert torch.equal(out[0], w.detach()[9])  # the padding row is still read
    out.sum().backward()
    assert torch.count_nonzero(w.grad[9]) == 0 and torch.equal(w.grad[1], torch.ones(H, device=device))
    untouched = [v for v in range(V) if v not in (1, 3)]
    assert torch.count_nonzero(w.grad[untouched]) == 0
    ref = torch.nn.functional.embedding(ids.cpu(), w.detach().cpu().requires_grad_(True), padding_idx=9)
    assert torch.equal(out.detach().cpu(), ref.detach())


def test_reference_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    W = rng.standard_normal((6, 4))
    ids = np.array([[1, 5, 1], [0, 1, 2]])
    up = rng.standard_normal((2, 3, 4))
    for pad in (None, 1):
        grad, sens = embedding_grad_reference(up, ids, 6, pad)
        u = np.where((ids == pad)[..., None], 0.0, up)
        # linear in w: no truncation error, only the rounding of sums whose terms add up to f_scale
        assert_central_differences(lambda w: np.sum(u * embedding_reference(ids, w)), W, grad,
                                   f_scale=float(np.sum(np.abs(u * embedding_reference(ids, W)))))
        assert sens[3].sum() == 0 and (sens[1] > 0).all() == (pad is None)  # id 1 repeats unless padded


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("padding_idx", (None, 0))
def test_embedding_batch_invariant(dtype, padding_idx, device):
    report = assert_batch_invariant(embedding_row_op(30, 24, dtype, device, padding_idx), probe_rows=2,
                                    batch_sizes=(3, 7))
    assert {r.axis for r in report.results} == {"repeat", "batch_size", "row_position", "padding_rows", "neighbours"}


def test_embedding_under_torch_compile(device):
    w0 = _weight(20, 16, torch.float32, device)
    ids = torch.tensor([[1, 2, 1], [19, 0, 1]], device=device)

    def f(w):
        return (embedding(ids, w, padding_idx=0, validate=False) ** 2).sum()

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    wa, wb = w0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
    ya, yb = f(wa), compiled(wb)
    ya.backward()
    yb.backward()
    assert torch.equal(ya, yb) and torch.equal(wa.grad, wb.grad)


def test_empty_ids_and_unused_table(device):
    w = _weight(5, 4, torch.float32, device).requires_grad_(True)
    out = embedding(torch.zeros(0, 3, dtype=torch.long, device=device), w)
    assert out.shape == (0, 3, 4)
    out.sum().backward()
    assert torch.count_nonzero(w.grad) == 0 and w.grad.shape == (5, 4)


# ---- typed errors on bad input ----

@pytest.mark.parametrize("bad", (30, -1, 10**9))
def test_out_of_range_id_names_argument_id_and_position(bad, device):
    w = _weight(30, 8, torch.float32, device).requires_grad_(True)
    ids = torch.tensor([[0, 1], [2, bad]], device=device)
    with pytest.raises(errors.IdRangeError) as e:
        embedding(ids, w)
    assert e.value.argument == "token_ids" and f"id {bad} at flat position 3" in str(e.value)
    assert isinstance(e.value, IndexError)
    out = embedding(ids, w, validate=False)  # a NaN row, never another row's values
    assert torch.isnan(out[1, 1]).all() and torch.equal(out[0], w.detach()[[0, 1]])
    out[0].sum().backward()  # the bad token adds nothing to dW
    assert torch.isfinite(w.grad).all() and torch.count_nonzero(w.grad[2:]) == 0


@pytest.mark.parametrize("make,argument,error", [
    (lambda d: (torch.tensor([1], device=d), torch.zeros(4, 3, device=d).double()), "weight", errors.DTypeError),
    (lambda d: (torch.tensor([1], device=d), torch.zeros(4, device=d)), "weight", errors.ShapeError),
    (lambda d: (torch.tensor([1], device=d), torch.zeros(3, 4, device=d).t()), "weight", errors.LayoutError),
    (lambda d: (torch.tensor([1], device=d), [[0.0]]), "weight", errors.DTypeError),
    (lambda d: (torch.tensor([1.0], device=d), torch.zeros(4, 3, device=d)), "token_ids", errors.DTypeError),
    (lambda d: ([1], torch.zeros(4, 3, device=d)), "token_ids", errors.DTypeError),
])
def test_typed_errors_name_the_argument(make, argument, error, device):
    ids, w = make(device)
    with pytest.raises(error) as e:
        embedding(ids, w)
    assert e.value.argument == argument


@pytest.mark.parametrize("padding_idx", (4, -5, 1.0, True))
def test_bad_padding_idx(padding_idx, device):
    with pytest.raises(errors.InputError) as e:
        embedding(torch.tensor([1], device=device), _weight(4, 3, torch.float32, device), padding_idx=padding_idx)
    assert e.value.argument == "padding_idx"


# ---- GPU ----

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_embedding_within_contract_gpu(dtype):
    for i, (dup, pad, lay) in enumerate((("uniform", None, "contiguous"), ("heavy", 0, "row_stride"))):
        case = EmbeddingCase(4096, 151936, 512, dtype, pad, dup, lay, 1.0, seed=i)
        ratios = judge_embedding(case, "cuda")
        assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: {ratios}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dw_fixed_order_and_bitwise_repeat_gpu(dtype):
    V, H, N = 1000, 4096, 8192
    gen = torch.Generator().manual_seed(3)
    ids = make_ids(N, V, "heavy", gen)
    grad = torch.randn(N, H, generator=gen).to(dtype)
    outs = []
    for _ in range(2):
        w = _weight(V, H, dtype, "cuda").requires_grad_(True)
        embedding(ids.cuda(), w).backward(grad.cuda())
        outs.append(w.grad)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0].cpu(), _ascending_order_sum(grad, ids, V).to(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_embedding_batch_invariant_gpu(dtype):
    assert_batch_invariant(embedding_row_op(151936, 4096, dtype, "cuda"), probe_rows=4, batch_sizes=(5, 64, 1000))
