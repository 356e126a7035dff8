"""Scheduler CPU time per step at load: 256 running requests and ~1000 waiting, per step policy.

The model is a stub that returns a token at once, and only the scheduler's own calls are timed
(`next_batch` + `on_result`), so the figures are the scheduler's overhead per forward. Times are
CPU time of this thread (`time.thread_time`), so a busy machine that preempts the process does
not inflate them; wall-clock p50 is printed alongside.
Targets: decode step < 1 ms, prefill step < 3 ms.

    .venv/bin/python benchmarks/bench_scheduler.py [--steps 400] [--policy mixed]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testing.scheduler_harness import make_scheduler  # noqa: E402
from zserve.common.forward_batch import ForwardBatch, StepResult  # noqa: E402
from zserve.common.sampling_params import SamplingParams  # noqa: E402
from zserve.scheduler_proc.scheduler import STEP_POLICIES, Scheduler  # noqa: E402

PAGE_SIZE = 16
RUNNING = 256
WAITING = 1000
SYSTEM_PROMPT_LEN = 256  # shared by every request: exercises the radix cache


def stub_forward(batch: ForwardBatch) -> StepResult:
    n = batch.num_reqs  # one entry per row; the scheduler reads none for an unsampled row
    return StepResult(batch.step_id, np.full(n, 7, np.int32), np.full(n, np.nan, np.float32))


class Load:
    """Keeps ~WAITING requests queued: prompts of 64..1024 tokens after a shared system prompt,
    64..512 output tokens (ignore_eos), so requests finish and new ones are admitted all along."""

    def __init__(self, scheduler: Scheduler, seed: int):
        self.scheduler = scheduler
        self.rng = np.random.default_rng(seed)
        self.system = self.rng.integers(100, 30000, SYSTEM_PROMPT_LEN).astype(np.int32)
        self.next_id = 0

    def top_up(self) -> None:
        for _ in range(WAITING - self.scheduler.stats().num_waiting):
            own = self.rng.integers(100, 30000, int(self.rng.integers(64, 1024))).astype(np.int32)
            params = SamplingParams(max_tokens=int(self.rng.integers(64, 512)), ignore_eos=True, temperature=0.7)
            assert self.scheduler.submit(self.next_id, np.concatenate([self.system, own]), params) == []
            self.next_id += 1


def bench(policy: str, num_steps: int, seed: int) -> dict[str, list[tuple[float, float]]]:
    """(cpu ms, wall ms) of every measured step, by kind: "fill" (the warm-up steps, whatever
    they run, until all 256 rows run; their prefills use the full 8192-token budget), then, at
    256 running, decode only, prefill only, or mixed."""
    scheduler = make_scheduler(  # the server's default knobs, but for the step policy and sizes measured here
        num_pages=RUNNING * (SYSTEM_PROMPT_LEN + 1024 + 512) // PAGE_SIZE,
        page_size=PAGE_SIZE,
        context_len=4096,
        eos_token_ids=[2],
        max_running_requests=RUNNING,
        max_prefill_tokens=8192,
        schedule_policy=policy,
        max_queued_requests=2 * WAITING,
        seed=seed,
    )
    load = Load(scheduler, seed)
    load.top_up()
    times: dict[str, list[tuple[float, float]]] = {"fill": [], "decode": [], "prefill": [], "mixed": []}
    while scheduler.stats().num_running < RUNNING:  # warm up: fill every row, full-budget prefills
        _timed_step(scheduler, times, "fill")
        load.top_up()
    for _ in range(num_steps):
        _timed_step(scheduler, times, None)
        load.top_up()
    stats = scheduler.stats()
    assert stats.num_running + stats.num_prefilling >= RUNNING - 8 and stats.num_waiting == WAITING, stats
    scheduler.check_integrity()
    return times


def _timed_step(scheduler: Scheduler, times: dict[str, list[tuple[float, float]]], kind: str | None) -> None:
    c0, t0 = time.thread_time(), time.perf_counter()
    batch = scheduler.next_batch()
    c1, t1 = time.thread_time(), time.perf_counter()
    result = stub_forward(batch)
    c2, t2 = time.thread_time(), time.perf_counter()
    scheduler.on_result(result)
    c3, t3 = time.thread_time(), time.perf_counter()
    if kind is None:
        num_decode = int(((batch.extend_lens == 1) & (batch.cached_lens > 0)).sum())
        kind = "decode" if num_decode == batch.num_reqs else "prefill" if num_decode == 0 else "mixed"
    times[kind].append(((c1 - c0 + c3 - c2) * 1e3, (t1 - t0 + t3 - t2) * 1e3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--policy", choices=STEP_POLICIES, action="append")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"scheduler CPU time per step (next_batch + on_result), {RUNNING} running, {WAITING} waiting, page_size {PAGE_SIZE}")
    print(f"{'policy':<14} {'step':<8} {'steps':>6} {'cpu mean':>9} {'cpu p50':>8} {'cpu p99':>8} {'wall p50':>9}  (ms)")
    for policy in args.policy or STEP_POLICIES:
        for kind, ms in bench(policy, args.steps, args.seed).items():
            if ms:
                cpu, wall = np.array(ms).T
                print(f"{policy:<14} {kind:<8} {len(cpu):>6} {cpu.mean():>9.3f} {np.percentile(cpu, 50):>8.3f} "
                      f"{np.percentile(cpu, 99):>8.3f} {np.percentile(wall, 50):>9.3f}")


if __name__ == "__main__":
    main()
