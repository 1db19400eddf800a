"""The selected_logp gate's forward cases on the GPU, Triton against native, keeping what is needed to
explain a mismatch offline: both kernels' (logp, entropy, row_max, row_logsum) and the chunk states that
Triton's merge kernel read (the input of the merge), for every case that differs or merges chunks.

    python scripts/gpu_slp_merge_probe.py --out slp_probe.pt

The inputs are not saved: native._slp_cases builds them from a seeded CPU generator, so they are rebuilt
bit for bit offline (scripts/ptx_emulator.py then runs both merge kernels' PTX on the saved states).
"""
import argparse

import torch

from rlk_triton import native
from rlk_triton.ops import selected_logp as slp


class _KeepStates:
    """Stands in for _fwd_merge_kernel: records the chunk states it is launched on, then launches it."""

    def __init__(self, kernel):
        self.kernel, self.states = kernel, None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.states = args[12].clone()
            return self.kernel[grid](*args, **kwargs)
        return launch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ext = native.load("selected_logp")
    keep = _KeepStates(slp._fwd_merge_kernel)
    slp._fwd_merge_kernel = keep
    found, n = [], 0
    for label, case in native._slp_cases("cuda"):
        keep.states = None
        want = slp.launch_forward(*case)
        got = native._slp_forward(ext, native._slp_rows(case[0]), *case[1:])
        n += 1
        differ = [i for i, (a, b) in enumerate(zip(want, got))
                  if not torch.equal(a.view(torch.int32), b.view(torch.int32))]
        if differ or keep.states is not None:  # every merged case: the rows where both agree say as much
            found.append({"case": label, "index": n - 1, "outputs": differ,
                          "triton": [t.cpu() for t in want], "native": [t.cpu() for t in got],
                          "states": None if keep.states is None else keep.states.cpu()})
            print(label, differ, flush=True)
    torch.save({"cases": n, "found": found}, args.out)
    print(f"{sum(bool(f['outputs']) for f in found)} of {n} cases differ in a forward output")


if __name__ == "__main__":
    main()
