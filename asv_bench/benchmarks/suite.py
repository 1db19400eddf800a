"""asv benchmarks: thin wrappers over the suite's cases (rlk_triton/bench/cases.py), the same cases
`rlk-triton bench` runs. GPU only: without CUDA every benchmark is skipped (n/a).

Install the package first (`pip install -e .`); asv runs in that environment ("environment_type":
"existing"). From asv_bench/: `asv machine --yes && asv run --quick --set-commit-hash HEAD`.
<Family>.track_* are the library's device time (CUDA graph), wall clock and extra peak memory;
<Family>Ratio.track_ratio is baseline / library time per call for each kind of baseline (eager,
compile, default, liger, cce) and, for "ceiling", the fraction of the run's physical limit reached.
"""
from rlk_triton.bench import FAMILIES
from rlk_triton.bench.asv import classes

for _op in FAMILIES:  # <Family> and <Family>Ratio of every family, bound to their names for asv's discovery
    for _cls in classes(_op):
        globals()[_cls.__name__] = _cls
