"""SchedulerKnobs: the Scheduler's policy knobs, from the one frozen server config (the one source
of their defaults).

    Scheduler(num_pages=..., page_size=..., context_len=..., eos_token_ids=..., knobs=scheduler_knobs(cfg))

The sizes (pages, page size, context, EOS ids) are the model worker's to say; everything else
the scheduler decides by comes from `ServerConfig`, so tests and benchmarks that build a
Scheduler from `ServerConfig()` run the policy the server runs by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from zserve.common.lora_modules import lora_names
from zserve.common.server_config import ServerConfig
from zserve.common.speculative_settings import SpeculativeSettings

# the flat names of the speculative knobs (as the Scheduler took them once, and tests still name
# them), each with its SpeculativeSettings field
SPECULATIVE_KNOBS = {
    "speculative_algorithm": "algorithm",
    "speculative_num_draft_tokens": "num_draft_tokens",
    "speculative_ngram_min_window": "min_window",
    "speculative_ngram_max_window": "max_window",
    "speculative_disable_by_batch_size": "disable_by_batch_size",
}


@dataclass(frozen=True)
class SchedulerKnobs:
    max_running_requests: int
    max_prefill_tokens: int  # a step's token budget
    max_step_ms: float  # StepTimeBound: 0 auto, < 0 (-1) no bound
    schedule_policy: str  # StepPolicy
    admission_policy: str  # AdmissionPolicy
    admission_lookahead: int
    force_fifo_every: int
    enable_radix_cache: bool
    overlap_schedule: str  # OverlapRows (build step N+1 while step N runs): on, off, or auto until the worker says
    max_queued_requests: int
    kv_reservation: str  # KvReservation
    schedule_conservativeness: float
    prefill_max_requests: int  # 0: no cap
    seed: int
    speculative: SpeculativeSettings  # algorithm "none": speculative decoding is off
    lora_names: tuple[str, ...] = ()  # the LoRA adapters requests may name, by index (--lora-modules)

    def __post_init__(self) -> None:
        for name in ("max_running_requests", "max_prefill_tokens", "max_queued_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prefill_max_requests < 0:
            raise ValueError(f"prefill_max_requests must be >= 0 (0 = no cap), got {self.prefill_max_requests}")

    def __getitem__(self, name: str):
        """A knob by its flat name (`knobs["speculative_algorithm"]` too, see SPECULATIVE_KNOBS)."""
        if name in SPECULATIVE_KNOBS:
            return getattr(self.speculative, SPECULATIVE_KNOBS[name])
        return getattr(self, name)


def scheduler_knobs(cfg: ServerConfig) -> SchedulerKnobs:
    return SchedulerKnobs(
        max_running_requests=cfg.max_running_requests,
        max_prefill_tokens=cfg.max_prefill_tokens,
        max_step_ms=cfg.max_step_ms,
        schedule_policy=cfg.schedule_policy,
        admission_policy=cfg.admission_policy,
        admission_lookahead=cfg.admission_lookahead,
        force_fifo_every=cfg.force_fifo_every,
        enable_radix_cache=not cfg.disable_radix_cache,
        overlap_schedule=cfg.overlap_schedule,
        max_queued_requests=cfg.max_queued_requests,
        kv_reservation=cfg.kv_reservation,
        schedule_conservativeness=cfg.schedule_conservativeness,
        prefill_max_requests=cfg.prefill_max_requests,
        seed=cfg.seed,
        speculative=SpeculativeSettings.of(cfg),  # --speculative-config folded in (the launcher already did)
        lora_names=lora_names(cfg.enable_lora, cfg.lora_modules),
    )
