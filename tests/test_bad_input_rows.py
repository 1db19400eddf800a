"""Bad input, row by row: strided index tensors, indices past a table with validate=False, broken
cu_seqlens, empty dims, and NaN / inf confined to their row (a fuzz run's findings and their siblings).

Rules checked here (docs of each op): an index / id tensor may be any strided view (the bits of its
contiguous copy); validate=False never reads or writes outside a tensor (an index past it gives NaN,
never a neighbour's values); empty dims give empty (or empty-sum) results; a NaN / inf stays in its row.
"""
import pytest
import torch

from rlk_triton import errors
from rlk_triton.logp import linear_logp, selected_logp, selected_logp_indexed
from rlk_triton.ops import embedding as emb_op
from rlk_triton.ops import linear_logp as ll_op
from rlk_triton.ops import rmsnorm as rn_op
from rlk_triton.ops import rope as rope_op
from rlk_triton.ops import selected_logp as sl_op
from rlk_triton.ops.embedding import embedding
from rlk_triton.ops.matmul import matmul
from rlk_triton.ops.rmsnorm import rms_norm
from rlk_triton.ops.rope import apply_rope, rope_position_ids, rope_tables
from rlk_triton.ops.swiglu import swiglu
from rlk_triton.packing import pad, sequence_ids, unpad
from rlk_triton.testing.linear_parity import LinearCase, judge_linear_logp
from rlk_triton.testing.matmul_parity import MatmulCase, judge_matmul

BACKENDS = ("triton", "torch_reference")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _strided(ids):
    """A view of ids with stride 2 (every other element of a longer tensor), not contiguous."""
    wide = torch.full((2 * ids.numel(),), -7, dtype=ids.dtype, device=ids.device)
    wide[::2] = ids.reshape(-1)
    view = wide[::2].view(ids.shape) if ids.dim() == 1 else wide.view(*ids.shape[:-1], 2 * ids.shape[-1])[..., ::2]
    assert not view.is_contiguous() and torch.equal(view, ids)
    return view


def _grads(outs, inputs, grad_outs, retain_graph=False):
    return torch.autograd.grad(outs, inputs, grad_outs, retain_graph=retain_graph)


def _same_except(a, b, bad_rows, dim=0):
    """a and b are torch.equal outside the rows bad_rows of dim."""
    keep = [i for i in range(a.shape[dim]) if i not in bad_rows]
    idx = torch.tensor(keep, dtype=torch.long, device=a.device)
    return torch.equal(a.index_select(dim, idx), b.index_select(dim, idx))


def _equal_nan(a, b):
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a[~torch.isnan(a)], b[~torch.isnan(b)])


# ---- 1. strided (non-contiguous) index tensors give the contiguous copy's bits ----

@pytest.mark.parametrize("validate", (True, False))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64))
def test_strided_target_and_row_indices(device, validate, backend, index_dtype):
    x = torch.randn(6, 50, generator=_gen(0)).to(device).requires_grad_(True)
    t = torch.randint(0, 50, (6,), generator=_gen(1)).to(device, index_dtype)
    t[2] = -100
    g = torch.randn(6, generator=_gen(2)).to(device)
    kw = dict(return_entropy=True, validate=validate, backend=backend)
    ref = selected_logp(x, t, **kw)
    out = selected_logp(x, _strided(t), **kw)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    assert torch.equal(_grads(out[0], x, g)[0], _grads(ref[0], x, g)[0])
    # 2-D targets sliced out of a wider batch: tokens[:, ::2]
    x3 = x.detach().view(2, 3, 50)
    t2 = t.view(2, 3)
    assert torch.equal(selected_logp(x3, _strided(t2), validate=validate, backend=backend),
                       selected_logp(x3, t2, validate=validate, backend=backend))
    rows = torch.tensor([4, 0, 5], dtype=index_dtype, device=device)
    ref = selected_logp_indexed(x, t[:3], rows, **kw)
    out = selected_logp_indexed(x, _strided(t[:3].contiguous()), _strided(rows), **kw)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    assert torch.equal(_grads(out[0], x, g[:3])[0], _grads(ref[0], x, g[:3])[0])


