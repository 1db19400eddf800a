"""linear_logp(saved="logits"): the forward keeps z - tile max for the backward instead of the
backward recomputing the logits. logp and entropy are the recompute path's bits; the gradients are
judged by the same contract with the saved dtype's rounding in the sensitivity (linear_parity; the
parity tests of both policies are in test_linear_logp.py); batch invariance, determinism and the
descriptor path hold as for the default."""
import pytest
import torch

from rlk_triton import configs
from rlk_triton._runtime import arch_of
from rlk_triton.errors import InputError, ShapeError
from rlk_triton.logp import linear_logp
from rlk_triton.ops import linear_logp as op
from rlk_triton.testing import check_batch_invariance
from rlk_triton.testing.linear_parity import LinearCase, build_linear_case, linear_logp_row_op
from test_linear_logp import _with_descriptor_path  # the locked rows' persistent_tma, d weight's matmul row too

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _chunk(device, dtype):
    """The backward's vocab chunk (configs chunk_v) on this device."""
    return configs.lookup_matmul("linear_logp_dlogits", arch_of(torch.device(device)), dtype).chunk_v


def _fwd_bwd(hidden, weight, bias, targets, saved, T=0.9, saved_vocab=None):
    g = torch.linspace(-1, 1, hidden.shape[0], device=hidden.device)
    leaves = [x.detach().clone().requires_grad_() if x is not None else None for x in (hidden, weight, bias)]
    logp, ent = linear_logp(leaves[0], leaves[1], targets, bias=leaves[2], temperature=T, return_entropy=True,
                            saved=saved, saved_vocab=saved_vocab)
    ((logp * g).sum() + (ent * g.flip(0)).sum()).backward()
    return logp.detach(), ent.detach(), [x.grad for x in leaves if x is not None]


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_bits_do_not_depend_on_saved(device, dtype):
    """A rollout (no backward, saved="recompute") and a training step (saved="logits") get the same logp."""
    case = LinearCase(37, 48, 300, dtype, bias=True, seed=11)
    hidden, weight, bias, targets = build_linear_case(case, device)
    a, b = (_fwd_bwd(hidden, weight, bias, targets, s) for s in ("recompute", "logits"))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_batch_invariance_of_values_and_d_hidden(device, dtype):
    chunk = _chunk(device, dtype)
    V = 2 * chunk + 37 if device == "cpu" else 4099
    report = check_batch_invariance(linear_logp_row_op(48 if device == "cpu" else 256, V, dtype, device,
                                                       saved="logits"),
                                    batch_sizes=(5, 21) if device == "cpu" else (5, 300))
    assert report.passed, report.failures()[:5]


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_gradients_bitwise_on_repeat(device, dtype):
    hidden, weight, bias, targets = build_linear_case(LinearCase(23, 40, 300, dtype, bias=True, seed=3), device)
    a, b = (_fwd_bwd(hidden, weight, bias, targets, "logits") for _ in range(2))
    for x, y in zip(a[2], b[2]):
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_descriptor_path_gives_the_pointer_path_bits(device, dtype, monkeypatch):
    """saved="logits" on the descriptor kernels (d weight's A^T included: 16-byte d logits rows)."""
    n, h, v = (37, 48, 304) if device == "cpu" else (300, 520, 9000)
    hidden, weight, bias, targets = build_linear_case(LinearCase(n, h, v, dtype, bias=True, seed=5), device)
    runs = []
    for flag in (False, True):
        _with_descriptor_path(monkeypatch, device, dtype, flag)
        runs.append(_fwd_bwd(hidden, weight, bias, targets, "logits"))
    (lp0, e0, g0), (lp1, e1, g1) = runs
    assert torch.equal(lp0, lp1) and torch.equal(e0, e1)
    assert all(torch.equal(x, y) for x, y in zip(g0, g1))


@pytest.mark.parametrize("dtype,kept", [(torch.bfloat16, torch.float16), (torch.float16, torch.float16),
                                        (torch.float32, torch.float32)])
