"""ScheduledBatch: the step the worker is running, as the scheduler remembers it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from common.forward_batch import ForwardBatch, SamplingArrays
from scheduler_proc.req import Req


@dataclass(slots=True)
class ScheduledBatch:
    """Decode requests first (one token each, always sampled), then prefill requests (a chunk
    each; sampled unless prompt is left after it). Pages for this step are already allocated."""

    step_id: int
    decode_reqs: list[Req]
    prefill_reqs: list[Req]
    prefill_extend_lens: list[int]
    prefill_is_sampled: list[bool] = field(init=False)  # False for the ChunkedReq, if any

    def __post_init__(self) -> None:
        self.prefill_is_sampled = [
            r.cached_len + n == r.num_prompt_tokens for r, n in zip(self.prefill_reqs, self.prefill_extend_lens, strict=True)
        ]

    @property
    def reqs(self) -> list[Req]:
        return self.decode_reqs + self.prefill_reqs

    @property
    def extend_lens(self) -> list[int]:
        return [1] * len(self.decode_reqs) + self.prefill_extend_lens

    @property
    def is_sampled(self) -> list[bool]:
        return [True] * len(self.decode_reqs) + self.prefill_is_sampled

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.prefill_extend_lens)

    def to_forward_batch(self) -> ForwardBatch:
        """Arrays in batch order; per-request Python work is one pass per field, never per token."""
        reqs = self.reqs
        n = len(reqs)
        num_decode = len(self.decode_reqs)
        decode_ids = np.fromiter((r.output_ids[-1] for r in self.decode_reqs), np.int32, num_decode)
        prefill_ids = [r.input_ids[r.cached_len : r.cached_len + e] for r, e in zip(self.prefill_reqs, self.prefill_extend_lens, strict=True)]
        num_pages = np.fromiter((r.num_pages for r in reqs), np.int32, n)
        params = [r.params for r in reqs]
        return ForwardBatch(
            step_id=self.step_id,
            input_ids=np.concatenate([decode_ids, *prefill_ids]) if prefill_ids else decode_ids,
            cached_lens=np.fromiter((r.cached_len for r in reqs), np.int32, n),
            extend_lens=np.array(self.extend_lens, np.int32),
            page_ids=np.concatenate([r.page_table[: r.num_pages] for r in reqs]),
            num_pages=num_pages,
            is_sampled=np.array(self.is_sampled, np.bool_),
            return_logprob=np.fromiter((p.return_logprob for p in params), np.bool_, n),
            sampling=SamplingArrays(
                temperature=np.fromiter((p.temperature for p in params), np.float32, n),
                top_k=np.fromiter((p.top_k for p in params), np.int32, n),
                top_p=np.fromiter((p.top_p for p in params), np.float32, n),
                min_p=np.fromiter((p.min_p for p in params), np.float32, n),
                seed=np.fromiter((r.seed for r in reqs), np.int64, n),
            ),
        )
