"""What the plot_*_report.py scripts share: matplotlib without a display, a title naming the
report's run (device, versions, commit, date), the saved .png, and the command line
`script REPORT.json --out FILE.png`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def finish(fig, report: dict, what: str, path: Path) -> Path:
    """Title the figure with `what` and the report's run, save it to path, close it."""
    fig.suptitle(f"{what}, same run: {report.get('device')}, torch {report.get('torch')}, triton "
                 f"{report.get('triton')}, commit {report.get('commit')}, {report.get('date')}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    pyplot().close(fig)
    return path


def main(argv, description: str, report_help: str, plot: Callable[[dict, Path], Path]) -> int:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("report", help=report_help)
    ap.add_argument("--out", required=True, help="the .png to write")
    args = ap.parse_args(argv)
    with open(args.report) as f:
        report = json.load(f)
    print(plot(report, Path(args.out)))
    return 0
