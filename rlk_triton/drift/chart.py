"""`rlk-triton drift --chart FILE.png`: the two groups in one figure (matplotlib, Agg backend).

Left: how far the trainer's logp of each sampled token is from the rollout's, |dlogp| on a log axis,
for both groups. A log axis has no 0, so exactly equal tokens are counted in the legend and in a note.
Right: the control group's layer-wise probe, max and mean |diff| of the activations at each stage
(embedding, each decoder layer, final norm, logits) on a log axis, with bitwise-equal stages drawn
on a floor line marked "= 0", and the rlk group's probe beside it when there is one.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InputError
from .report import GroupResult

CONTROL_COLOR, RLK_COLOR = "#d95f02", "#1b9e77"


def write_chart(path, report: dict, control: GroupResult, rlk: GroupResult | None = None) -> Path:
    """Write the PNG to `path` and return it. `report` is build_report's dict (for the title)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    path = Path(path)
    if path.suffix.lower() != ".png":
        raise InputError("chart", f"must be a .png path, got {str(path)!r}")
    if not isinstance(control, GroupResult):
        raise InputError("control", f"must be a GroupResult, got {type(control).__name__}")
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.6), gridspec_kw={"width_ratios": [1.15, 1]})
    _distribution(left, control, rlk)
    _layers(right, control, rlk)
    model = report.get("model")
    name = model.get("name") if isinstance(model, dict) else model
    temp = report.get("settings", {}).get("temperature")
    fig.suptitle(f"Rollout vs training log-probs of the same sampled tokens: {name}\n"
                 f"device {report.get('device')}, dtype {report.get('dtype')}, seed {report.get('seed')}"
                 + (f", temperature {temp}" if temp is not None else ""), fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # "tight" keeps the legends below the axes
    plt.close(fig)
    return path


def _distribution(ax, control, rlk):
    groups = [("control (transformers: generate vs teacher forcing)", control, CONTROL_COLOR)]
    if rlk is not None:
        groups.append(("rlk (rlk rollout engine vs rlk training path)", rlk, RLK_COLOR))
    nonzero = np.concatenate([g.abs_dlogp[g.abs_dlogp > 0] for _, g, _ in groups])
    nonzero = nonzero[np.isfinite(nonzero)]
    lo, hi = (nonzero.min(), nonzero.max()) if nonzero.size else (1e-8, 1e-1)
    bins = np.logspace(np.floor(np.log10(lo)) - 0.25, np.ceil(np.log10(hi)) + 0.25, 41)
    notes = []
    for label, g, color in groups:
        d = g.abs_dlogp
        n, zeros = d.size, int((d == 0).sum())
        pos = d[(d > 0) & np.isfinite(d)]
        if pos.size:
            ax.hist(pos, bins=bins, color=color, alpha=0.6, label=f"{label}: {pos.size}/{n} tokens differ")
            ax.axvline(pos.max(), color=color, ls="--", lw=1)
            ax.annotate(f"max {pos.max():.2g}", (pos.max(), 0.72), xycoords=("data", "axes fraction"),
                        xytext=(3, 0), textcoords="offset points", color=color, fontsize=8)
        else:
            ax.plot([], [], color=color, lw=6, label=f"{label}: no token differs")
        short = label.split(" ")[0]
        notes.append((f"{short}: all {n} tokens bitwise equal (|dlogp| = 0)" if zeros == n
                      else f"{short}: {zeros}/{n} tokens bitwise equal (|dlogp| = 0, not on the log axis)", color))
    ax.set_xscale("log")
    ax.set_xlabel("|dlogp| = |logp_train - logp_rollout| per sampled token (log scale)")
    ax.set_ylabel("number of tokens")
    ax.set_title("How far apart the two log-probs of each token are")
    for i, (text, color) in enumerate(notes):
        ax.text(0.02, 0.97 - 0.07 * i, text, transform=ax.transAxes, va="top", fontsize=9, color=color,
                fontweight="bold", bbox=dict(facecolor="white", edgecolor=color, alpha=0.9))
    ax.legend(loc="lower left", bbox_to_anchor=(0, -0.36), fontsize=8, frameon=False)
    ax.set_ylim(0, max(ax.get_ylim()[1], 1) * 1.6)  # room for the notes above the bars


def _layers(ax, control, rlk):
    ax.set_title("Where it starts: activation |diff| at each stage (layer-wise probe)")
    probes = [("control", control.probe, CONTROL_COLOR)]
    if rlk is not None and rlk.probe is not None:
        probes.append(("rlk", rlk.probe, RLK_COLOR))
    stages = next((p.stages for _, p, _ in probes if p is not None and p.stages), ())
    if not stages:
        ax.text(0.5, 0.5, "no probe recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    labels = [_short(s.stage) for s in stages]
    x = np.arange(len(labels))
    positive = [v for _, p, _ in probes if p is not None for s in p.stages
                for v in (s.max_abs_diff, s.mean_abs_diff) if v > 0 and np.isfinite(v)]
    floor = min(positive) / 30 if positive else 1e-8  # where bitwise-equal stages are drawn
    ax.axhline(floor, color="grey", lw=0.8, ls=":")
    ax.text(0.5, floor / 1.15, "bitwise-equal stages are drawn here (|diff| = 0)", va="top", ha="left", fontsize=8,
            color="grey")
    for name, p, color in probes:
        if p is None:
            continue
        by = {s.stage: s for s in p.stages}
        mx = [by[s.stage].max_abs_diff if s.stage in by else np.nan for s in stages]
        mn = [by[s.stage].mean_abs_diff if s.stage in by else np.nan for s in stages]
        if p.bitwise:  # max and mean are both 0 everywhere: one line on the floor
            ax.plot(x, [floor] * len(x), "-o", color=color, label=f"{name}: max and mean |diff| = 0 at every stage")
            continue
        ax.plot(x, [v if v > 0 else floor for v in mx], "-o", color=color, label=f"{name}: max |diff|")
        ax.plot(x, [v if v > 0 else floor for v in mn], "--s", color=color, ms=4, alpha=0.8,
                label=f"{name}: mean |diff| (average over the stage's ops)")
        if p.first_divergent_op:
            i = next(i for i, s in enumerate(stages) if s.stage == _stage(p.first_divergent_op))
            ax.annotate(f"{name}: first op whose bits differ:\n{p.first_divergent_op}", (x[i], max(mx[i], floor)),
                        xytext=(25, -45), textcoords="offset points", fontsize=8, color=color,
                        arrowprops=dict(arrowstyle="->", color=color),
                        bbox=dict(facecolor="white", edgecolor="none", alpha=0.85))
    if rlk is None:
        note = "rlk: not run"
    elif rlk.probe is None:
        note = ("rlk: no probe recorded; its logp: all tokens bitwise equal" if rlk.bitwise
                else "rlk: no probe recorded")
    elif rlk.probe.bitwise:
        note = "rlk: every op of every layer bitwise equal (|diff| = 0)"
    else:
        note = None
    if note:
        ax.text(0.02, 0.97, note, transform=ax.transAxes, va="top", fontsize=9, color=RLK_COLOR, fontweight="bold",
                bbox=dict(facecolor="white", edgecolor=RLK_COLOR, alpha=0.9))
    ax.set_yscale("log")
    ax.set_xticks(x, labels, rotation=30 if len(labels) > 8 else 0)
    ax.set_xlabel("stage, in execution order (L = decoder layer)")
    ax.set_ylabel("|activation diff| over the same tokens (log scale)")
    lo, hi = ax.get_ylim()
    ax.set_ylim(floor / 3, hi * 30)  # room for the notes
    ax.legend(loc="lower left", bbox_to_anchor=(0, -0.36), fontsize=8, frameon=False, ncol=2)


def _stage(op: str) -> str:
    parts = op.split(".")
    return ".".join(parts[:2]) if parts[0] == "layers" else op


def _short(stage: str) -> str:
    return f"L{stage.split('.')[1]}" if stage.startswith("layers.") else stage