def test_strided_indices_at_the_launchers(device):
    # the kernels' launchers (the custom ops' bodies) read index tensors densely: a strided one is copied
    x = torch.randn(6, 50, generator=_gen(3)).to(device)
    t = torch.randint(0, 50, (3,), generator=_gen(4)).to(device)
    rows = torch.tensor([5, 1, 3], device=device)
    ref = sl_op.launch_forward(x, t, rows, 1.0, None, -100, True)
    out = sl_op.launch_forward(x, _strided(t), _strided(rows), 1.0, None, -100, True)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    g = torch.randn(3, generator=_gen(5)).to(device)
    d_ref = sl_op.launch_backward(g, None, x, t, rows, 1.0, None, -100, ref[2], ref[3], ref[1])
    d_out = sl_op.launch_backward(g, None, x, _strided(t), _strided(rows), 1.0, None, -100, ref[2], ref[3], ref[1])
    assert torch.equal(d_out, d_ref)
    w = torch.randn(9, 5, generator=_gen(6)).to(device)
    ids = torch.tensor([3, 8, 0, 3], device=device)
    assert torch.equal(emb_op.launch_forward(_strided(ids), w), w[ids])
    cos, sin = rope_tables(16, 4, device=device)
    q = torch.randn(4, 2, 4, generator=_gen(7)).to(device)
    pos = torch.tensor([9, 0, 15, 2], device=device)
    assert all(torch.equal(a, b) for a, b in zip(rope_op.launch(q, None, cos, sin, _strided(pos), False, False),
                                                 rope_op.launch(q, None, cos, sin, pos, False, False)))
    hidden = torch.randn(4, 8, generator=_gen(60)).to(device)
    weight = torch.randn(9, 8, generator=_gen(61)).to(device)
    stats = ll_op.tile_stats(hidden, weight, None, ll_op.local_targets(ids, 0, 9, -100), 1.0, True)
    assert all(torch.equal(a, b) for a, b in zip(ll_op.merge(stats, _strided(ids), -100, True),
                                                 ll_op.merge(stats, ids, -100, True)))


@pytest.mark.parametrize("validate", (True, False))
def test_strided_ids_of_linear_logp_embedding_and_rope(device, validate):
    h = torch.randn(4, 16, generator=_gen(8)).to(device).requires_grad_(True)
    w = torch.randn(40, 16, generator=_gen(9)).to(device).requires_grad_(True)
    t = torch.tensor([3, 39, -100, 0], device=device)
    g = torch.randn(4, generator=_gen(10)).to(device)
    ref = linear_logp(h, w, t, return_entropy=True, validate=validate)
    out = linear_logp(h, w, _strided(t), return_entropy=True, validate=validate)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    assert all(torch.equal(a, b) for a, b in zip(_grads(out[0], (h, w), g), _grads(ref[0], (h, w), g)))

    table = torch.randn(12, 6, generator=_gen(11)).to(device).requires_grad_(True)
    ids = torch.tensor([[3, 11, 0], [3, 7, 3]], device=device, dtype=torch.int32)
    go = torch.randn(2, 3, 6, generator=_gen(12)).to(device)
    ref = embedding(ids, table, validate=validate)
    out = embedding(_strided(ids), table, validate=validate)
    assert torch.equal(out, ref) and torch.equal(ref, table.detach()[ids.long()])
    assert torch.equal(_grads(out, table, go)[0], _grads(ref, table, go)[0])

    cos, sin = rope_tables(32, 8, device=device)
    q = torch.randn(2, 3, 2, 8, generator=_gen(13)).to(device).requires_grad_(True)
    k = torch.randn(2, 3, 1, 8, generator=_gen(14)).to(device).requires_grad_(True)
    pos = torch.tensor([[0, 31, 5], [7, 7, 2]], device=device)
    ref = apply_rope(q, k, cos, sin, pos, validate=validate)
    out = apply_rope(q, k, cos, sin, _strided(pos), validate=validate)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    assert all(torch.equal(a, b) for a, b in zip(_grads(out, (q, k), ref), _grads(ref, (q, k), ref)))


