"""A picture of an attention GPU report (scripts/gpu_attention_split.py's JSON): per shape, how fast
rlk_triton's attention is against each stock baseline measured in the same run, forward and
forward + backward side by side.

    python scripts/plot_attention_report.py docs/reports/h100-attention-2026-12-05.json --out docs/attention-h100.png

Bars are speed ratios, baseline time / ours (above 1: ours is faster): against SDPA's default backend
choice (the backend the report names, cuDNN on the H200 and H100), SDPA's flash backend, and torch's
packed varlen_attn where the report has it. Dashed lines: the training-attention issue's targets
against the default (0.85x forward, 0.8x forward + backward).
"""
from __future__ import annotations

import sys
from pathlib import Path

import report_figure

TARGETS = {"fwd": 0.85, "fwd+bwd": 0.8}
PASSES = ("fwd", "fwd+bwd")


def ratios(report: dict) -> tuple[list[str], dict]:
    """(shapes in report order, {pass: {baseline label: [ratio or None per shape]}}) of a report."""
    sdpa = report.get("sdpa") or report.get("rows_sdpa") or []
    varlen = [r for r in report.get("varlen", []) if "ratio" in r]
    shapes = list(dict.fromkeys(r["shape"] for r in sdpa + varlen))
    backend = next((r["sdpa_backend"] for r in sdpa if r.get("sdpa_backend")), "default")
    out = {}
    for p in PASSES:
        by = {f"SDPA default ({backend})": {}, "SDPA flash": {}, "torch varlen_attn": {}}
        for r in sdpa:
            if r.get("pass") == p and "rlk_ms" in r:
                by[f"SDPA default ({backend})"][r["shape"]] = r["sdpa_default_ms"] / r["rlk_ms"]
                if r.get("sdpa_flash_ms"):
                    by["SDPA flash"][r["shape"]] = r["sdpa_flash_ms"] / r["rlk_ms"]
        for r in varlen:
            if r.get("pass") == p:
                by["torch varlen_attn"][r["shape"]] = r["stock_varlen_ms"] / r["rlk_ms"]
        out[p] = {label: [v.get(s) for s in shapes] for label, v in by.items() if v}
    return shapes, out


def _label(shape: str) -> str:
    """'4 x 8192 D=64, 32/8 heads, D=64, causal, bf16' -> '4 x 8192\n32/8 heads, D 64'."""
    parts = [p.strip() for p in shape.split(",")]
    batch = parts[0].split(" D=")[0]
    heads = next((p.replace(" heads", "") for p in parts if p.endswith("heads")), "")
    d = next((p.replace("D=", "D ") for p in parts[1:] if p.startswith("D=")), "")
    return f"{batch}\n{heads}, {d}"


def plot(report: dict, path: Path) -> Path:
    plt = report_figure.pyplot()
    shapes, by_pass = ratios(report)
    if not shapes:
        raise ValueError("the report has no sdpa / varlen rows with timings")
    labels = [_label(s) for s in shapes]
    colors = ("#1b9e77", "#7570b3", "#d95f02")
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.4), sharey=True)
    top = max(v for series in by_pass.values() for vals in series.values() for v in vals if v is not None)
    for ax, p in zip(axes, PASSES):
        series = by_pass[p]
        width = 0.8 / max(1, len(series))
        for i, ((label, vals), color) in enumerate(zip(series.items(), colors)):
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(shapes))]
            bars = ax.bar([x for x, v in zip(xs, vals) if v is not None], [v for v in vals if v is not None],
                          width, label=label, color=color)
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
        default = next(iter(series.values()))
        for j, v in enumerate(default):
            if v is None:  # a packed mixed-length batch: SDPA takes it only as nested tensors, not causal
                ax.text(j - 0.2, 0.05, "no SDPA row:\nnested tensors\nrefuse is_causal", fontsize=6.5, ha="center")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(TARGETS[p], color="#e7298a", linestyle="--", linewidth=1,
                   label=f"issue target vs default ({TARGETS[p]}x)")
        ax.set_xticks(range(len(shapes)), labels, fontsize=7.5)
        ax.set_title({"fwd": "forward", "fwd+bwd": "forward + backward"}[p])
        ax.set_ylim(0, top * 1.3)  # room for the legend above the bars
        ax.legend(fontsize=8, loc="upper left", ncol=2)
    axes[0].set_ylabel("speed of rlk_triton's attention / baseline (baseline ms / ours)")
    return report_figure.finish(fig, report, "rlk_triton attention against stock baselines", path)


def main(argv=None) -> int:
    return report_figure.main(argv, __doc__.splitlines()[0], "a scripts/gpu_attention_split.py JSON report", plot)


if __name__ == "__main__":
    sys.exit(main())
