"""The names the scheduler's policies answer to, declared once: the flags table (server_flags.py) offers them and
the scheduler's owners (scheduler_proc/step_policy.py, admission_policy.py, kv_reservation.py, the grammar
backend in scheduler_process.py) check against them. Torch-free, so the launcher reads them without the scheduler."""

from __future__ import annotations

STEP_POLICIES = ("prefill-first", "decode-first", "mixed")  # --step-policy: what a step runs
ADMISSION_POLICIES = ("fifo", "pack")  # --admission-policy: the order waiting requests are admitted in
KV_RESERVATIONS = ("estimated", "full")  # --kv-reservation: how much KV a running request holds back
GRAMMAR_BACKENDS = ("xgrammar", "none")  # --grammar-backend: structured output through xgrammar, or refused
OVERLAP_SCHEDULES = ("auto", "on", "off")  # --overlap-schedule: build step N+1 while step N runs (auto: on CUDA)


def overlap_schedule_for(setting: str, device_type: str) -> str:
    """--overlap-schedule resolved for the worker's device: on or off. Auto is on where the worker computes on CUDA
    (its step is short: the scheduler's turn would be a large share) and off on a CPU, where the scheduler's turn
    beside the step takes a core from the worker's threads (BENCHMARKS.md, section 31)."""
    if setting not in OVERLAP_SCHEDULES:
        raise ValueError(f"overlap schedule must be one of {OVERLAP_SCHEDULES}, got {setting!r}")
    if setting != "auto":
        return setting
    return "on" if device_type == "cuda" else "off"
