"""A picture of a native GPU report (scripts/gpu_native.py's JSON): native against Triton, same run.
Left, at 1024 rows and more: each launch's device time, native / Triton (below 1: native is faster).
Right, at decode sizes: wall time per call from the host, Triton's and native's launch and public
call side by side, with the bare binding call (the floor of a call that allocates its outputs).

    python scripts/plot_native_report.py docs/reports/h200-native-2026-12-06.json --out docs/native-h200.png
"""
from __future__ import annotations

import sys
from pathlib import Path

import report_figure

# (Triton's backend name, native's) per kind of call; public calls are matched by their backend= text
KINDS = {"launch": ("triton launch", "native launch"),
         "backward launch": ("triton backward launch", "native backward launch")}


def _rows_of(shape: str) -> int:
    return int(shape.split(" x ")[0])


def pairs(report: dict) -> list[dict]:
    """[{op, shape, kind, triton, native, bare}] in report order: the rows of one call on both backends."""
    by = {}
    for r in report["rows"]:
        key = (r["op"], r["shape"])
        b = r["backend"]
        for kind, (t, n) in KINDS.items():
            if b in (t, n):
                by.setdefault(key + (kind,), {})["triton" if b == t else "native"] = r
        if "backend='triton'" in b or "backend='cuda_native'" in b:
            by.setdefault(key + ("public call",), {})["triton" if "'triton'" in b else "native"] = r
        if b == "bare extension call":
            by.setdefault(key + ("bare",), {})["native"] = r
    out = []
    for (op, shape, kind), v in by.items():
        if kind != "bare" and "triton" in v and "native" in v:
            bare = by.get((op, shape, "bare"), {}).get("native")
            out.append({"op": op, "shape": shape, "kind": kind, "triton": v["triton"], "native": v["native"],
                        "bare": bare if kind == "launch" else None})
    return out


def plot(report: dict, path: Path) -> Path:
    plt = report_figure.pyplot()
    ps = pairs(report)
    big = [p for p in ps if p["kind"] != "public call" and _rows_of(p["shape"]) >= 1024]
    small = [p for p in ps if _rows_of(p["shape"]) <= 64 and "residual" not in p["op"]]
    if not big or not small:
        raise ValueError("the report has no native / Triton pairs at training or decode sizes")
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, max(6, 0.32 * len(small) + 2)),
                                      gridspec_kw={"width_ratios": (1, 1.25)})
    labels = [f"{p['op']}\n{p['shape']}" for p in big]
    ratio = [p["native"]["device_ms"] / p["triton"]["device_ms"] for p in big]
    bars = left.barh(range(len(big)), ratio, color=["#1b9e77" if r <= 1 else "#d95f02" for r in ratio])
    left.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)
    left.axvline(1.0, color="black", linewidth=0.8)
    left.set_yticks(range(len(big)), labels, fontsize=7)
    left.invert_yaxis()
    left.set_xlim(min(0.8, min(ratio) - 0.05), max(1.1, max(ratio) + 0.05))
    left.set_xlabel("device time, native / Triton (below 1: native faster)")
    left.set_title("1024 rows and more: each launch's device time (CUDA graphs)")

    ys = range(len(small))
    width = 0.4
    for i, (who, color) in enumerate((("triton", "#7570b3"), ("native", "#1b9e77"))):
        vals = [p[who]["wall_ms"] * 1e3 for p in small]
        b = right.barh([y + (i - 0.5) * width for y in ys], vals, width, color=color,
                       label="Triton" if who == "triton" else "native")
        right.bar_label(b, fmt="%.0f", fontsize=6.5, padding=1)
    floor = [(y, p["bare"]["wall_ms"] * 1e3) for y, p in zip(ys, small) if p["bare"] is not None]
    if floor:
        right.scatter([v for _, v in floor], [y for y, _ in floor], marker="|", s=220, color="black",
                      label="bare binding call (an allocating call's floor)", zorder=3)
    right.set_yticks(list(ys), [f"{p['op']}, {p['kind']}\n{p['shape']}" for p in small], fontsize=7)
    right.invert_yaxis()
    right.set_xlabel("wall time per call from the host, us (one sync after many calls)")
    right.set_title("decode sizes: wall time per call")
    right.legend(fontsize=8, loc="upper right")
    return report_figure.finish(fig, report, "native CUDA kernels against Triton", path)


def main(argv=None) -> int:
    return report_figure.main(argv, __doc__.splitlines()[0], "a scripts/gpu_native.py JSON report", plot)


if __name__ == "__main__":
    sys.exit(main())
