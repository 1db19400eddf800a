"""selected_logp's forward vocab split: chunks of a width fixed by V, their states merged in order.

V is derived from the locked table of the device under test, so the same cases cover several chunks,
a chunk of several tiles, a partial last chunk and a tail tile on the interpreter and on the GPU.
"""
import pytest
import torch
import triton
import triton.language as tl

from rlk_triton import configs, contracts
from rlk_triton._runtime import arch_of
from rlk_triton.logp import selected_logp, selected_logp_indexed
from rlk_triton.ops import selected_logp as op
from rlk_triton.ops.reduction import merge_all_softmax_states
from rlk_triton.testing import assert_batch_invariant
from rlk_triton.testing.parity import LogpCase, judge_selected_logp, make_logits, row_scale, selected_logp_row_op

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _widths(device, dtype, V=1 << 20):
    """(forward tile, chunk) of the V > 8192 bucket on the device under test."""
    arch = arch_of(torch.device(device))
    return (configs.lookup("selected_logp_fwd", arch, dtype, V).block_v,
            configs.lookup("selected_logp_chunk", arch, dtype, V).block_v)


def split_V(device, dtype):
    """Two full chunks, then a last chunk of one full tile and a partial tail tile."""
    block, chunk = _widths(device, dtype)
    V = 2 * chunk + block + block // 2 + 3
    assert op.chunk_count(V, chunk) == 3 and V % chunk > block and V % block
    return V


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T,layout", ((1.0, "contiguous"), (0.7, "row_stride"), ("rows", "slice3d")))
def test_split_rows_within_contract(dtype, T, layout, device):
    """Values, entropy and gradient against float64, judged by contracts/selected_logp.yaml."""
    case = LogpCase(4, split_V(device, dtype), dtype, T, 3.0, layout, seed=17)
    ratios = judge_selected_logp(case, device)
    assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: error / contract bound {ratios}"


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_many_chunks_and_padded_merge_lanes(dtype, device):
    """18 chunks: the one-step merge runs over 32 lanes, 14 of them empty states."""
    _, chunk = _widths(device, dtype)
    V = 17 * chunk + 100
    case = LogpCase(2, V, dtype, "rows", 3.0, "contiguous", seed=5)
    ratios = judge_selected_logp(case, device, with_grad=False)
    assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: {ratios}"
    x = make_logits(2, V, dtype, 3.0, torch.Generator().manual_seed(6), device)
    t = torch.tensor([3, V - 1], device=device)
    temps = torch.tensor([0.8, 1.3], device=device)
    both = selected_logp(x, t, temperature=temps, return_entropy=True)
    alone = selected_logp(x[1:], t[1:], temperature=temps[1:], return_entropy=True)
    assert torch.equal(both[0][1:], alone[0]) and torch.equal(both[1][1:], alone[1])


def test_rows_empty_in_whole_chunks(device):
    """Chunks of only -inf give empty states: merged, they change nothing; results stay finite."""
    dtype = torch.bfloat16
    V = split_V(device, dtype)
    _, chunk = _widths(device, dtype)
    x = (torch.randn(4, V) * 3)
    x[0] = float("-inf")
    x[0, chunk + 5] = 1.0  # finite in the middle chunk only
    x[1, :-1] = float("-inf")  # finite in the tail tile only
    x[2, ::2], x[2, 1::2] = 1e4, -1e4
    x[3, chunk:] = float("-inf")  # finite in the first chunk only
    x = x.to(device=device, dtype=dtype)
    targets = torch.tensor([chunk + 5, V - 1, 0, 7], device=device)
    logp, ent = selected_logp(x, targets, return_entropy=True)
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()
    assert logp[0] == 0.0 and logp[1] == 0.0 and ent[0] == 0.0 and ent[1] == 0.0

    from rlk_triton.reference import selected_logp_reference
    ref_lp, ref_ent = selected_logp_reference(x.double().cpu().numpy(), targets.cpu().numpy())
    bound = contracts.judgment("selected_logp", dtype, "forward_accuracy", arch_of(x.device))["outputs"]
    scale = row_scale(x.double().cpu().numpy(), 1.0)
    assert contracts.scaled_abs_ratio(logp.cpu(), ref_lp, scale, bound["logp"]) <= 1.0
    assert contracts.scaled_abs_ratio(ent.cpu(), ref_ent, scale, bound["entropy"]) <= 1.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_row_alone_in_a_batch_and_indexed_are_bitwise_equal(dtype, device):
    """One row's logp / entropy with per-row temperatures: alone, at positions on both sides of a
    merge block (MERGE_ROWS), through selected_logp_indexed in any order of the scored rows."""
    V = split_V(device, dtype)
    n = op.MERGE_ROWS + 5
    gen = torch.Generator().manual_seed(3)
    x = make_logits(n, V, dtype, 3.0, gen, device)
    t = torch.randint(0, V, (n,), generator=gen).to(device)
    temps = (0.5 + torch.rand(n, generator=gen)).to(device)
    batch = selected_logp(x, t, temperature=temps, return_entropy=True)
    for r in (0, op.MERGE_ROWS - 1, op.MERGE_ROWS + 2):
        alone = selected_logp(x[r:r + 1], t[r:r + 1], temperature=temps[r:r + 1], return_entropy=True)
        rows = torch.tensor([r, 1, n - 1] if r != 1 else [r, 0], device=device)
        picked = selected_logp_indexed(x, t[rows], rows, temperature=temps[rows], return_entropy=True)
        for k in range(2):
            assert torch.equal(batch[k][r:r + 1], alone[k]), (r, k)
            assert torch.equal(batch[k][r], picked[k][0]), (r, k)


