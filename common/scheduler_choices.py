"""The names the scheduler's policies answer to, declared once: the flags table (server_flags.py) offers them and
the scheduler's owners (scheduler_proc/step_policy.py, admission_policy.py, kv_reservation.py, the grammar
backend in scheduler_process.py) check against them. Torch-free, so the launcher reads them without the scheduler."""

from __future__ import annotations

STEP_POLICIES = ("prefill-first", "decode-first", "mixed")  # --step-policy: what a step runs
ADMISSION_POLICIES = ("fifo", "pack")  # --admission-policy: the order waiting requests are admitted in
KV_RESERVATIONS = ("estimated", "full")  # --kv-reservation: how much KV a running request holds back
GRAMMAR_BACKENDS = ("xgrammar", "none")  # --grammar-backend: structured output through xgrammar, or refused
