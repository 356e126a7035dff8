"""StepOutputs: the TokenOut records one StepResult gives, and the prompt logprobs it carries.

The Scheduler decides what happens to each request of the step (append its token, finish,
cache, free); this file owns how the worker's arrays become the requests' updates. StepResult's
per-token arrays have one entry per row of the batch, decode requests first:

    row           0 ... num_decode-1 | num_decode ... num_reqs-1
    requests      batch.decode_reqs  | batch.prefill_reqs (the ChunkedReq's row holds NO_TOKEN)

A decode row that carried speculative drafts gives its accepted drafts and then its row's token,
in one update: TokenOut.token_ids holds every new token of the step.

Prompt logprobs (echo) instead come per scored prompt position, row after row of
`ForwardBatch.prompt_logprobs.rows` (batch rows): `gather_prompt_scores` hands each request its
slice, and its first sampled token's update carries them all (`take_prompt_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zserve.common.finish_reason import FinishReason
from zserve.common.forward_batch import StepResult
from zserve.common.messages import PromptLogprobs, TokenOut
from zserve.scheduler_proc.req import Req
from zserve.scheduler_proc.scheduled_batch import ScheduledBatch


@dataclass(slots=True)
class TopLogprobRows:
    """A step's top logprobs (StepResult.top_ids / top_logprobs: K per row)."""

    num_top: int
    ids: np.ndarray | None  # int32[num_reqs, K]
    values: np.ndarray | None

    @staticmethod
    def of(result: StepResult) -> TopLogprobRows:
        if not result.num_top or result.top_ids is None or result.top_logprobs is None:
            return TopLogprobRows(0, None, None)
        k = result.num_top
        return TopLogprobRows(k, result.top_ids.reshape(-1, k), result.top_logprobs.reshape(-1, k))

    def fields(self, row: int, k: int) -> dict:
        """TokenOut's top_logprob_ids / top_logprobs for the request at `row`, which asked for k."""
        if not k or self.ids is None:
            return {}
        return {"top_logprob_ids": self.ids[row, :k].tolist(), "top_logprobs": self.values[row, :k].tolist()}


@dataclass(slots=True)
class StepOutputs:
    """The updates of one step, appended in the order the Scheduler takes its requests in."""

    token_ids: np.ndarray  # int32[num_reqs]: StepResult.next_token_ids; an update gets a 1-token view
    token_id_list: list[int]  # the same, as ints (what a request's output_ids holds)
    logprobs: list[float]  # [num_reqs]; NaN where the request did not ask
    top: TopLogprobRows
    updates: list[TokenOut] = field(default_factory=list)
    num_extra_tokens: int = 0  # tokens beyond one per update (accepted speculative drafts)

    @staticmethod
    def of(result: StepResult) -> StepOutputs:
        token_ids = result.next_token_ids
        return StepOutputs(token_ids, token_ids.tolist(), result.logprobs.tolist(), TopLogprobRows.of(result))

    def __len__(self) -> int:
        """Rows of the step: one token each (NO_TOKEN where not sampled)."""
        return len(self.token_ids)

    def add(
        self, req: Req, row: int, finish_reason: FinishReason | None, prompt: PromptLogprobs | None = None,
        token_ids: list[int] | None = None,
    ) -> None:
        """The update of `req`, whose new tokens are already appended to its output: the token at
        `row`, or (`token_ids`) a drafted row's accepted drafts and next token (no logprobs asked)."""
        params = req.params
        if token_ids is None:
            ids = self.token_ids[row : row + 1]
        else:
            ids = np.array(token_ids, np.int32)
            self.num_extra_tokens += len(token_ids) - 1
        self.updates.append(TokenOut(
            req_id=req.req_id, token_ids=ids, finish_reason=finish_reason, num_cached_tokens=req.num_cached_tokens,
            logprobs=[self.logprobs[row]] if params.return_logprob else None,
            **self.top.fields(row, params.top_logprobs), prompt=prompt,
        ))


def gather_prompt_scores(batch: ScheduledBatch, result: StepResult) -> None:
    """Hand each request scoring its prompt its slice of the step's prompt logprobs."""
    asked = batch.prompt_logprob_rows()
    assert asked is not None, f"step {batch.step_id}: prompt logprobs for a batch that asked none"
    extend_lens = np.array([1] * len(batch.decode_reqs) + batch.prefill_extend_lens, np.int64)
    k = asked.num_top
    offset = 0
    for row, num in zip(asked.rows.tolist(), asked.num_scored(extend_lens).tolist(), strict=True):
        req = batch.reqs[row]
        lo, hi = offset, offset + num
        offset = hi
        num_top = req.prompt_scores.num_top
        tops = (result.prompt_top_ids.reshape(-1, k)[lo:hi, :num_top].reshape(-1),
                result.prompt_top_logprobs.reshape(-1, k)[lo:hi, :num_top].reshape(-1)) if k else (None, None)
        req.prompt_scores.add(result.prompt_logprobs[lo:hi], *tops)
    assert offset == len(result.prompt_logprobs), (
        f"step {batch.step_id}: {len(result.prompt_logprobs)} prompt logprobs for {offset}"
    )


def take_prompt_logprobs(req: Req) -> PromptLogprobs | None:
    """The prompt's logprobs, which go with the request's first sampled token, once; None when
    it did not ask (or they are sent)."""
    if req.prompt_scores is None:
        return None
    prompt, req.prompt_scores = req.prompt_scores.message(req.input_ids[: req.num_orig_prompt_tokens]), None
    return prompt