@pytest.mark.parametrize("cu_dtype", (torch.int32, torch.int64))
def test_strided_cu_seqlens_and_offsets(device, cu_dtype):
    cu = torch.tensor([0, 3, 3, 8, 9], dtype=cu_dtype, device=device)
    v = torch.randn(9, 2, generator=_gen(15)).to(device)
    ref = pad(v, cu, 6)
    out = pad(v, _strided(cu), 6)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    out = pad(v, _strided(cu), 6, validate=False)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert torch.equal(unpad(ref[0], _strided(cu)), v)
    assert torch.equal(sequence_ids(_strided(cu), 9), sequence_ids(cu, 9))
    offsets = torch.tensor([4, 0, 1, 2], dtype=cu_dtype, device=device)
    for validate in (True, False):
        assert torch.equal(rope_position_ids(_strided(cu), _strided(offsets), validate=validate),
                           rope_position_ids(cu, offsets, validate=validate))


# ---- 2. an index past the tensor with validate=False: NaN, never a read outside it ----

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("V", (50, 40000))  # one vocab chunk; several chunks and the merge kernel
def test_indexed_row_past_the_logits_is_nan_and_reads_nothing(device, backend, V):
    # logits are rows 1..2 of a 5-row buffer: a kernel reading row 2 or row -1 of the view would read
    # buf[3] / buf[0], real memory with finite values, and return a finite logp
    buf = torch.randn(5, V, generator=_gen(16)).to(device).requires_grad_(True)
    x = buf[1:3]
    t = torch.tensor([7, 3, 11, 5], device=device)
    for bad in (2, -1, 2**40):
        rows = torch.tensor([1, bad, 0, bad + 3], device=device)
        logp, ent = selected_logp_indexed(x, t, rows, return_entropy=True, validate=False, backend=backend)
        good_lp, good_ent = selected_logp_indexed(x, t[[0, 2]], rows[[0, 2]], return_entropy=True, backend=backend)
        assert torch.isnan(logp[[1, 3]]).all() and torch.isnan(ent[[1, 3]]).all()
        assert torch.equal(logp[[0, 2]], good_lp.detach()) and torch.equal(ent[[0, 2]], good_ent.detach())
        again = selected_logp_indexed(x, t, rows, validate=False, backend=backend)
        assert _equal_nan(again, logp)  # the same every run: nothing read from outside
        # the missing rows add nothing to the gradient; the real rows get exactly their gradient
        g = torch.randn(4, generator=_gen(17)).to(device)
        (d,) = _grads(logp, x, torch.where(torch.isnan(logp), 0.0, g))
        (d_good,) = _grads(good_lp, x, g[[0, 2]])
        assert torch.equal(d, d_good)
    with pytest.raises(errors.ShapeError) as e:
        selected_logp_indexed(x, t[:2], torch.tensor([0, 2], device=device), backend=backend)
    assert e.value.argument == "row_indices"


@pytest.mark.parametrize("backend", BACKENDS)
def test_indexed_rows_into_logits_without_rows(device, backend):
    # every row number is out of range: a typed error without a sync, validated or not
    for validate in (True, False):
        with pytest.raises(errors.ShapeError) as e:
            selected_logp_indexed(torch.randn(0, 5, device=device), torch.zeros(2, dtype=torch.long, device=device),
                                  torch.tensor([0, 1], device=device), validate=validate, backend=backend)
        assert e.value.argument == "row_indices"


def test_selected_logp_launchers_on_zero_logit_rows_launch_nothing(device):
    # the custom op's body, reached without the public checks: NaN, no kernel reading row 0 of nothing
    x = torch.empty(0, 5, device=device)
    t = torch.zeros(2, dtype=torch.long, device=device)
    outs = sl_op.launch_forward(x, t, torch.tensor([0, 3], device=device), 1.0, None, -100, True)
    assert all(o.shape == (2,) and torch.isnan(o).all() for o in outs)
    g = sl_op.launch_backward(torch.ones(2, device=device), None, x, t, torch.tensor([0, 3], device=device), 1.0,
                              None, -100, outs[2], outs[3], outs[1])
    assert g.shape == (0, 5)


def test_reference_backend_out_of_range_target_is_nan_like_the_kernel(device):
    x = torch.randn(3, 50, generator=_gen(18)).to(device)
    t = torch.tensor([4, 50, -3], device=device)
    for backend in BACKENDS:
        out = selected_logp(x, t, validate=False, backend=backend)
        assert torch.isnan(out[1:]).all() and torch.isfinite(out[0])
        assert torch.equal(out[0:1], selected_logp(x[0:1], t[0:1], backend=backend))


