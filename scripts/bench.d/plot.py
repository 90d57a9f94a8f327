#!/usr/bin/env python3
"""Plots what `scripts/bench` measured: wall time and peak RSS against pods, one line per
contender, log-log. Needs matplotlib (scripts/bench runs this in its own venv).

  plot.py FIGURES.json OUT.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "bouncer": dict(color="#d62728", marker="o", linewidth=2.5),
    "pods": dict(color="#1f77b4", marker="s", linestyle="--"),
    "pods-paged": dict(color="#17becf", marker="s", linestyle=":"),
    "floor-par": dict(color="#2ca02c", marker="^", linestyle="--"),
    "floor-seq": dict(color="#98df8a", marker="v", linestyle=":"),
    "diy": dict(color="#7f7f7f", marker="D"),
    "descheduler": dict(color="#9467bd", marker="P"),
}


def main():
    figures, out = sys.argv[1], sys.argv[2]
    with open(figures) as f:
        data = json.load(f)
    sizes = sorted((s for s in data["sizes"] if s.get("shape", "owned") == "owned"), key=lambda s: s["pods"])
    bare = [s for s in data["sizes"] if s.get("shape") == "bare"]
    labels = data["labels"]
    fig, (ax_wall, ax_rss) = plt.subplots(1, 2, figsize=(13, 5.2))
    for name in labels:
        pts = [(s["pods"], s["contenders"][name]) for s in sizes if name in s["contenders"]]
        if not pts:
            continue
        pods = [p for p, _ in pts]
        style = STYLE.get(name, {})
        ax_wall.plot(pods, [c["wall"] for _, c in pts], label=labels[name], **style)
        # The floors are curl and a small Python loop: their RSS says nothing about a tool.
        if name not in ("pods", "pods-paged", "floor-par", "floor-seq"):
            ax_rss.plot(pods, [c["rss_kib"] / 1024 for _, c in pts], label=labels[name], **style)
    # The bare fleet (one workload row per pod), measured at one size: bouncer and the pods LIST.
    for s in bare:
        for name, marker in (("bouncer", "*"), ("pods", "x")):
            c = s["contenders"].get(name)
            if not c:
                continue
            kw = dict(color=STYLE[name]["color"], marker=marker, markersize=11, linestyle="none")
            ax_wall.plot([s["pods"]], [c["wall"]], label=f"{labels[name]}, bare pods", **kw)
            if name == "bouncer":
                ax_rss.plot([s["pods"]], [c["rss_kib"] / 1024], label=f"{labels[name]}, bare pods", **kw)
    for ax, title, unit in ((ax_wall, "wall time", "seconds"), (ax_rss, "peak RSS", "MiB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("pods (100 per namespace, 20 workloads each)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for pods, mib in (5000, 25), (50000, 40):
        ax_rss.plot([pods], [mib], marker="_", markersize=22, color="#d62728", alpha=0.6)
        ax_rss.annotate(f"target {mib} MiB", (pods, mib), textcoords="offset points", xytext=(8, -10),
                        fontsize=7, color="#d62728")
    note = "memory-leak-reloader: not measured (the Go module proxy does not serve it; see docs/performance.md)" if data.get("mlr") else ""
    fig.suptitle("bouncer plan against the API server floors and other tools, one dry-run decision over every pod"
                 + ("\n" + note[:150] if note else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
