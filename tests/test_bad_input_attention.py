"""Bad input to the attention ops: typed errors naming the argument, index tensors of any layout,
and validate=False that never reads or writes outside a tensor (an out-of-bounds read on the GPU is
an illegal memory access that kills the CUDA context, so these also run on the H200)."""
import pytest
import torch

from rlk_triton import configs
from rlk_triton._runtime import arch_of
from rlk_triton.attention import attention, attention_decode, attention_partial, merge_attention_partials
from rlk_triton.errors import DTypeError, InputError, ShapeError

Hq, Hkv, D = 4, 2, 16


def _qkv(device, N, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(N, h, D, generator=g).to(device, dtype) for h in (Hq, Hkv, Hkv))


def _cu(device, offsets):
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def _strided(x):
    """The same values as a non-contiguous view (every other element of a twice-longer tensor)."""
    wide = torch.full((x.shape[0], 2, *x.shape[1:]), -7, dtype=x.dtype, device=x.device)
    wide[:, 0] = x
    view = wide[:, 0]
    assert not view.is_contiguous() and torch.equal(view, x)
    return view


def _bn(device, dtype=torch.float32):
    return configs.lookup_decode(arch_of(device), dtype, D).block_n


def _paged(k, v, lens, cu, page, device, n_pages=None):
    """k / v of each sequence written to its own pages (in order), and the block table."""
    per = max(-(-L // page) for L in lens)
    n_pages = n_pages or len(lens) * per
    kc = torch.zeros(n_pages, page, Hkv, D, device=device, dtype=k.dtype)
    vc = torch.zeros_like(kc)
    bt = torch.zeros(len(lens), per, dtype=torch.int32, device=device)
    for b, L in enumerate(lens):
        for i in range(per):
            p = b * per + i
            bt[b, i] = p
            n = max(0, min(page, L - i * page))
            kc[p, :n] = k[cu[b] + i * page:cu[b] + i * page + n]
            vc[p, :n] = v[cu[b] + i * page:cu[b] + i * page + n]
    return kc, vc, bt


# ---- index tensors of any layout ----

def test_non_contiguous_cu_seqlens_reads_the_values(device):
    q, k, v = _qkv(device, 24)
    cu = _cu(device, [0, 7, 24])
    out, lse = attention(q, k, v, cu)
    for validate in (True, False):
        o2, l2 = attention(q, k, v, _strided(cu), validate=validate)
        assert torch.equal(o2, out) and torch.equal(l2, lse)
    bn = configs.lookup_attention("attention_fwd", arch_of(device), q.dtype, D).block_n
    o3, l3, _ = attention_partial(q, k, v, _strided(cu), kv_start=0, kv_end=None)
    assert torch.equal(o3, out) and torch.equal(l3, lse)
    o4, _, st = attention_partial(q, k, v, _strided(cu), kv_start=0, kv_end=bn, validate=False)
    o5, l5, _ = attention_partial(q, k, v, _strided(cu), kv_start=bn, state=st, validate=False)
    assert torch.equal(o5, out) and torch.equal(l5, lse)


def test_non_contiguous_decode_indices_read_the_values(device):
    lens = [9, 21]
    cu = [0, 9, 30]
    q, k, v = _qkv(device, 30, seed=1)
    out, lse = attention(q, k, v, _cu(device, cu))
    bn = _bn(device)
    kc, vc, bt = _paged(k, v, lens, cu, 2 * bn, device)
    sl = _cu(device, lens)
    n = [3, 5]  # the last n tokens of each sequence as a chunk
    idx = torch.cat([torch.arange(cu[b + 1] - m, cu[b + 1]) for b, m in enumerate(n)]).to(device)
    cuq = _cu(device, [0, 3, 8])
    o, l = attention_decode(q[idx], kc, vc, bt, sl, cuq)
    assert torch.equal(o, out[idx]) and torch.equal(l, lse[:, idx])
    wide = torch.full((bt.shape[0], 2 * bt.shape[1]), -1, dtype=bt.dtype, device=device)
    wide[:, ::2] = bt
    bt_view = wide[:, ::2]  # a block table whose rows are not contiguous
    assert bt_view.stride(1) == 2 and torch.equal(bt_view, bt)
    for validate in (True, False):
        o2, l2 = attention_decode(q[idx], kc, vc, bt_view, _strided(sl), _strided(cuq), validate=validate)
        assert torch.equal(o2, o) and torch.equal(l2, l)


# ---- validate=False stays inside every tensor ----

def test_offsets_past_the_tokens_are_clamped_not_read(device):
    """cu_seqlens [0, 20, 64] for N = 48: each sequence is clamped into [0, N)."""
    q, k, v = _qkv(device, 48, seed=2)
    out, lse = attention(q, k, v, _cu(device, [0, 20, 64]), max_seqlen=44, validate=False)
    ref_o, ref_l = attention(q, k, v, _cu(device, [0, 20, 48]))
    assert torch.equal(out, ref_o) and torch.equal(lse, ref_l)
    # decreasing offsets: overlapping sequences (undefined values), every read inside q / k / v
    out, lse = attention(q, k, v, _cu(device, [0, 30, 10, 48]), max_seqlen=30, validate=False)
    assert bool(out.isfinite().all()) and bool(lse.isfinite().all())
    # a negative first offset starts at token 0
    out, lse = attention(q, k, v, _cu(device, [-5, 48]), max_seqlen=48, validate=False)
    ref_o, ref_l = attention(q, k, v)
    assert torch.equal(out, ref_o) and torch.equal(lse, ref_l)


def test_short_max_seqlen_costs_time_not_rows(device):
    """max_seqlen only sizes the grid: programs stride over the blocks it leaves out, values and
    gradients are the full result's bits."""
    q, k, v = _qkv(device, 40, seed=3)
    cu = _cu(device, [0, 33, 40])
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_o, ref_l = attention(*ref, cu)
    (ref_o.float().square().sum() + ref_l.sum()).backward()
    with pytest.raises(InputError) as e:
        attention(q, k, v, cu, max_seqlen=5)
    assert e.value.argument == "max_seqlen"
    for short in (1, 5, 0):
        got = [t.clone().requires_grad_() for t in (q, k, v)]
        o, l = attention(*got, cu, max_seqlen=short, validate=False)
        assert torch.equal(o, ref_o) and torch.equal(l, ref_l), short
        (o.float().square().sum() + l.sum()).backward()
        for a, b in zip(got, ref):
            assert torch.equal(a.grad, b.grad), short


def test_decode_lengths_and_pages_past_the_cache_are_clamped(device):
    lens = [9, 21]
    cu = [0, 9, 30]
    q, k, v = _qkv(device, 30, seed=4)
    bn = _bn(device)
    page = 2 * bn
    kc, vc, bt = _paged(k, v, lens, cu, page, device)
    cap = bt.shape[1] * page
    qn = q[[8, 29]]
    # a length past the block table's capacity reads as the capacity
    o, l = attention_decode(qn, kc, vc, bt, _cu(device, [9, cap + 1000]), validate=False)
    ref_o, ref_l = attention_decode(qn, kc, vc, bt, _cu(device, [9, cap]))
    assert torch.equal(o, ref_o) and torch.equal(l, ref_l)
    with pytest.raises(InputError) as e:
        attention_decode(qn, kc, vc, bt, _cu(device, [9, cap + 1]))
    assert e.value.argument == "cache_seqlens"
    # page ids past the cache / negative read the last / first page
    bad = bt.clone()
    bad[1, 0] = 10**6
    bad[0, 0] = -3
    fixed = bt.clone()
    fixed[1, 0] = kc.shape[0] - 1
    fixed[0, 0] = 0
    o, l = attention_decode(qn, kc, vc, bad, _cu(device, lens), validate=False)
    ref_o, ref_l = attention_decode(qn, kc, vc, fixed, _cu(device, lens))
    assert torch.equal(o, ref_o) and torch.equal(l, ref_l)
    with pytest.raises(InputError) as e:
        attention_decode(qn, kc, vc, bad, _cu(device, lens))
    assert e.value.argument == "block_table"
    # new-token offsets past q: clamped, and a short max_seqlen_q still covers every row
    q2 = q[[6, 7, 8, 27, 28, 29]]
    ref_o, ref_l = attention_decode(q2, kc, vc, bt, _cu(device, lens), _cu(device, [0, 3, 6]))
    o, l = attention_decode(q2, kc, vc, bt, _cu(device, lens), _cu(device, [0, 3, 6]), max_seqlen_q=1,
                            validate=False)
    assert torch.equal(o, ref_o) and torch.equal(l, ref_l)
    o, l = attention_decode(q2, kc, vc, bt, _cu(device, lens), _cu(device, [0, 3, 600]), max_seqlen_q=3,
                            validate=False)
    assert torch.equal(o, ref_o) and torch.equal(l, ref_l)
    # validation names each broken promise: a chunk longer than its sequence's cache, one page id past
    # the cache (the only bad one)
    with pytest.raises(InputError) as e:
        attention_decode(q2, kc, vc, bt, _cu(device, [2, 21]), _cu(device, [0, 3, 6]))
    assert e.value.argument == "cache_seqlens"
    past = bt.clone()
    past[1, -1] = kc.shape[0]
    with pytest.raises(InputError) as e:
        attention_decode(qn, kc, vc, past, _cu(device, lens))
    assert e.value.argument == "block_table"
    # an empty cache: nothing to read, every row sees no key
    empty = kc[:0]
    o, l = attention_decode(qn, empty, empty, bt, _cu(device, lens), validate=False)
    assert bool((l == float("-inf")).all()) and bool((o == 0).all())


def test_nan_stays_in_its_sequence(device):
    """A NaN in one sequence's keys never reaches another sequence's rows (values and gradients)."""
    q, k, v = _qkv(device, 30, seed=5)
    cu = _cu(device, [0, 9, 20, 30])
    clean = [t.clone().requires_grad_() for t in (q, k, v)]
    o, l = attention(*clean, cu)
    o.float().sum().backward()
    k_bad = k.clone()
    k_bad[12, 1, 3] = float("nan")
    dirty = [t.clone().requires_grad_() for t in (q, k_bad, v)]
    o2, l2 = attention(*dirty, cu)
    o2.float().sum().backward()
    others = torch.cat([torch.arange(0, 9), torch.arange(20, 30)]).to(device)
    assert torch.equal(o2[others], o[others]) and torch.equal(l2[:, others], l[:, others])
    for a, b in zip(dirty, clean):
        assert torch.equal(a.grad[others], b.grad[others])
    assert bool(o2[12:20].isnan().any())


# ---- typed errors that name the argument ----

def _err(fn, cls, argument):
    with pytest.raises(cls) as e:
        fn()
    assert e.value.argument == argument, str(e.value)


def test_attention_scalars_are_typed(device):
    q, k, v = _qkv(device, 8)
    _err(lambda: attention(q, k, v, scale="abc"), InputError, "scale")
    _err(lambda: attention(q, k, v, scale=[1.0]), InputError, "scale")
    _err(lambda: attention(q, k, v, max_seqlen=2.5), InputError, "max_seqlen")
    _err(lambda: attention(q, k, v, cu_seqlens=[0, 8]), DTypeError, "cu_seqlens")


@pytest.mark.parametrize("kv_start", (None, 16.5, True, -16, "0"))
def test_attention_partial_kv_start_is_an_int(kv_start, device):
    q, k, v = _qkv(device, 8)
    _err(lambda: attention_partial(q, k, v, kv_start=kv_start), InputError, "kv_start")


def test_attention_partial_kv_end_and_state(device):
    q, k, v = _qkv(device, 8)
    bn = configs.lookup_attention("attention_fwd", arch_of(device), q.dtype, D).block_n
    _err(lambda: attention_partial(q, k, v, kv_start=bn, kv_end=bn - 1), InputError, "kv_end")
    _err(lambda: attention_partial(q, k, v, kv_end=3.0), InputError, "kv_end")
    _, _, st = attention_partial(q, k, v, kv_end=bn)
    _err(lambda: attention_partial(q, k, v, kv_start=bn, state=st[:2]), ShapeError, "state")
    _err(lambda: attention_partial(q, k, v, kv_start=bn, state=st[2]), ShapeError, "state")
    _err(lambda: attention_partial(q, k, v, kv_start=bn, state=(st[0], st[1], st[2].half())), ShapeError, "state[2]")
    _err(lambda: attention_partial(q, k, v, kv_start=bn, state=(st[0].t(), st[1], st[2])), ShapeError, "state[0]")


def test_merge_partials_errors_name_the_argument(device):
    q, k, v = _qkv(device, 8)
    bn = configs.lookup_attention("attention_fwd", arch_of(device), q.dtype, D).block_n
    a = attention_partial(q, k, v, kv_end=bn)[:2]
    b = attention_partial(q, k, v, kv_start=bn)[:2]
    ref = merge_attention_partials([a[0], b[0]], [a[1], b[1]])
    got = merge_attention_partials((o for o in (a[0], b[0])), (s for s in (a[1], b[1])))  # any iterable
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    _err(lambda: merge_attention_partials([a[0], b[0]], None), DTypeError, "lses")
    _err(lambda: merge_attention_partials(None, [a[1]]), DTypeError, "outs")
    _err(lambda: merge_attention_partials(a[0], [a[1]]), DTypeError, "outs")
    _err(lambda: merge_attention_partials([a[0], b[0]], [a[1]]), ShapeError, "lses")
    _err(lambda: merge_attention_partials([], []), ShapeError, "outs")
    _err(lambda: merge_attention_partials([a[0], b[0][:4]], [a[1], b[1][:, :4]]), ShapeError, "outs[1]")
    _err(lambda: merge_attention_partials([a[0], b[0]], [a[1], b[1].double()]), DTypeError, "lses[1]")
    _err(lambda: merge_attention_partials([a[0], "x"], [a[1], b[1]]), DTypeError, "outs[1]")
    for bad in (float("inf"), float("nan")):
        lse = b[1].clone()
        lse[1, 3] = bad
        _err(lambda: merge_attention_partials([a[0], b[0]], [a[1], lse]), InputError, "lses[1]")
        o, l = merge_attention_partials([a[0], b[0]], [a[1], lse], validate=False)  # documented: NaN rows
        assert bool(l[1, 3].isnan()) and bool(o[3, 1].isnan().all())
        keep = torch.ones_like(l, dtype=torch.bool)
        keep[1, 3] = False
        assert torch.equal(l[keep], ref[1][keep])