def test_embedding_id_past_the_table_is_nan_and_reads_nothing(device):
    big = torch.randn(6, 5, generator=_gen(19)).to(device)
    table = big[1:4].detach().clone().requires_grad_(True)
    view = big[1:4]  # a view: rows 0 and 4 of big lie just outside it
    ids = torch.tensor([0, 3, 2, -1, 2**40, 1], device=device)
    ok = torch.tensor([True, False, True, False, False, True], device=device)
    for w in (view, table):
        out = embedding(ids, w, validate=False)
        assert torch.isnan(out[~ok]).all() and torch.equal(out[ok], w.detach()[ids[ok]])
    go = torch.randn(6, 5, generator=_gen(20)).to(device)
    (dw,) = _grads(embedding(ids, table, validate=False), table, go)
    (dw_ok,) = _grads(embedding(ids[ok], table), table, go[ok])
    assert torch.equal(dw, dw_ok)
    with pytest.raises(errors.IdRangeError) as e:
        embedding(ids, table)
    assert e.value.argument == "token_ids"
    empty = torch.empty(0, 5, device=device)  # no row at all: every id is past it
    assert torch.isnan(embedding(ids[:2], empty, validate=False)).all()


def test_rope_position_past_the_table_is_nan_and_reads_nothing(device):
    cos_big, sin_big = rope_tables(12, 4, device=device)
    cos, sin = cos_big[2:6], sin_big[2:6]  # views: the positions around them are real memory
    q = torch.randn(5, 2, 6, generator=_gen(21)).to(device)
    pos = torch.tensor([0, 4, 3, -1, 2**40], device=device)
    ok = torch.tensor([True, False, True, False, False], device=device)
    out, _ = apply_rope(q, None, cos, sin, pos, validate=False)
    ref, _ = apply_rope(q[ok], None, cos, sin, pos[ok])
    assert torch.isnan(out[~ok][..., :4]).all() and torch.equal(out[ok], ref)
    assert torch.equal(out[..., 4:], q[..., 4:])  # dims past the rotary dim: copied
    # an empty table: position 0 does not exist either (this read past the table before)
    out, _ = apply_rope(q, None, cos[:0], sin[:0], torch.zeros(5, dtype=torch.long, device=device), validate=False)
    assert torch.isnan(out[..., :4]).all() and torch.equal(out[..., 4:], q[..., 4:])
    with pytest.raises(errors.IdRangeError) as e:
        apply_rope(q, None, cos, sin, pos)
    assert e.value.argument == "position_ids"


# ---- 3. cu_seqlens and max_seqlen of the packed layout ----

def _pad_reference(values, cu, T):
    """pad's documented result for any cu_seqlens (validate=False): (b, j) holds values[cu[b] + j]
    where 0 <= cu[b] + j < min(cu[b + 1], N), else 0."""
    n, B = values.shape[0], len(cu) - 1
    out = torch.zeros((B, T) + tuple(values.shape[1:]), dtype=values.dtype)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):
        for j in range(T):
            s = cu[b] + j
            if 0 <= s < min(cu[b + 1], n):
                out[b, j], mask[b, j] = values[s].cpu(), True
    return out, mask


def test_unpad_rejects_bad_cu_seqlens(device):
    padded = torch.randn(3, 5, generator=_gen(22)).to(device)
    for bad, err in (([2, 3, 7, 10], errors.InputError),   # does not start at 0: was a [10] result
                     ([0, 3, 9, 10], errors.ShapeError),   # a sequence of 6 > T = 5: was a bare IndexError
                     ([0, 3, 2, 4], errors.InputError),    # decreasing: was a silent [4] result
                     ([0, -2, 1, 3], errors.InputError)):
        with pytest.raises(err) as e:
            unpad(padded, torch.tensor(bad, device=device))
        assert e.value.argument == "cu_seqlens", bad
    cu = torch.tensor([0, 2, 2, 7], device=device)
    expect = torch.cat([padded[0, :2], padded[2, :5]])
    assert torch.equal(unpad(padded, cu), expect)


