"""Bitwise batch invariance, for any operator that maps rows to rows.

A row-wise operator takes inputs with a leading row dim and returns outputs with the same leading
row dim. It is batch-invariant when the values and input-gradients of a row do not depend on
anything but that row: checked bitwise (torch.equal) along these axes:

  repeat          the same batch twice
  batch_size      the probe rows alone, and inside batches of several sizes
  row_position    the probe rows at the front, at the back, and scattered
  padding_rows    the probe rows followed by padding rows (op.make_padding)
  neighbours      the same positions with different neighbours
  dense_indexed   op.indexed scoring only the probe rows of a batch (if the op has it)
  tile_position   (with tile_rows=B) the probe rows at every offset 0..B-1 of a B-row tile, the
                  last offset straddling the tile boundary, in a batch of fixed size 2 B: a kernel
                  whose tile arithmetic gives a row bits by its place in the tile fails here at
                  some offset, whatever the other axes' few placements happen to hit

Gradients: every output gets an upstream gradient whose probe rows are the same in every run; the
input gradients of the probe rows must then be equal too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch


@dataclass
class RowOp:
    name: str
    # forward(*inputs) -> tuple of output tensors, each with the leading row dim of the inputs
    forward: Callable[..., Sequence[torch.Tensor]]
    # make_rows(n, generator) -> tuple of n fresh rows of every input, on the op's device
    make_rows: Callable[[int, torch.Generator], tuple]
    # positions of the inputs to differentiate (floating point inputs)
    grad_inputs: tuple = ()
    # indexed(inputs, row_indices) -> outputs for those rows only (or None if the op has no such variant)
    indexed: Optional[Callable[[tuple, torch.Tensor], Sequence[torch.Tensor]]] = None
    # make_padding(n, generator) -> n padding rows; defaults to zeros shaped like make_rows
    make_padding: Optional[Callable[[int, torch.Generator], tuple]] = None


@dataclass
class InvarianceResult:
    axis: str
    variant: str
    what: str  # output k / grad of input k
    equal: bool
    max_abs_diff: float


@dataclass
class InvarianceReport:
    op: str
    results: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.equal for r in self.results)

    def failures(self):
        return [r for r in self.results if not r.equal]


class InvarianceFailure(AssertionError):
    pass


def _cat(parts):
    return tuple(torch.cat([p[i] for p in parts], 0) for i in range(len(parts[0])))


def _take(rows, idx):
    return tuple(r[idx] for r in rows)


def _max_diff(a, b):
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    d = (a.double() - b.double()).abs()
    d = torch.where(torch.isnan(d) & ~(torch.isnan(a.double()) & torch.isnan(b.double())), float("inf"), d)
    return float(torch.nan_to_num(d, nan=0.0).max())


def _run(op: RowOp, inputs, probe_pos, probe_upstream, gen):
    """Outputs and input gradients of the rows at probe_pos, for one batch."""
    inputs = tuple(
        x.detach().clone().requires_grad_(i in op.grad_inputs) if torch.is_tensor(x) else x
        for i, x in enumerate(inputs)
    )
    outs = tuple(op.forward(*inputs))
    picked = [o.detach()[probe_pos] for o in outs]
    grads = []
    if op.grad_inputs:
        total = 0
        for o, up_probe in zip(outs, probe_upstream):
            up = torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.device, o.dtype)
            up[probe_pos] = up_probe
            total = total + (o * up).sum()
        total.backward()
        grads = [inputs[i].grad[probe_pos] for i in op.grad_inputs]
    return picked, grads


def check_batch_invariance(
    op: RowOp,
    *,
    probe_rows: int = 3,
    batch_sizes: Sequence[int] = (5, 17),
    seed: int = 0,
    tile_rows: Optional[int] = None,
) -> InvarianceReport:
    """The probe rows' outputs and input gradients, bitwise, against the same rows alone, along each
    axis: repeat, batch size, row position, padding rows, other neighbours, (op.indexed) the dense and
    indexed calls, and with tile_rows the position inside a row tile (tile_offsets)."""
    gen = torch.Generator().manual_seed(seed)
    report = InvarianceReport(op.name)
    probe = op.make_rows(probe_rows, gen)
    pad = op.make_padding or (lambda n, g: tuple(torch.zeros_like(x[:1]).expand(n, *x.shape[1:]).clone()
                                                for x in op.make_rows(1, g)))
    # Fixed upstream gradients for the probe rows: shaped like each output's probe rows.
    with torch.no_grad():
        probe_outs = [o.detach() for o in op.forward(*probe)]
    probe_upstream = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.device, o.dtype)
                      for o in probe_outs]
    base_pos = torch.arange(probe_rows)
    base_vals, base_grads = _run(op, probe, base_pos, probe_upstream, gen)

    def compare(axis, variant, vals, grads):
        for k, (a, b) in enumerate(zip(base_vals, vals)):
            report.results.append(InvarianceResult(axis, variant, f"output {k}", torch.equal(a, b), _max_diff(a, b)))
        for k, (a, b) in enumerate(zip(base_grads, grads)):
            what = f"grad of input {op.grad_inputs[k]}"
            report.results.append(InvarianceResult(axis, variant, what, torch.equal(a, b), _max_diff(a, b)))

    def embed(n_total, positions, others):
        """A batch of n_total rows with the probe rows at positions and `others` elsewhere."""
        rest = [i for i in range(n_total) if i not in set(positions.tolist())]
        order = torch.empty(n_total, dtype=torch.long)
        order[positions] = torch.arange(probe_rows)
        order[torch.tensor(rest, dtype=torch.long)] = torch.arange(probe_rows, n_total)
        return _take(_cat([probe, others]), order)

    vals, grads = _run(op, probe, base_pos, probe_upstream, gen)
    compare("repeat", "probe rows twice", vals, grads)

    for n in batch_sizes:
        others = op.make_rows(n - probe_rows, gen)
        pos = torch.arange(probe_rows)
        vals, grads = _run(op, embed(n, pos, others), pos, probe_upstream, gen)
        compare("batch_size", f"{n} rows", vals, grads)

    n = max(batch_sizes)
    others = op.make_rows(n - probe_rows, gen)
    placements = {
        "at the back": torch.arange(n - probe_rows, n),
        "scattered": torch.linspace(0, n - 1, probe_rows).round().long(),
    }
    for variant, pos in placements.items():
        vals, grads = _run(op, embed(n, pos, others), pos, probe_upstream, gen)
        compare("row_position", variant, vals, grads)

    padding = pad(n - probe_rows, gen)
    pos = torch.arange(probe_rows)
    vals, grads = _run(op, embed(n, pos, padding), pos, probe_upstream, gen)
    compare("padding_rows", f"{n - probe_rows} padding rows", vals, grads)

    pos = placements["scattered"]
    new_others = op.make_rows(n - probe_rows, gen)
    vals, grads = _run(op, embed(n, pos, new_others), pos, probe_upstream, gen)
    compare("neighbours", "other neighbours", vals, grads)

    if op.indexed is not None:
        batch = tuple(
            x.detach().clone().requires_grad_(i in op.grad_inputs) if torch.is_tensor(x) else x
            for i, x in enumerate(embed(n, pos, others))
        )
        outs = tuple(op.indexed(batch, pos.to(batch[0].device)))
        grads = []
        if op.grad_inputs:
            sum((o * up).sum() for o, up in zip(outs, probe_upstream)).backward()
            grads = [batch[i].grad[pos] for i in op.grad_inputs]
        compare("dense_indexed", "probe rows only", [o.detach() for o in outs], grads)

    if tile_rows:
        n = 2 * tile_rows + probe_rows
        for offset in tile_offsets(tile_rows, probe_rows):
            pos = torch.arange(offset, offset + probe_rows)
            vals, grads = _run(op, embed(n, pos, op.make_rows(n - probe_rows, gen)), pos, probe_upstream, gen)
            compare("tile_position", f"rows {offset}..{offset + probe_rows - 1} of a {tile_rows}-row tile", vals, grads)
    return report


def tile_offsets(tile_rows: int, probe_rows: int) -> list:
    """Where check_batch_invariance's tile sweep puts its first probe row: the probe rows step through
    the tile together, so every offset 0..tile_rows-1 holds a probe row in one run, and the last run
    straddles the boundary into the next tile. A kernel whose row tile divides tile_rows is covered
    too: its offsets are these modulo its tile."""
    offsets = list(range(0, tile_rows, probe_rows))
    if offsets[-1] + probe_rows <= tile_rows:  # the last run ended inside the tile: one more across it
        offsets.append(tile_rows - 1)
    return offsets


def assert_batch_invariant(op: RowOp, **kwargs) -> InvarianceReport:
    report = check_batch_invariance(op, **kwargs)
    if not report.passed:
        lines = [f"{r.axis} / {r.variant} / {r.what}: max |diff| {r.max_abs_diff:.3g}" for r in report.failures()]
        raise InvarianceFailure(f"{op.name} is not batch-invariant:\n  " + "\n  ".join(lines))
    return report
