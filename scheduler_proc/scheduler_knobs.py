"""The Scheduler's policy knobs, from the one frozen server config (the one source of their defaults).

    Scheduler(num_pages=..., page_size=..., context_len=..., eos_token_ids=..., **scheduler_knobs(cfg))

The sizes (pages, page size, context, EOS ids) are the model worker's to say; everything else
the scheduler decides by comes from `ServerConfig`, so tests and benchmarks that build a
Scheduler from `ServerConfig()` run the policy the server runs by default.
"""

from __future__ import annotations

from typing import Any

from zserve.common.server_config import ServerConfig
from zserve.common.speculative_settings import SpeculativeSettings


def scheduler_knobs(cfg: ServerConfig) -> dict[str, Any]:
    spec = SpeculativeSettings.of(cfg)  # --speculative-config folded in (the launcher already did)
    return {
        "max_running_requests": cfg.max_running_requests,
        "max_prefill_tokens": cfg.max_prefill_tokens,
        "schedule_policy": cfg.schedule_policy,
        "admission_policy": cfg.admission_policy,
        "admission_lookahead": cfg.admission_lookahead,
        "force_fifo_every": cfg.force_fifo_every,
        "enable_radix_cache": not cfg.disable_radix_cache,
        "max_queued_requests": cfg.max_queued_requests,
        "kv_reservation": cfg.kv_reservation,
        "schedule_conservativeness": cfg.schedule_conservativeness,
        "prefill_max_requests": cfg.prefill_max_requests,
        "seed": cfg.seed,
        "speculative_algorithm": spec.algorithm,
        "speculative_num_draft_tokens": spec.num_draft_tokens,
        "speculative_ngram_min_window": spec.min_window,
        "speculative_ngram_max_window": spec.max_window,
        "speculative_disable_by_batch_size": spec.disable_by_batch_size,
    }