def test_pad_max_seqlen_shorter_than_a_sequence(device):
    v = torch.randn(10, 2, generator=_gen(23)).to(device)
    cu = torch.tensor([0, 3, 10], device=device)
    with pytest.raises(errors.InputError) as e:
        pad(v, cu, 4)
    assert e.value.argument == "max_seqlen"
    out, mask = pad(v, cu, 4, validate=False)  # documented: the sequence is cut to max_seqlen tokens
    ref, ref_mask = _pad_reference(v, [0, 3, 10], 4)
    assert torch.equal(out.cpu(), ref) and torch.equal(mask.cpu(), ref_mask)
    assert torch.equal(out[1], v[3:7])
    with pytest.raises(errors.InputError) as e:
        pad(v, torch.tensor([0, 3, 9], device=device), 8)  # ends before N: cu_seqlens' fault
    assert e.value.argument == "cu_seqlens"


@pytest.mark.parametrize("cu", ([-3, 3, 10], [-30, 3, 10], [0, 7, 4], [4, 20, 25], [0, 3, 10**12], [12, 1, 2]))
def test_pad_without_validation_stays_inside_values(device, cu):
    v = torch.randn(10, generator=_gen(24)).to(device).requires_grad_(True)
    out, mask = pad(v, torch.tensor(cu, device=device), 8, validate=False)
    ref, ref_mask = _pad_reference(v.detach(), cu, 8)
    assert torch.equal(out.detach().cpu(), ref) and torch.equal(mask.cpu(), ref_mask)
    with pytest.raises(errors.InputError) as e:
        pad(v, torch.tensor(cu, device=device), 8)
    assert e.value.argument in ("cu_seqlens", "max_seqlen")
    out.sum().backward()  # each real token's gradient: how often the documented result holds it
    counts = torch.zeros(10)
    for b in range(len(cu) - 1):
        for j in range(8):
            if ref_mask[b, j]:
                counts[cu[b] + j] += 1
    assert torch.equal(v.grad.cpu(), counts)


def test_sequence_ids_and_position_ids_reject_bad_sizes(device):
    cu = torch.tensor([0, 2, 5], device=device)
    for bad in (-1, 2.0, True):
        with pytest.raises(errors.InputError) as e:
            sequence_ids(cu, bad)
        assert e.value.argument == "n_tokens"
        with pytest.raises(errors.InputError) as e:
            rope_position_ids(cu, num_tokens=bad)
        assert e.value.argument == "num_tokens"
    with pytest.raises(errors.ShapeError) as e:
        rope_position_ids(torch.tensor([0, 2, -4], device=device), validate=False)
    assert e.value.argument == "cu_seqlens"


# ---- 4. empty dims: empty in, empty (or the empty sum) out, forward and backward ----

@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("mnk", ((5, 7, 0), (0, 7, 3), (5, 0, 3), (0, 0, 0)))
def test_matmul_empty_dims_match_the_reference(device, dtype, mnk):
    m, n, k = mnk
    ratios = judge_matmul(MatmulCase(m, n, k, dtype, True, 1.0, seed=m + n + k), device)
    assert max(ratios.values()) <= 1.0, ratios
    a = torch.randn(m, k, generator=_gen(25)).to(device, dtype).requires_grad_(True)
    b = torch.randn(k, n, generator=_gen(26)).to(device, dtype).requires_grad_(True)
    bias = torch.randn(n, generator=_gen(27)).to(device, dtype).requires_grad_(True)
    out = matmul(a, b, bias)
    assert out.shape == (m, n) and out.dtype == dtype
    if k == 0:  # the empty sum, plus bias
        assert torch.equal(out, bias.detach().expand(m, n))
    out.sum().backward()  # upstream ones: d bias = M exactly
    assert a.grad.shape == (m, k) and b.grad.shape == (k, n)
    if n == 0:
        assert torch.equal(a.grad, torch.zeros(m, k, dtype=dtype, device=device))
    assert torch.equal(bias.grad, torch.full((n,), float(m), dtype=dtype, device=device))
    # leading dims that multiply to zero, and K = 0 behind leading dims
    assert matmul(torch.randn(2, 0, k, device=device, dtype=dtype), b.detach()).shape == (2, 0, n)
    assert torch.equal(matmul(torch.randn(2, 3, 0, device=device, dtype=dtype), torch.randn(0, 4, device=device,
                                                                                            dtype=dtype)),
                       torch.zeros(2, 3, 4, device=device, dtype=dtype))


