"""Rows at every offset of a tile: the tl.dot kernels give a row the same bits wherever it sits.

The other invariance axes place the probe rows at a few positions; whether those land on offsets
where a tile's arithmetic differs is luck (under the interpreter tl.dot was one np.matmul, whose
BLAS gave a row other bits at 10 of 15 offsets of a tile on one CPU and at none on another). Here
the two probe rows step through a tile together, so every offset 0..BLOCK_M-1 holds one of them in
one run, and the last run straddles the boundary into the next tile (rlk_triton.testing.invariance
tile_offsets), for values and row gradients, in every dtype: `torch.equal` or fail.
"""
import pytest
import torch

from rlk_triton import configs
from rlk_triton._runtime import arch_of
from rlk_triton.testing import check_batch_invariance
from rlk_triton.testing.invariance import tile_offsets
from rlk_triton.testing.linear_parity import linear_logp_row_op
from rlk_triton.testing.matmul_parity import matmul_row_op

from test_layer_chain import _chain_op

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _tile_rows(device, *kernels):
    """The largest row tile of the kernels an op runs (the others divide it: offsets cover them too)."""
    arch = arch_of(torch.device(device))
    return max(configs.lookup_matmul(k, arch, torch.float32).block_m for k in kernels)


def _assert_every_offset_equal(op, tile_rows):
    report = check_batch_invariance(op, probe_rows=2, batch_sizes=(5,), tile_rows=tile_rows)
    runs = {r.variant for r in report.results if r.axis == "tile_position"}
    offsets = tile_offsets(tile_rows, 2)
    assert len(runs) == len(offsets), "the sweep did not run"
    assert set(range(tile_rows + 1)) <= {o + j for o in offsets for j in (0, 1)}  # each offset, and across
    bad = report.failures()
    assert not bad, [f"{r.axis} / {r.variant} / {r.what}: max |diff| {r.max_abs_diff:.3g}" for r in bad[:8]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_rows_at_every_tile_offset(device, dtype):
    n, k = (70, 50) if device == "cpu" else (4096, 4096)
    _assert_every_offset_equal(matmul_row_op(n, k, dtype, device), _tile_rows(device, "matmul"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_logp_rows_at_every_tile_offset(device, dtype):
    """logp, entropy and d hidden of a token wherever it sits in the forward's, d logits' and
    d hidden's row tiles."""
    H, V = (32, 200) if device == "cpu" else (4096, 151936)
    tile = _tile_rows(device, "linear_logp_fwd", "linear_logp_dlogits", "linear_logp_dhidden")
    _assert_every_offset_equal(linear_logp_row_op(H, V, dtype, device), tile)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_chain_rows_at_every_tile_offset(device, dtype):
    _assert_every_offset_equal(_chain_op(dtype, device), _tile_rows(device, "matmul"))


@pytest.mark.parametrize("tile", (8, 7))
def test_the_sweep_catches_one_odd_offset_anywhere_in_the_tile(tile):
    """An op that computes rows at one offset of a tile differently fails the sweep, wherever that
    offset is (the probe rows' own positions included): the stepped sweep leaves no offset out."""
    from rlk_triton.testing import RowOp

    for odd in range(tile):
        def forward(x, odd=odd):
            at_odd = (torch.arange(x.shape[0]) % tile == odd).to(x.dtype)[:, None]
            return (x * (1 + at_odd),)

        op = RowOp(f"odd offset {odd}", forward, lambda n, gen: (torch.randn(n, 3, generator=gen),),
                   grad_inputs=(0,))
        report = check_batch_invariance(op, probe_rows=2, batch_sizes=(3,), tile_rows=tile)
        assert any(r.axis == "tile_position" and not r.equal for r in report.results), odd
