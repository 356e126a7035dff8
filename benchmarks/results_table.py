"""The readable table: one row per figure, one column per configuration (median over repeats),
and for every configuration after the first, its ratio to the first (median of per-repeat ratios).
"""

from __future__ import annotations

from benchmarks.config_runs import ConfigRuns

# (key in RunMetrics.flat() / ConfigRuns rows, label, format)
ROWS: tuple[tuple[str, str, str], ...] = (
    ("num_completed", "completed requests", "{:.0f}"),
    ("num_failed", "failed requests", "{:.0f}"),
    ("duration_s", "duration (s)", "{:.2f}"),
    ("request_throughput", "request throughput (req/s)", "{:.3f}"),
    ("output_throughput", "output throughput (tok/s)", "{:.1f}"),
    ("total_throughput", "total throughput (tok/s)", "{:.1f}"),
    *(
        (f"{name}.{stat}_ms", f"{label} {stat} (ms)", "{:.1f}")
        for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("latency", "E2E latency"))
        for stat in ("mean", "p50", "p95", "p99")
    ),
    ("prefix_hit_rate", "prefix hit rate (server)", "{:.3f}"),
    ("num_server_steps", "server steps", "{:.0f}"),
)


def render_table(configs: list[ConfigRuns], title: str) -> str:
    base = configs[0]
    medians = [c.median() for c in configs]
    ratios = [c.ratio_to(base) for c in configs[1:]]
    header = ["figure", *(f"[{i}] median" for i in range(len(configs))), *(f"[{i}]/[0]" for i in range(1, len(configs)))]
    rows = [header]
    for key, label, fmt in ROWS:
        cells = [label, *(_fmt(fmt, m.get(key)) for m in medians), *(_fmt("{:.3f}", r.get(key)) for r in ratios)]
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [title]
    lines += [f"  [{i}] {c.name}" for i, c in enumerate(configs)]
    lines.append(f"  {len(base.runs)} repeat(s); medians over repeats; ratios are per-repeat [i]/[0], median of those "
                 "(< 1 is lower: better for latencies, worse for throughputs)")
    for n, row in enumerate(rows):
        lines.append("  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(fmt: str, value: float | None) -> str:
    if value is None or value != value:
        return "-"
    return fmt.format(value)