@pytest.mark.parametrize("shape", ((3, 0), (0, 4), (2, 0, 5), (2, 3, 0)))
def test_swiglu_empty_dims(device, shape):
    g = torch.randn(shape, generator=_gen(28)).to(device).requires_grad_(True)
    u = torch.randn(shape, generator=_gen(29)).to(device).requires_grad_(True)
    y = swiglu(g, u)
    assert torch.equal(y, torch.nn.functional.silu(g.detach()) * u.detach()) and y.shape == shape
    dg, du = _grads(y, (g, u), torch.ones(shape, device=device))
    assert dg.shape == shape and du.shape == shape


def test_linear_logp_with_an_empty_hidden_dim(device):
    # H = 0: logits are the bias (or 0), a valid softmax; judged against float64 by the contract
    for dtype in (torch.float32, torch.bfloat16):
        for bias in (True, False):
            ratios = judge_linear_logp(LinearCase(4, 0, 50, dtype, bias=bias, seed=3), device)
            assert max(ratios.values()) <= 1.0, ratios
    h = torch.randn(3, 0, device=device, requires_grad=True)
    w = torch.randn(5, 0, device=device, requires_grad=True)
    lp = linear_logp(h, w, torch.tensor([0, 4, 2], device=device))
    assert lp.shape == (3,) and torch.isfinite(lp).all() and torch.equal(lp, lp[:1].expand(3))
    lp.sum().backward()
    assert h.grad.shape == (3, 0) and w.grad.shape == (5, 0)
    out = linear_logp(torch.randn(0, 4, device=device), torch.randn(5, 4, device=device),
                      torch.empty(0, dtype=torch.long, device=device))
    assert out.shape == (0,)


def test_rope_rmsnorm_embedding_selected_logp_empty_dims(device):
    cos, sin = rope_tables(8, 4, device=device)
    for qs, c in (((2, 3, 0, 4), cos), ((2, 0, 2, 4), cos), ((2, 3, 2, 0), cos[:, :0]), ((0, 2, 4), cos)):
        q = torch.randn(qs, device=device, requires_grad=True)
        pos = torch.zeros(qs[:-2], dtype=torch.long, device=device)
        q_rot, _ = apply_rope(q, None, c, c.clone(), pos)
        assert q_rot.shape == qs
        q_rot.sum().backward()
        assert q.grad.shape == qs
    for xs in ((0, 4), (2, 0, 4)):
        x = torch.randn(xs, device=device, requires_grad=True)
        w = torch.ones(4, device=device, requires_grad=True)
        y = rms_norm(x, w)
        assert y.shape == xs
        y.sum().backward()
        assert x.grad.shape == xs and torch.equal(w.grad, torch.zeros(4, device=device))
    w = torch.randn(5, 0, device=device, requires_grad=True)
    assert embedding(torch.tensor([[1, 2]], device=device), w).shape == (1, 2, 0)
    assert embedding(torch.empty(2, 0, dtype=torch.long, device=device), torch.randn(5, 3, device=device)).shape \
        == (2, 0, 3)
    for backend in BACKENDS:
        x = torch.empty(0, 0, device=device, requires_grad=True)
        out = selected_logp(x, torch.empty(0, dtype=torch.long, device=device), backend=backend)
        assert out.shape == (0,)
        out.sum().backward()
        assert x.grad.shape == (0, 0)
        out = selected_logp(torch.empty(2, 3, 0, 7, device=device), torch.empty(2, 3, 0, dtype=torch.long,
                                                                                 device=device), backend=backend)
        assert out.shape == (2, 3, 0)


# ---- 5. a NaN / inf in one row stays in that row ----

POISONS = (float("nan"), float("inf"), float("-inf"))


