"""SchedulerStats: a snapshot of the scheduler's gauges and running totals.

The scheduler owns and updates it; StatsOut carries a copy to whoever asked (`Client.stats()`,
`/metrics`), so it is a wire message (nested, no tag)."""

from __future__ import annotations

from zserve.common.wire import Message


class SchedulerStats(Message):
    # gauges, now
    num_waiting: int = 0  # queued, not admitted
    num_prefilling: int = 0  # admitted with prompt left (a ChunkedReq between chunks)
    num_running: int = 0  # prefilled and generating
    num_free_pages: int = 0
    num_cached_pages: int = 0  # held by the radix cache (locked or evictable)
    num_evictable_pages: int = 0  # cached and unlocked: reclaimable on demand
    num_used_pages: int = 0  # owned by live requests, outside the cache
    num_reserved_pages: int = 0  # promised to admitted requests, not yet allocated (see KvReservation)
    new_token_ratio: float = 0.0  # the share of remaining output the estimated KV reservation counts
    prefill_chunk_tokens: int = 0  # the last prefill chunk --max-step-ms allowed beside decodes (0: none bounded yet)
    # totals since start
    num_steps: int = 0
    num_submitted: int = 0
    num_finished: int = 0  # "stop" or "length"
    num_aborted: int = 0
    num_refused: int = 0  # finished with "error" at submit (busy, can never fit, bad input)
    num_retracted: int = 0  # retractions: a running request sent back to the queue to free KV (estimated reservation)
    num_running_peak: int = 0  # the most requests running at once
    num_overlapped_steps: int = 0  # steps sent while the one before was with the worker (--enable-overlap-schedule)
    num_prompt_tokens: int = 0  # prompt tokens of admitted requests (a retracted one's prompt + output, again)
    num_prefix_hit_tokens: int = 0  # of those, served by the radix cache
    num_prefilled_tokens: int = 0  # prompt tokens computed (chunks included)
    num_decoded_tokens: int = 0  # tokens computed by decode (one per running request per step)
    num_generated_tokens: int = 0  # tokens sampled and sent
    step_wait_s: float = 0.0  # seconds the process loop waited for the model worker's results (sent -> received)
    # seconds from a result to the next batch sent, between back-to-back steps (the worker idles)
    schedule_s: float = 0.0
    # of step_wait_s, seconds rank 0 spent in ModelRunner.run (StepResult.forward_ms); the rest is the hops and the
    # worker's loop
    worker_forward_s: float = 0.0
    # speculative decoding (--speculative-algorithm ngram); all 0 when off
    num_drafts: int = 0  # decode rows that carried drafts (one per request per step)
    num_draft_tokens: int = 0  # draft tokens the worker verified
    num_accepted_tokens: int = 0  # of those, accepted (each is a token generated without a step of its own)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a drafted row gains per step: 1 + accepted drafts per drafted row (vLLM's mean
        acceptance length; 0 before any draft)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0
