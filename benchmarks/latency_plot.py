"""The PNG for people who would rather look than read: latency CDFs (TTFT, ITL, end-to-end) of
every configuration, pooled over repeats, and output throughput per configuration (bar: median;
dots: each repeat)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.config_runs import ConfigRuns


def plot_runs(configs: list[ConfigRuns], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    panels = (("TTFT", "ttfts_s"), ("ITL (gap between chunks)", "itls_s"), ("end-to-end latency", "latencies_s"))
    for ax, (label, attr) in zip(axes.flat, panels, strict=False):
        for i, c in enumerate(configs):
            values_ms = np.sort(np.asarray(getattr(c, attr), dtype=np.float64)) * 1e3
            if len(values_ms):
                ax.step(values_ms, np.arange(1, len(values_ms) + 1) / len(values_ms), where="post", label=f"[{i}] {c.name}")
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylabel("fraction of samples")
        ax.set_title(f"{label}: CDF")
        ax.grid(alpha=0.3)
        if label.startswith("ITL"):
            ax.set_xscale("symlog", linthresh=10.0)
        ax.axhline(0.99, color="grey", lw=0.6, ls=":")
    axes.flat[0].legend(fontsize=7, loc="lower right")

    ax = axes.flat[3]
    xs = np.arange(len(configs))
    medians = [c.median().get("output_throughput", float("nan")) for c in configs]
    ax.bar(xs, medians, color=[f"C{i}" for i in range(len(configs))], alpha=0.6)
    for i, c in enumerate(configs):
        points = [run["output_throughput"] for run in c.runs]
        ax.plot([i] * len(points), points, "k.", ms=6)
    ax.set_xticks(xs, [f"[{i}]" for i in xs])
    ax.set_ylabel("output tokens / s")
    ax.set_title("output throughput (bar: median, dots: repeats)")
    ax.grid(alpha=0.3, axis="y")

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
