"""StatsLogger: one INFO line every `interval_s` while the server is busy, silent when idle.

What vLLM prints every 10 s and SGLang every 40 decode steps, from the scheduler's own
counters (SchedulerStats), so the line and `Client.stats()` always agree:

    stats: prompt 412.3 tok/s, generation 96.1 tok/s; running 4, waiting 2, retracted 0 (total);
           KV 37.5% used; prefix cache hit 61.2%; 1203 tokens generated (total)

Throughputs and the hit rate cover the interval since the previous line (prefill tokens
computed, tokens sampled; prefix-cache hits over prompt tokens admitted). KV usage counts
pages held by live requests and the pages promised to them (reserved), over the pool. Once
speculative decoding has drafted anything, the line ends with the interval's drafts:

    ...; spec: 120 drafts, 61.0% of 480 draft tokens accepted, mean acceptance length 3.44
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from zserve.common.scheduler_stats import SchedulerStats

logger = logging.getLogger("scheduler_proc")


@dataclass(slots=True)
class StatsLogger:
    interval_s: float  # 0 = never log
    num_pages: int
    last_log_s: float = 0.0
    last: SchedulerStats | None = None  # the totals at the previous line

    def due_in_s(self, now_s: float) -> float | None:
        """Seconds until the next line may be due (0: now), or None when logging is off."""
        if self.interval_s <= 0:
            return None
        return max(0.0, self.last_log_s + self.interval_s - now_s)

    def pending(self, stats: SchedulerStats) -> bool:
        """Whether something happened since the last line (an idle scheduler need not wake up)."""
        return self.last is None or _moved(self.last, stats)

    def maybe_log(self, now_s: float, stats: SchedulerStats) -> str | None:
        """Log (and return) the line when one is due and something happened in the interval;
        the first call only starts the clock."""
        if self.last is None:
            self.restart(now_s, stats)
            return None
        if self.due_in_s(now_s) != 0.0 or not _moved(self.last, stats):
            return None
        line = self.format_line(stats, now_s - self.last_log_s)
        logger.info("%s", line)
        self.restart(now_s, stats)
        return line

    def restart(self, now_s: float, stats: SchedulerStats) -> None:
        """Start the next interval now (after an idle wait, which no line should average over)."""
        self.last, self.last_log_s = stats, now_s

    def format_line(self, stats: SchedulerStats, elapsed_s: float) -> str:
        last = self.last
        elapsed_s = max(elapsed_s, 1e-9)
        prompt_tok_s = (stats.num_prefilled_tokens - last.num_prefilled_tokens) / elapsed_s
        gen_tok_s = (stats.num_generated_tokens - last.num_generated_tokens) / elapsed_s
        num_admitted_tokens = stats.num_prompt_tokens - last.num_prompt_tokens
        num_hit_tokens = stats.num_prefix_hit_tokens - last.num_prefix_hit_tokens
        hit_rate = num_hit_tokens / num_admitted_tokens if num_admitted_tokens else 0.0
        kv_usage = (stats.num_used_pages + stats.num_reserved_pages) / max(self.num_pages, 1)
        return (
            f"stats: prompt {prompt_tok_s:.1f} tok/s, generation {gen_tok_s:.1f} tok/s; "
            f"running {stats.num_running}, waiting {stats.num_waiting}, retracted {stats.num_retracted} (total); "
            f"KV {100 * kv_usage:.1f}% used; prefix cache hit {100 * hit_rate:.1f}%; "
            f"{stats.num_generated_tokens} tokens generated (total)"
        ) + _chunk_part(stats) + _overlap_part(last, stats) + (_spec_part(last, stats) if stats.num_drafts else "")


def _chunk_part(stats: SchedulerStats) -> str:
    """The prefill chunk --max-step-ms last allowed beside decodes (StepTimeBound), once it has bounded one."""
    return f"; prefill chunk beside decodes {stats.prefill_chunk_tokens} tokens" if stats.prefill_chunk_tokens else ""


def _overlap_part(last: SchedulerStats, stats: SchedulerStats) -> str:
    """The interval's share of steps sent while the one before was with the worker (--overlap-schedule), once any
    has been."""
    if not stats.num_overlapped_steps:
        return ""
    num_steps = stats.num_steps - last.num_steps
    num_ahead = stats.num_overlapped_steps - last.num_overlapped_steps
    return f"; {100 * num_ahead / num_steps if num_steps else 0.0:.0f}% of steps sent ahead"


def _spec_part(last: SchedulerStats, stats: SchedulerStats) -> str:
    """The interval's speculative drafts: rows drafted, share of draft tokens accepted, and tokens
    a drafted row gained per step (1 + accepted per drafted row, vLLM's mean acceptance length)."""
    num_drafts = stats.num_drafts - last.num_drafts
    num_draft_tokens = stats.num_draft_tokens - last.num_draft_tokens
    num_accepted = stats.num_accepted_tokens - last.num_accepted_tokens
    rate = num_accepted / num_draft_tokens if num_draft_tokens else 0.0
    length = 1 + num_accepted / num_drafts if num_drafts else 0.0
    return (
        f"; spec: {num_drafts} drafts, {100 * rate:.1f}% of {num_draft_tokens} draft tokens accepted, "
        f"mean acceptance length {length:.2f}"
    )


def _moved(last: SchedulerStats, stats: SchedulerStats) -> bool:
    """Busy now, or a step ran or a request came since `last`."""
    busy_now = stats.num_running or stats.num_waiting or stats.num_prefilling
    return bool(busy_now) or stats.num_steps != last.num_steps or stats.num_submitted != last.num_submitted