@pytest.mark.parametrize("dtype,temperature", ((torch.bfloat16, "rows"), (torch.float32, 0.7)), ids=str)
def test_split_batch_invariant_with_gradients(dtype, temperature, device):
    """The shared harness: values and d logits over batch size, position, padding, neighbours,
    dense vs indexed (merge blocks are crossed in test_row_alone_in_a_batch_and_indexed_...)."""
    op_rows = selected_logp_row_op(split_V(device, dtype), dtype, device, temperature)
    assert_batch_invariant(op_rows, probe_rows=2, batch_sizes=(3, 8))


# ---- bookkeeping: where the chunk width comes from, and what it never depends on ----

class _LaunchSpy:
    """Stands in for a @triton.jit kernel: records each launch's grid and constexprs, then runs it."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((tuple(grid), kwargs))
            return self.kernel[grid](*args, **kwargs)
        return launch


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chunk_width_comes_from_the_table_and_not_the_row_count(dtype, device, monkeypatch):
    fwd, merge = _LaunchSpy(op._fwd_kernel), _LaunchSpy(op._fwd_merge_kernel)
    monkeypatch.setattr(op, "_fwd_kernel", fwd)
    monkeypatch.setattr(op, "_fwd_merge_kernel", merge)
    arch = arch_of(torch.device(device))
    V = split_V(device, dtype)
    chunk = configs.lookup("selected_logp_chunk", arch, dtype, V).block_v
    x = make_logits(op.MERGE_ROWS + 1, V, dtype, 3.0, torch.Generator().manual_seed(1), device)
    t = torch.zeros(op.MERGE_ROWS + 1, dtype=torch.long, device=device)
    for n in (1, op.MERGE_ROWS + 1):
        selected_logp(x[:n], t[:n])
    assert [(g, kw["CHUNK_V"], kw["FINISH"]) for g, kw in fwd.launches] == \
        [((1, 3), chunk, False), ((op.MERGE_ROWS + 1, 3), chunk, False)]
    assert [g for g, _ in merge.launches] == [(1,), (2,)]

    # The table, not a constant: another locked width changes the split (and only the split).
    key = ("selected_logp_chunk", configs.table_arch(arch, "selected_logp_chunk"),
           contracts.dtype_name(dtype), configs.v_bucket(V))
    monkeypatch.setitem(configs.LOCKED_CONFIGS, key, configs.LaunchConfig(2 * chunk, 1, 1))
    selected_logp(x[:1], t[:1])
    assert fwd.launches[-1][0] == (1, 2) and fwd.launches[-1][1]["CHUNK_V"] == 2 * chunk

    # A row of at most one chunk: one program per row finishes it, no merge launch.
    fwd.launches.clear()
    merge.launches.clear()
    selected_logp(x[:3, :chunk // 2], t[:3])
    assert [(g, kw["FINISH"]) for g, kw in fwd.launches] == [((3, 1), True)] and not merge.launches


def test_chunk_rows_are_whole_tiles_on_every_arch():
    for arch in ("interpreter", "sm90", "sm80", "sm100"):
        for dt in DTYPES:
            for V in (1, 1024, 1025, 8192, 8193, 151936, 262144):
                chunk = configs.lookup("selected_logp_chunk", arch, dt, V).block_v
                assert chunk % configs.lookup("selected_logp_fwd", arch, dt, V).block_v == 0
                # a row up to the bucket's bound is one chunk: the split starts past V = 8192
                if V <= 8192:
                    assert op.chunk_count(V, chunk) == 1


# ---- the identities the split relies on ----

@triton.jit
def _merge_with_empty_lanes_kernel(m_ptr, s_ptr, t_ptr, out_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    lane = tl.arange(0, 4)[None, :]
    first = lane == 0  # lane 0 holds the state, lanes 1-3 the empty state (a padded merge tile)
    m_c = tl.where(first, tl.load(m_ptr + i)[:, None], float("-inf"))
    s_c = tl.where(first, tl.load(s_ptr + i)[:, None], 0.0)
    t_c = tl.where(first, tl.load(t_ptr + i)[:, None], 0.0)
    m, s, t = merge_all_softmax_states(m_c, s_c, t_c, True)
    tl.store(out_ptr + i, m)  # (a loop over a tuple does not compile for the GPU)
    tl.store(out_ptr + BLOCK + i, s)
    tl.store(out_ptr + 2 * BLOCK + i, t)


def test_merging_with_the_empty_state_is_exact(device):
    """A state merged with empty states (the merge tile's padded lanes) comes back bitwise: beta = 1
    for it and 0 for them, and zero terms leave a sum as it is."""
    gen = torch.Generator().manual_seed(2)
    n = 64
    m = torch.randn(n, generator=gen) * 1e3
    m[:4] = torch.tensor([0.0, 1e4, -1e4, float("-inf")])
    s = 1.0 + torch.rand(n, generator=gen) * 1e5
    t = -torch.rand(n, generator=gen) * 1e5
    s[3], t[3] = 0.0, 0.0  # an empty chunk (all -inf) is the empty state
    out = torch.empty(3 * n, device=device)
    _merge_with_empty_lanes_kernel[(1,)](m.to(device), s.to(device), t.to(device), out, BLOCK=n)
    out = out.view(3, n).cpu()
    for k, ref in enumerate((m, s, t)):
        assert torch.equal(out[k], ref), k
