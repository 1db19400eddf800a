"""A picture of a host-overhead report (scripts/gpu_host_overhead.py's JSON): each public call's wall
time per call against its device time and the issue's target, same run. Left, forward calls; right,
forward + backward calls, where the target is also drawn with autograd's own floor added (torch's
cheapest fwd+bwd in the same run) and the call is drawn again with the backward on the calling
thread. Eager torch's wall time for the same computation where the report has it.

    python scripts/plot_host_overhead_report.py docs/reports/h100-host-overhead-2026-12-06-92ea477.json \
        --out docs/host-overhead-h100.png
"""
from __future__ import annotations

import sys
from pathlib import Path

import report_figure

US = 1e3  # the report's times are ms


def panels(report: dict) -> tuple[list[dict], list[dict], dict | None]:
    """(forward rows, fwd+bwd rows, the autograd floor row or None), in report order."""
    fwd, bwd, floor = [], [], None
    for r in report["rows"]:
        if r["op"] == "torch":
            floor = r
        else:
            (bwd if "bwd" in r["case"] else fwd).append(r)
    return fwd, bwd, floor


def _label(r: dict) -> str:
    case = r["case"].replace(" (issue target)", " *").replace(" (a @ w.t())", "")
    return f"{r['op']} {case}"[:58]


def _panel(ax, rows: list[dict], with_floor: bool) -> None:
    ys = list(range(len(rows)))
    wall = [r["wall_eager_ms"] * US for r in rows]
    met = [r["meets_target_beyond_autograd_floor"] if with_floor else r["meets_target"] for r in rows]
    bars = ax.barh(ys, wall, 0.6, color=["#1b9e77" if m else "#d95f02" for m in met], zorder=2)
    for bar, r in zip(bars, rows):  # a forward row below the 1M elements: outside its target's scope
        if r.get("in_issue_scope") is False:
            bar.set_hatch("//")
            bar.set_alpha(0.5)
    ax.bar_label(bars, fmt="%.0f", fontsize=6.5, padding=2)
    ax.scatter([r["device_ms"] * US for r in rows], ys, marker="o", s=22, color="black", zorder=3,
               label="device time (CUDA graph)")
    ax.scatter([r["target_ms"] * US for r in rows], ys, marker="|", s=260, color="#7570b3", zorder=3,
               label="target: max(1.25 x device, device + 30 us)")
    if with_floor:
        ax.scatter([r["target_beyond_autograd_floor_ms"] * US for r in rows], ys, marker="|", s=260,
                   color="#e7298a", zorder=3, label="target + autograd's floor")
        caller = [(y, r["wall_eager_backward_on_caller_ms"] * US) for y, r in zip(ys, rows)
                  if "wall_eager_backward_on_caller_ms" in r]
        ax.scatter([v for _, v in caller], [y for y, _ in caller], marker="D", s=14, color="#66a61e", zorder=3,
                   label="ours, backward on the calling thread")
    torch_rows = [(y, r["torch_eager_wall_ms"] * US) for y, r in zip(ys, rows) if "torch_eager_wall_ms" in r]
    ax.scatter([v for _, v in torch_rows], [y for y, _ in torch_rows], marker="x", s=26, color="#e6ab02", zorder=3,
               label="eager torch, same computation")
    ax.set_xscale("log")
    ax.set_yticks(ys, [_label(r) for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.grid(axis="x", which="both", alpha=0.25)
    ax.set_xlabel("us per call (wall: many calls from the host, one sync); log scale")


def plot(report: dict, path: Path) -> Path:
    plt = report_figure.pyplot()
    fwd, bwd, floor = panels(report)
    if not fwd or not bwd:
        raise ValueError("the report has no forward or no forward + backward rows")
    if floor is None or any("target_beyond_autograd_floor_ms" not in r for r in bwd):
        raise ValueError("the report has no autograd floor row (scripts/gpu_host_overhead.py before 92ea477)")
    fig, (left, right) = plt.subplots(1, 2, figsize=(17, max(6, 0.3 * max(len(fwd), len(bwd)) + 2.5)))
    _panel(left, fwd, with_floor=False)
    left.set_title("forward calls: wall time per call (bar green: within the target; * the issue's named shapes)"
                   + ("\n(hatched: below 1M elements, outside the target's scope)"
                      if any("in_issue_scope" in r for r in fwd) else ""), fontsize=10)
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=2)
    _panel(right, bwd, with_floor=True)
    right.set_title(f"forward + backward: autograd's floor (torch x * 2) {floor['torch_eager_wall_ms'] * US:.0f} us, "
                    f"{floor['torch_eager_backward_on_caller_wall_ms'] * US:.0f} on the caller\n"
                    "(bar green: within target + floor)", fontsize=10)
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=2)
    verdict = report.get("verdict")
    title = "host overhead of eager calls"
    if verdict is not None:
        title += " (issue targets: " + ("all met" if verdict["meets"] else "not all met") + ")"
    return report_figure.finish(fig, report | report.get("versions", {}), title, path)


def main(argv=None) -> int:
    return report_figure.main(argv, __doc__.splitlines()[0], "a scripts/gpu_host_overhead.py JSON report", plot)


if __name__ == "__main__":
    sys.exit(main())