def _poisoned(x, row, value, cols=(1, 3)):
    y = x.detach().clone()
    y[row, list(cols)] = value
    return y


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("poison", POISONS)
def test_selected_logp_bad_row_stays_in_its_row(device, backend, poison):
    x = torch.randn(5, 40, generator=_gen(30)).to(device)
    t = torch.randint(0, 40, (5,), generator=_gen(31)).to(device)
    g, ge = torch.randn(5, generator=_gen(32)).to(device), torch.randn(5, generator=_gen(33)).to(device)
    results = []
    for xx in (x, _poisoned(x, 2, poison)):
        xx = xx.requires_grad_(True)
        lp, ent = selected_logp(xx, t, return_entropy=True, backend=backend)
        results.append((lp.detach(), ent.detach(), _grads((lp, ent), xx, (g, ge))[0]))
    (lp0, e0, d0), (lp1, e1, d1) = results
    assert _same_except(lp0, lp1, {2}) and _same_except(e0, e1, {2}) and _same_except(d0, d1, {2})
    if poison != float("-inf"):  # -inf in two non-target lanes is a valid logit
        assert not torch.isfinite(lp1[2]) or not torch.isfinite(e1[2])


@pytest.mark.parametrize("poison", POISONS[:2])
def test_selected_logp_indexed_bad_row_stays_in_its_row(device, poison):
    x = torch.randn(6, 40, generator=_gen(34)).to(device)
    t = torch.randint(0, 40, (3,), generator=_gen(35)).to(device)
    rows = torch.tensor([5, 1, 3], device=device)
    g = torch.randn(3, generator=_gen(36)).to(device)
    res = []
    for bad_row in (None, 1, 0):  # a scored row, an unscored row (never read: no change at all)
        xx = (x if bad_row is None else _poisoned(x, bad_row, poison)).requires_grad_(True)
        lp = selected_logp_indexed(xx, t, rows)
        res.append((lp.detach(), _grads(lp, xx, g)[0]))
    assert _same_except(res[0][0], res[1][0], {1}) and _same_except(res[0][1], res[1][1], {1})
    assert not torch.isfinite(res[1][0][1])
    assert torch.equal(res[0][0], res[2][0]) and torch.equal(res[0][1], res[2][1])


@pytest.mark.parametrize("poison", POISONS)
def test_linear_logp_bad_hidden_row_stays_in_its_row(device, poison):
    h = torch.randn(6, 16, generator=_gen(37)).to(device)
    w = torch.randn(70, 16, generator=_gen(38)).to(device)
    b = torch.randn(70, generator=_gen(39)).to(device)
    t = torch.randint(0, 70, (6,), generator=_gen(40)).to(device)
    g, ge = torch.randn(6, generator=_gen(41)).to(device), torch.randn(6, generator=_gen(42)).to(device)
    res = []
    for hh in (h, _poisoned(h, 4, poison)):
        hh = hh.requires_grad_(True)
        lp, ent = linear_logp(hh, w, t, bias=b, return_entropy=True)
        res.append((lp.detach(), ent.detach(), _grads((lp, ent), hh, (g, ge))[0]))
    for a, c in zip(*res):  # logp, entropy, d hidden (d weight / d bias sum over rows: every row's)
        assert _same_except(a, c, {4})
    assert not torch.isfinite(res[1][0][4])


@pytest.mark.parametrize("poison", POISONS)
@pytest.mark.parametrize("with_residual", (False, True))
def test_rms_norm_bad_row_stays_in_its_row(device, poison, with_residual):
    x = torch.randn(7, 24, generator=_gen(43)).to(device)
    r = torch.randn(7, 24, generator=_gen(44)).to(device)
    w = torch.randn(24, generator=_gen(45)).to(device)
    gy = torch.randn(7, 24, generator=_gen(46)).to(device)
    res = []
    for xx in (x, _poisoned(x, 3, poison)):
        xx = xx.requires_grad_(True)
        if with_residual:
            y, res_out = rms_norm(xx, w, residual=r)
            res.append((y.detach(), res_out.detach(), _grads((y, res_out), xx, (gy, gy))[0]))
        else:
            y = rms_norm(xx, w)
            res.append((y.detach(), _grads(y, xx, gy)[0]))
    for a, c in zip(*res):
        assert _same_except(a, c, {3})
    assert not torch.isfinite(res[1][0][3]).all()
    # the multi-row forward kernel (locked for wide bf16 rows on the GPU): rows of one tile stay apart
    clean = rn_op.launch_forward(x, w, None, 1e-6, 0.0, rows_per_program=4)
    bad = rn_op.launch_forward(_poisoned(x, 3, poison), w, None, 1e-6, 0.0, rows_per_program=4)
    assert _same_except(clean[0], bad[0], {3}) and _same_except(clean[2], bad[2], {3})


