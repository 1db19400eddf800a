"""asv's view of the suite: two classes per operator family over the same cases as `rlk-triton bench`.

  <Family>       params: case            track_device_ms, track_wall_ms, track_peak_extra_mib
  <Family>Ratio  params: case x baseline kind (cases.BASELINE_KINDS)   track_ratio
A (case, kind) without such a baseline, and every case on a machine without CUDA, is skipped (asv
shows n/a): asv's history is GPU figures. size="tiny" runs them on the interpreter (the tests).
"""
from __future__ import annotations

import torch

from .cases import BASELINE_KINDS, select
from . import timing
from .report import Rates, device_ms


def _camel(op: str) -> str:
    return "".join(part.title() for part in op.split("_"))


def classes(op: str, size: str = "full") -> tuple[type, type]:
    """The (times, ratios) asv classes of family `op`."""
    family = {c.name: c for c in select([op], size)}

    def build(name):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu" and size != "tiny":
            raise NotImplementedError("the benchmarks need a CUDA GPU")
        return device, family[name].build(device, False)

    class Times:
        params = [list(family)]
        param_names = ["case"]
        timeout = 900

        def setup(self, name):
            self.device, self.bound = build(name)

        def track_device_ms(self, name):
            return device_ms(self.bound.rlk, self.device)[0]

        def track_wall_ms(self, name):
            return timing.wall_ms(self.bound.rlk, device=self.device)

        def track_peak_extra_mib(self, name):
            # None without CUDA, which asv shows as n/a
            return timing.peak_extra_mib(self.bound.rlk, self.device)

        track_device_ms.unit = track_wall_ms.unit = "ms"
        track_peak_extra_mib.unit = "MiB"

    class Ratio:
        params = [list(family), list(BASELINE_KINDS)]
        param_names = ["case", "baseline"]
        timeout = 900

        def setup(self, name, kind):
            self.device, self.bound = build(name)
            if kind != "ceiling" and not any(b.kind == kind for b in self.bound.baselines):
                raise NotImplementedError(f"no {kind} baseline for {op} {name} here")

        def track_ratio(self, name, kind):
            """baseline / library time per call, same clock; against the ceiling, the fraction reached."""
            ours, clock = device_ms(self.bound.rlk, self.device)
            if kind == "ceiling":
                return Rates(self.device).ceiling_ms(self.bound) / ours
            (fn,) = [b.fn for b in self.bound.baselines if b.kind == kind]
            base, base_clock = device_ms(fn, self.device, clock)
            if base_clock != clock:  # the baseline cannot be captured: both with events
                ours = device_ms(self.bound.rlk, self.device, base_clock)[0]
            return base / ours

        track_ratio.unit = "x"

    Times.__name__ = Times.__qualname__ = _camel(op)
    Ratio.__name__ = Ratio.__qualname__ = _camel(op) + "Ratio"
    return Times, Ratio
