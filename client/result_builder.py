"""Folds a request's streamed ReqOutputs into a GenerateResult (shared by both clients)."""

from __future__ import annotations

import time

from client.types import GenerateResult, Usage, raise_for_error
from common.messages import ReqOutput, bytes_to_ids


class ResultBuilder:
    def __init__(self, req_id: int):
        self.sent_s = time.perf_counter()
        self.result = GenerateResult(req_id)

    def add(self, out: ReqOutput) -> str:
        """Fold in one output; returns its text delta. Raises ServerError for an error outcome."""
        raise_for_error(out.req_id, out.finish_reason, out.error)
        r = self.result
        now_s = time.perf_counter() - self.sent_s
        if out.text and r.ttft_s is None:
            r.ttft_s = now_s
        r.text += out.text
        r.output_ids.extend(bytes_to_ids(out.token_ids))
        if out.logprobs is not None:
            r.logprobs = (r.logprobs or []) + list(out.logprobs)
        r.usage = Usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens)
        if out.max_tokens_clamped_to is not None:
            r.max_tokens_clamped_to = out.max_tokens_clamped_to
        if out.finish_reason is not None:
            r.finish_reason = out.finish_reason
            r.latency_s = now_s
            if r.ttft_s is None:
                r.ttft_s = now_s
        return out.text

    @property
    def done(self) -> bool:
        return self.result.finish_reason is not None