def test_what_the_forward_keeps(device, dtype, kept):
    """saved="logits": N x V of the saved dtype (2 bytes for 16-bit inputs) and the tiles' row maxima;
    "recompute": nothing of that size. The saved values are z - tile max: <= 0, 0 at each tile's max."""
    N, H, V = 9, 32, 200
    hidden, weight, bias, targets = build_linear_case(LinearCase(N, H, V, dtype, bias=True, seed=1), device)
    out = op.linear_logp_fwd(hidden, weight, bias, targets, 1.0, -100, False, V)
    saved, tile_max = out[4], out[5]
    tiles = -(-V // op.tile_config("linear_logp_fwd", hidden).block_n)
    assert saved.shape == (N, V) and saved.dtype == kept and tile_max.shape == (tiles, N)
    assert (saved <= 0).all()
    bn = op.tile_config("linear_logp_fwd", hidden).block_n
    for t in range(tiles):
        assert (saved[:, t * bn:(t + 1) * bn].amax(1) == 0).all()
    none = op.linear_logp_fwd(hidden, weight, bias, targets, 1.0, -100, False, 0)
    assert none[4].numel() == 0 and none[5].numel() == 0


def test_nothing_is_kept_without_a_backward(device, monkeypatch):
    """Under no_grad, or with no input that needs a gradient, saved="logits" writes no buffer."""
    seen = []
    real = op.tile_stats
    monkeypatch.setattr(op, "tile_stats", lambda *a: seen.append(a[-1] is not None) or real(*a))
    hidden, weight, _, targets = build_linear_case(LinearCase(5, 32, 150, torch.float32, seed=6), device)
    with torch.no_grad():
        linear_logp(hidden.requires_grad_(), weight, targets, saved="logits")
    linear_logp(hidden.detach(), weight, targets, saved="logits")
    linear_logp(hidden.detach().requires_grad_(), weight, targets, saved="logits")
    assert seen == [False, False, True]


def test_ignored_rows_have_no_logp_gradient(device):
    hidden, weight, _, targets = build_linear_case(LinearCase(6, 32, 150, torch.float32, seed=2), device)
    targets[:] = -100
    h = hidden.clone().requires_grad_()
    linear_logp(h, weight, targets, saved="logits").sum().backward()
    assert torch.equal(h.grad, torch.zeros_like(h.grad))


def test_bad_saved_is_a_typed_error(device):
    hidden, weight, _, targets = build_linear_case(LinearCase(4, 32, 150, torch.float32), device)
    with pytest.raises(InputError, match="saved"):
        linear_logp(hidden, weight, targets, saved="everything")
    with pytest.raises(InputError, match="saved"):  # before any collective: no process group is touched
        linear_logp(hidden, weight, targets, saved="everything", tp_group=object(), global_vocab_size=150)


def test_configs_keep_the_saved_path_aligned():
    """The saved backward reads one forward tile per block: the dlogits tiles equal the forward's and
    chunk_v is a multiple of block_n on every arch and dtype (the launcher refuses otherwise)."""
    for (kernel, arch, dt, bucket), cfg in configs.LOCKED_CONFIGS.items():
        if kernel == "linear_logp_dlogits":
            fwd = configs.LOCKED_CONFIGS[("linear_logp_fwd", arch, dt, bucket)]
            assert (fwd.block_m, fwd.block_n) == (cfg.block_m, cfg.block_n) and cfg.chunk_v % cfg.block_n == 0


@pytest.mark.parametrize("kept_chunks", (None, 1))
def test_under_torch_compile(device, kept_chunks):
    hidden, weight, bias, targets = build_linear_case(LinearCase(9, 32, 200, torch.float32, bias=True, seed=8), device)
    saved_vocab = None if kept_chunks is None else kept_chunks * _chunk(device, torch.float32)

    def f(h, w, b, t):
        lp, ent = linear_logp(h, w, t, bias=b, temperature=0.8, return_entropy=True, validate=False, saved="logits",
                              saved_vocab=saved_vocab)
        return (lp + 0.1 * ent).sum()

    backend = "inductor" if device == "cuda" else "aot_eager"
    leaves = [x.clone().requires_grad_() for x in (hidden, weight, bias)]
    f(*leaves, targets).backward()
    eager = [x.grad.clone() for x in leaves]
    leaves = [x.clone().requires_grad_() for x in (hidden, weight, bias)]
    torch.compile(f, backend=backend, fullgraph=True)(*leaves, targets).backward()
    assert all(torch.equal(a, x.grad) for a, x in zip(eager, leaves))


@pytest.mark.gpu
def test_backward_memory_is_the_buffer_and_the_gradients():
    """Peak extra memory of a saved="logits" forward + backward: the [N, V] buffer, one d-logits pass,
    the gradients, d hidden's fp32 accumulator and the tile statistics. Not a second [N, V]: autograd
    must not materialize a zero gradient for the buffer output (it did, 2.3 GiB at 8192 x 151936)."""
    from rlk_triton.bench.timing import peak_extra_mib

    N, H, V = 2048, 512, 32768
    hidden, weight, _, targets = build_linear_case(LinearCase(N, H, V, torch.bfloat16, seed=9), "cuda")
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    up = torch.randn(N, device="cuda")
    fwd, dl = op.tile_config("linear_logp_fwd", h), op.tile_config("linear_logp_dlogits", h)
    tiles = -(-V // fwd.block_n)
    expect = (N * V * 2 + N * min(dl.chunk_v * op.pass_chunks(dl, N, 2), V) * 2 + V * H * 2 + N * H * (2 + 4)
              + (op.N_STATS + 1) * tiles * N * 4 + 8 * N * 4)
    step = lambda: torch.autograd.grad(linear_logp(h, w, targets, saved="logits"), (h, w), up)  # noqa: E731
    step()
    peak = peak_extra_mib(step, "cuda") * 2**20
    assert peak <= expect + 4 * 2**20, (peak / 2**20, expect / 2**20)


# ---- saved_vocab: the logits of the vocab's first columns only ----

@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_kept_columns_give_the_logits_bits_and_the_rest_the_recompute_bits(device, dtype):
    """d logits are elementwise in a column: with saved_vocab the kept columns' d weight / d bias rows
    are saved="logits"'s and the other columns' are "recompute"'s; logp and entropy are everyone's.
    saved_vocab=0 gives "recompute"'s gradients and saved_vocab >= V "logits"'s."""
    n, h = (37, 48) if device == "cpu" else (300, 520)
    C = _chunk(device, dtype)
    V = 2 * C + 44  # two whole chunks and a partial one
    hidden, weight, bias, targets = build_linear_case(LinearCase(n, h, V, dtype, bias=True, seed=13), device)
    rec, full = (_fwd_bwd(hidden, weight, bias, targets, s) for s in ("recompute", "logits"))
    # the two policies' gradients differ in every region, else the comparisons below prove nothing
    for lo, hi in ((0, C), (C, 2 * C), (2 * C, V)):
        assert not torch.equal(rec[2][1][lo:hi], full[2][1][lo:hi]), (lo, hi)
    for saved_vocab, kept in ((C + C // 2, C), (2 * C, 2 * C), (V - 1, 2 * C)):
        lp, ent, (dh, dw, db) = _fwd_bwd(hidden, weight, bias, targets, "logits", saved_vocab=saved_vocab)
        assert torch.equal(lp, rec[0]) and torch.equal(ent, rec[1])
        assert torch.equal(dw[:kept], full[2][1][:kept]) and torch.equal(dw[kept:], rec[2][1][kept:]), saved_vocab
        assert torch.equal(db[:kept], full[2][2][:kept]) and torch.equal(db[kept:], rec[2][2][kept:]), saved_vocab
    for saved_vocab, same in ((0, rec), (V, full), (10 * V, full)):
        got = _fwd_bwd(hidden, weight, bias, targets, "logits", saved_vocab=saved_vocab)
        assert all(torch.equal(x, y) for x, y in zip(got[2], same[2])), saved_vocab


def test_kept_columns_are_whole_chunks_fixed_by_the_vocab():
    cfg = configs.lookup_matmul("linear_logp_dlogits", "sm90", torch.bfloat16)
    C, V = cfg.chunk_v, 151936
    assert op.kept_columns(cfg, V, 0, V, None) == V
    assert op.kept_columns(cfg, V, 0, V, V + 5) == V
    assert op.kept_columns(cfg, V, 0, V, 3 * C + 7) == 3 * C
    assert op.kept_columns(cfg, V, 0, V, C - 1) == 0
    # a shard keeps its part of the global columns: [0, 3C) over shards starting at 0, 2C and 4C
    assert [op.kept_columns(cfg, 2 * C, s, V, 3 * C + 7) for s in (0, 2 * C, 4 * C)] == [2 * C, C, 0]


def test_what_a_partial_forward_keeps(device):
    C = _chunk(device, torch.bfloat16)
    V = 2 * C + 44  # the first chunk kept, of a vocab longer than it on every device
    hidden, weight, bias, targets = build_linear_case(LinearCase(9, 32, V, torch.bfloat16, bias=True, seed=1),
                                                      device)
    bn = op.tile_config("linear_logp_fwd", hidden).block_n
    full = op.linear_logp_fwd(hidden, weight, bias, targets, 1.0, -100, False, V)
    part = op.linear_logp_fwd(hidden, weight, bias, targets, 1.0, -100, False, C)
    assert part[4].shape == (9, C) and part[5].shape == (C // bn, 9)
    assert torch.equal(part[4], full[4][:, :C]) and torch.equal(part[5], full[5][:C // bn])
    assert all(torch.equal(a, b) for a, b in zip(part[:4], full[:4]))
    with pytest.raises(ShapeError, match="save_cols"):  # more columns than the vocab: refused, not left unwritten
        op.linear_logp_fwd(hidden, weight, bias, targets, 1.0, -100, False, V + 1)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_partial_keep_is_within_contract_and_batch_invariant(device, dtype):
    from rlk_triton.testing.linear_parity import judge_linear_logp

    C = _chunk(device, dtype)
    V = 2 * C + 37 if device == "cpu" else 4099
    ratios = judge_linear_logp(LinearCase(19, 48, V, dtype, 0.8, 3.0, True, seed=5, saved="logits", saved_vocab=C),
                               device)
    assert max(ratios.values()) <= 1.0, ratios
    report = check_batch_invariance(linear_logp_row_op(48 if device == "cpu" else 256, V, dtype, device,
                                                       saved="logits", saved_vocab=C),
                                    batch_sizes=(5, 21) if device == "cpu" else (5, 300))
    assert report.passed, report.failures()[:5]


def test_bad_saved_vocab_is_a_typed_error(device):
    hidden, weight, _, targets = build_linear_case(LinearCase(4, 32, 150, torch.float32), device)
    for bad in (-1, 2.0, True, "all"):
        with pytest.raises(InputError, match="saved_vocab"):
            linear_logp(hidden, weight, targets, saved="logits", saved_vocab=bad)
    with pytest.raises(InputError, match="saved_vocab"):  # nothing to keep under "recompute"
        linear_logp(hidden, weight, targets, saved_vocab=128)
