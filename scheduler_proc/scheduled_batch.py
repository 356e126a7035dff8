"""ScheduledBatch: the step the worker is running, as the scheduler remembers it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zserve.common.forward_batch import ForwardBatch, PromptLogprobRows
from zserve.common.lora_modules import NO_ADAPTER
from zserve.scheduler_proc.penalty_batch import penalty_arrays
from zserve.scheduler_proc.req import Req
from zserve.scheduler_proc.req_table import ReqTable


@dataclass(slots=True)
class ScheduledBatch:
    """Decode requests first (their last token and its drafts, if any; always sampled), then prefill requests (a chunk
    each; sampled unless prompt is left after it): `reqs[i]` is ForwardBatch and StepResult row i.
    Pages for this step are already allocated. A prefill request may take its K/V from an earlier
    one with the same prompt (`prefill_kv_source`, an index into `prefill_reqs`): the worker
    copies that one's K/V and logits instead of computing it (see ForwardBatch)."""

    step_id: int
    decode_reqs: list[Req]
    prefill_reqs: list[Req]
    prefill_extend_lens: list[int]
    prefill_kv_source: list[int | None]
    prefill_is_sampled: list[bool] = field(init=False)  # False for the ChunkedReq, if any
    num_draft_tokens: int = field(init=False)  # the decode requests' speculative drafts (Req.drafts), in all

    def __post_init__(self) -> None:
        self.num_draft_tokens = sum(len(r.drafts) for r in self.decode_reqs)
        self.prefill_is_sampled = [
            r.cached_len + n == r.num_prompt_tokens
            for r, n in zip(self.prefill_reqs, self.prefill_extend_lens, strict=True)
        ]

    @property
    def num_prefilled_tokens(self) -> int:
        """Prompt tokens computed by this step (a KV-sharing request's are not)."""
        return sum(
            n for n, source in zip(self.prefill_extend_lens, self.prefill_kv_source, strict=True) if source is None
        )

    @property
    def reqs(self) -> list[Req]:
        return self.decode_reqs + self.prefill_reqs

    def sampled_req_ids(self) -> list[int | None]:
        """Per row: the req_id of a request that gets a token this step, None for one that does not."""
        prefilled = [
            r.req_id if sampled else None for r, sampled in zip(self.prefill_reqs, self.prefill_is_sampled, strict=True)
        ]
        return [r.req_id for r in self.decode_reqs] + prefilled

    def to_forward_batch(self, req_table: ReqTable) -> ForwardBatch:
        """Arrays in batch order: one pass over the requests per field, never one per token."""
        reqs = self.reqs
        n = len(reqs)
        num_decode = len(self.decode_reqs)
        extend_lens = np.ones(n, np.int32)
        draft_lens = None
        if self.num_draft_tokens:  # speculative decoding: each decode row's last token, then its drafts
            ids: list[int] = []
            for r in self.decode_reqs:
                ids.append(r.output_ids[-1])
                ids.extend(r.drafts)
            input_ids = np.array(ids, np.int32)
            draft_lens = np.zeros(n, np.int32)
            draft_lens[:num_decode] = [len(r.drafts) for r in self.decode_reqs]
            extend_lens += draft_lens
        else:
            input_ids = np.fromiter((r.output_ids[-1] for r in self.decode_reqs), np.int32, num_decode)
        is_sampled = np.ones(n, np.bool_)
        kv_source = None
        if self.prefill_reqs:
            chunks = [
                r.input_ids[r.cached_len : r.cached_len + e]
                for r, e, source in zip(
                    self.prefill_reqs, self.prefill_extend_lens, self.prefill_kv_source, strict=True
                )
                if source is None
            ]
            input_ids = np.concatenate([input_ids, *chunks])
            extend_lens[num_decode:] = self.prefill_extend_lens
            is_sampled[num_decode:] = self.prefill_is_sampled
            if any(source is not None for source in self.prefill_kv_source):
                kv_source = np.arange(n, dtype=np.int32)
                kv_source[num_decode:] = [
                    num_decode + (i if source is None else source) for i, source in enumerate(self.prefill_kv_source)
                ]
        sampling, return_logprob = req_table.sampling_columns(np.fromiter((r.row_idx for r in reqs), np.intp, n))
        return ForwardBatch(
            step_id=self.step_id,
            input_ids=input_ids,
            cached_lens=np.fromiter((r.cached_len for r in reqs), np.int32, n),
            extend_lens=extend_lens,
            page_ids=np.concatenate([r.page_table[: r.num_pages] for r in reqs]),
            num_pages=np.fromiter((r.num_pages for r in reqs), np.int32, n),
            is_sampled=is_sampled,
            return_logprob=return_logprob,
            sampling=sampling,
            kv_source=kv_source,
            penalties=penalty_arrays(reqs, is_sampled),
            top_logprobs=_top_logprobs(reqs),
            prompt_logprobs=self.prompt_logprob_rows(),
            draft_lens=draft_lens,
            lora_ids=_lora_ids(reqs),
        )

    def prompt_logprob_rows(self) -> PromptLogprobRows | None:
        """The prefill rows scoring their prompt this step (echo); None when none does."""
        asking = [(i, r) for i, r in enumerate(self.prefill_reqs) if r.prompt_scores is not None]
        if not asking:
            return None
        num_decode = len(self.decode_reqs)
        next_ids = []
        for i, r in asking:
            assert self.prefill_kv_source[i] is None, "a request scoring its prompt computes it: it has no KV source"
            end = r.cached_len + self.prefill_extend_lens[i]
            next_ids.append(int(r.input_ids[end]) if end < r.num_prompt_tokens else -1)
        return PromptLogprobRows(
            rows=np.array([num_decode + i for i, _ in asking], np.int32), next_ids=np.array(next_ids, np.int32),
            num_top=max(r.prompt_scores.num_top for _, r in asking),
        )


def _lora_ids(reqs: list[Req]) -> np.ndarray | None:
    """Each row's LoRA adapter (-1 none); None when no row has one (a server without adapters: no extra work)."""
    ids = np.fromiter((r.lora_idx for r in reqs), np.int32, len(reqs))
    return ids if (ids != NO_ADAPTER).any() else None


def _top_logprobs(reqs: list[Req]) -> np.ndarray | None:
    """How many most likely tokens each request reports; None when none asks (the usual batch)."""
    top = np.fromiter((r.params.top_logprobs for r in reqs), np.int32, len(reqs))
    return top if top.any() else None