@pytest.mark.parametrize("poison", POISONS)
def test_swiglu_bad_row_stays_in_its_row(device, poison):
    gate = torch.randn(5, 20, generator=_gen(47)).to(device)
    up = torch.randn(5, 20, generator=_gen(48)).to(device)
    gy = torch.randn(5, 20, generator=_gen(49)).to(device)
    res = []
    for gg, uu in ((gate, up), (_poisoned(gate, 1, poison), _poisoned(up, 1, poison, cols=(2, 3)))):
        gg, uu = gg.requires_grad_(True), uu.requires_grad_(True)
        y = swiglu(gg, uu)
        res.append((y.detach(),) + _grads(y, (gg, uu), gy))
    for a, c in zip(*res):
        assert _same_except(a, c, {1})


@pytest.mark.parametrize("poison", POISONS)
def test_rope_bad_token_stays_in_its_token(device, poison):
    cos, sin = rope_tables(16, 6, device=device)
    q = torch.randn(5, 2, 8, generator=_gen(50)).to(device)
    k = torch.randn(5, 1, 8, generator=_gen(51)).to(device)
    pos = torch.tensor([3, 0, 15, 3, 9], device=device)
    gq, gk = torch.randn(5, 2, 8, generator=_gen(52)).to(device), torch.randn(5, 1, 8, generator=_gen(53)).to(device)
    res = []
    for qq, kk in ((q, k), (_poisoned(q, 3, poison, cols=(1,)), _poisoned(k, 3, poison, cols=(0,)))):
        qq, kk = qq.requires_grad_(True), kk.requires_grad_(True)
        q_rot, k_rot = apply_rope(qq, kk, cos, sin, pos)
        res.append((q_rot.detach(), k_rot.detach()) + _grads((q_rot, k_rot), (qq, kk), (gq, gk)))
    for a, c in zip(*res):
        assert _same_except(a, c, {3})
    # a bad upstream gradient of one token: only that token's input gradients
    qq = q.clone().requires_grad_(True)
    q_rot, _ = apply_rope(qq, None, cos, sin, pos)
    (d_bad,) = _grads(q_rot, qq, _poisoned(gq, 3, poison, cols=(0,)), retain_graph=True)
    (d_ok,) = _grads(q_rot, qq, gq)
    assert _same_except(d_ok, d_bad, {3})


@pytest.mark.parametrize("poison", POISONS)
def test_embedding_bad_weight_row_and_bad_token_gradient_stay_in_their_rows(device, poison):
    w = torch.randn(9, 6, generator=_gen(54)).to(device)
    ids = torch.tensor([4, 1, 8, 4, 0, 2], device=device)
    go = torch.randn(6, 6, generator=_gen(55)).to(device)
    res = []
    for ww in (w, _poisoned(w, 4, poison)):  # tokens 0 and 3 read row 4
        ww = ww.requires_grad_(True)
        out = embedding(ids, ww)
        res.append((out.detach(), _grads(out, ww, go)[0]))
    assert _same_except(res[0][0], res[1][0], {0, 3}) and torch.equal(res[0][1], res[1][1])
    ww = w.clone().requires_grad_(True)
    out = embedding(ids, ww)
    (dw_bad,) = _grads(out, ww, _poisoned(go, 2, poison), retain_graph=True)  # token 2 (id 8): only dW[8]
    (dw_ok,) = _grads(out, ww, go)
    assert _same_except(dw_ok, dw_bad, {8}) and not torch.isfinite(dw_bad[8]).all()


@pytest.mark.parametrize("poison", POISONS)
def test_matmul_bad_row_stays_in_its_row(device, poison):
    a = torch.randn(6, 20, generator=_gen(56)).to(device)
    b = torch.randn(20, 9, generator=_gen(57)).to(device)
    g = torch.randn(6, 9, generator=_gen(58)).to(device)
    res = []
    for aa in (a, _poisoned(a, 2, poison)):
        aa = aa.requires_grad_(True)
        out = matmul(aa, b)
        res.append((out.detach(), _grads(out, aa, g)[0]))
    for x, y in zip(*res):
        assert _same_except(x, y, {2})
