"""A picture of a linear_logp GPU report (scripts/gpu_linear_logp.py's JSON): per LM-head shape, the
forward + backward speed of both saved-state policies against torch eager, with the cuBLAS GEMM bound
each policy is measured against, and the extra memory beside it.

    python scripts/plot_linear_logp_report.py docs/reports/h100-linear-logp-2026-12-05-first-range.json \\
        --out docs/linear_logp-h100.png

Left: speed = eager ms / ours (above 1: faster than eager). A tick over each bar marks the speed its
bound would give (eager ms / the bound's ms: four cuBLAS GEMMs for "recompute", three for "logits",
no softmax work). Dashed: the issue's 1.15x target for "logits". Right: peak extra memory of one
forward + backward, GiB (the gradients included).
"""
from __future__ import annotations

import sys
from pathlib import Path

import report_figure

MODES = ("recompute", "logits")
LOGITS_TARGET = 1.15


def speeds(report: dict) -> tuple[list[str], dict]:
    """(shapes in report order, {mode: {"speed": [...], "bound_speed": [...], "extra_gib": [...]},
    "eager": {"extra_gib": [...]}}) from a report's rows of the two policies (saved_vocab rows left out)."""
    rows = [r for r in report["rows"] if r["mode"] in MODES]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    by = {(r["shape"], r["mode"]): r for r in rows}
    out = {m: {"speed": [], "bound_speed": [], "extra_gib": []} for m in MODES}
    out["eager"] = {"extra_gib": []}
    for s in shapes:
        for m in MODES:
            r = by.get((s, m))
            out[m]["speed"].append(r["eager_ms"] / r["rlk_ms"] if r else None)
            out[m]["bound_speed"].append(r["eager_ms"] / r["gemm_bound_ms"] if r else None)
            out[m]["extra_gib"].append(r["extra_gib"] if r else None)
        any_row = by.get((s, "recompute")) or by[(s, "logits")]
        out["eager"]["extra_gib"].append(any_row["eager_extra_gib"])
    return shapes, out


def plot(report: dict, path: Path) -> Path:
    plt = report_figure.pyplot()
    shapes, data = speeds(report)
    if not shapes:
        raise ValueError("the report has no recompute / logits rows")
    labels = [s.replace(" x ", "\n", 1) for s in shapes]
    colors = {"recompute": "#7570b3", "logits": "#1b9e77", "eager": "#999999"}
    fig, (ax, mem) = plt.subplots(1, 2, figsize=(15, 5.4), gridspec_kw={"width_ratios": (3, 2)})
    width = 0.36
    for i, m in enumerate(MODES):
        xs = [j + (i - 0.5) * width for j in range(len(shapes))]
        vals = data[m]["speed"]
        bars = ax.bar([x for x, v in zip(xs, vals) if v is not None], [v for v in vals if v is not None], width,
                      color=colors[m], label=f'saved="{m}"')
        ax.bar_label(bars, fmt="%.2fx", fontsize=8, label_type="center", color="white")
        bound = data[m]["bound_speed"]
        ax.scatter([x for x, v in zip(xs, bound) if v is not None], [v for v in bound if v is not None], marker="_",
                   s=500, color="black", linewidths=1.5,
                   label="its cuBLAS bound (4 GEMMs / 3 GEMMs)" if i == 0 else None, zorder=3)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(LOGITS_TARGET, color="#e7298a", linestyle="--", linewidth=1,
               label=f'issue target for "logits" ({LOGITS_TARGET}x)')
    ax.set_xticks(range(len(shapes)), labels, fontsize=8)
    ax.set_xlabel("tokens x (hidden x vocab)")
    ax.set_ylabel("forward + backward speed against torch eager (eager ms / ours)")
    top = max(v for m in MODES for key in ("speed", "bound_speed") for v in data[m][key] if v is not None)
    ax.set_ylim(0, top * 1.25)
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    ax.set_title("speed")
    width = 0.26
    for i, m in enumerate(MODES + ("eager",)):
        xs = [j + (i - 1) * width for j in range(len(shapes))]
        vals = data[m]["extra_gib"]
        bars = mem.bar([x for x, v in zip(xs, vals) if v is not None], [v for v in vals if v is not None], width,
                       color=colors[m], label="torch eager" if m == "eager" else f'saved="{m}"')
        mem.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
    mem.set_xticks(range(len(shapes)), labels, fontsize=8)
    mem.set_ylabel("peak extra memory of one forward + backward, GiB")
    mem.legend(fontsize=8, loc="upper left")
    mem.set_title("memory (gradients included)")
    return report_figure.finish(fig, report, "rlk_triton linear_logp against torch eager", path)


def main(argv=None) -> int:
    return report_figure.main(argv, __doc__.splitlines()[0], "a scripts/gpu_linear_logp.py JSON report", plot)


if __name__ == "__main__":
    sys.exit(main())
