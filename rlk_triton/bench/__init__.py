"""The benchmark suite: cases defined once per operator family (cases.py), timed and reported in one
format (report.py) by `rlk-triton bench`, by asv (asv.py, asv_bench/) and on the GPU machine by
scripts/gpu_run.sh. Every figure is a ratio against baselines and ceilings measured in the same run.
"""
from .cases import BASELINE_KINDS, FAMILIES, SIZES, Case, select
from .report import FORMAT, run, write
from .timing import copy_rate_gbps, graph_ms, wall_ms

__all__ = ["BASELINE_KINDS", "FAMILIES", "SIZES", "Case", "select", "FORMAT", "run", "write", "copy_rate_gbps",
           "graph_ms", "wall_ms"]
