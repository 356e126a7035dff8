"""ConfigRuns: every repeat of one server configuration, with medians and same-run ratios.

Repeats of all configurations are interleaved (A B A B ...), so slow drift of a shared machine
hits every configuration alike. A ratio against the baseline (the first configuration) is taken
per repeat, between runs that were neighbours in time, and the median of those is quoted.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from benchmarks.load_driver import LoadRun
from benchmarks.metrics import RunMetrics


@dataclass(slots=True)
class ConfigRuns:
    name: str
    flags: list[str]
    runs: list[dict[str, float]] = field(default_factory=list)  # per repeat: RunMetrics.flat() + server figures
    # samples pooled over repeats, in seconds, for the plot
    ttfts_s: list[float] = field(default_factory=list)
    itls_s: list[float] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    server_startup_s: float | None = None

    def add(self, load: LoadRun) -> dict[str, float]:
        metrics = RunMetrics.of_records(load.records, load.start_s)
        row = metrics.flat()
        num_prompt = load.stat_delta("num_prompt_tokens")
        row["prefix_hit_rate"] = load.stat_delta("num_prefix_hit_tokens") / num_prompt if num_prompt > 0 else float("nan")
        row["num_server_steps"] = float(load.stat_delta("num_steps"))
        self.runs.append(row)
        ok = [r for r in load.records if r.ok]
        self.ttfts_s += [r.ttft_s for r in ok]
        self.itls_s += [gap for r in ok for gap in r.itls_s]
        self.latencies_s += [r.latency_s for r in ok]
        self.errors += [r.error or f"finish reason {r.finish_reason}" for r in load.records if not r.ok][:5]
        return row

    def median(self) -> dict[str, float]:
        keys = self.runs[0].keys() if self.runs else []
        return {k: _median([run[k] for run in self.runs if k in run]) for k in keys}

    def ratio_to(self, baseline: ConfigRuns) -> dict[str, float]:
        """Median over repeats of (this run / the baseline's run of the same repeat)."""
        pairs = list(zip(self.runs, baseline.runs, strict=False))
        keys = pairs[0][0].keys() if pairs else []
        return {k: _median([mine[k] / base[k] for mine, base in pairs if k in base and base[k] not in (0.0,)]) for k in keys}

    def to_json(self, baseline: ConfigRuns | None) -> dict:
        return {
            "name": self.name,
            "server_flags": self.flags,
            "server_startup_s": self.server_startup_s,
            "median": self.median(),
            "ratio_to_baseline": self.ratio_to(baseline) if baseline is not None else None,
            "runs": self.runs,
            "sample_errors": self.errors[:5],
        }


def _median(values: list[float]) -> float:
    values = [v for v in values if v == v]  # drop NaN
    return statistics.median(values) if values else float("nan")
