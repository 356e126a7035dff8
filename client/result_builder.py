"""Folds a request's streamed ReqOutputs into a GenerateResult (shared by both clients)."""

from __future__ import annotations

import time

import numpy as np

from zserve.client.types import GenerateResult, Usage, raise_for_error
from zserve.common.messages import ReqOutput


class ResultBuilder:
    def __init__(self, req_id: int, sent_s: float | None = None):
        """`sent_s`: time.perf_counter() when the request was sent (default: now)."""
        self.sent_s = time.perf_counter() if sent_s is None else sent_s
        self.result = GenerateResult(req_id)

    def add(self, out: ReqOutput, arrived_s: float | None = None) -> str:
        """Fold in one output (received at perf_counter `arrived_s`, default now); returns its
        text delta. Raises ServerError for an error outcome."""
        raise_for_error(out)
        r = self.result
        now_s = (time.perf_counter() if arrived_s is None else arrived_s) - self.sent_s
        if out.text and r.ttft_s is None:
            r.ttft_s = now_s
        r.text += out.text
        r.output_ids.extend(out.token_ids.tolist())
        if out.logprobs is not None:
            r.logprobs = (r.logprobs or []) + list(out.logprobs)
        if out.token_texts is not None:
            r.token_texts = (r.token_texts or []) + out.token_texts
        if out.top_logprob_ids is not None and out.top_logprobs is not None and len(out.token_ids):
            k = len(out.top_logprob_ids) // len(out.token_ids)
            pairs = list(zip(out.top_logprob_ids, out.top_logprobs, strict=True))
            r.top_logprobs = (r.top_logprobs or []) + per_token(pairs, k, len(out.token_ids))
            if out.top_logprob_texts is not None:
                r.top_logprob_texts = (
                    (r.top_logprob_texts or []) + per_token(out.top_logprob_texts, k, len(out.token_ids))
                )
        if out.prompt is not None:  # the first token's output: the prompt's logprobs (none for its first token)
            p = out.prompt
            r.prompt_ids = p.token_ids.tolist()
            r.prompt_logprobs = [None, *p.logprobs.tolist()]
            r.prompt_token_texts = p.token_texts
            if len(p.top_ids):
                k = len(p.top_ids) // len(p.logprobs)
                pairs = list(zip(p.top_ids.tolist(), p.top_logprobs.tolist(), strict=True))
                r.prompt_top_logprobs = [None, *per_token(pairs, k, len(p.logprobs))]
                if p.top_texts is not None:
                    r.prompt_top_logprob_texts = [None, *per_token(p.top_texts, k, len(p.logprobs))]
        if out.prompt_text is not None:
            r.prompt_text = out.prompt_text
        if out.embedding is not None:
            r.embedding = np.array(out.embedding, np.float32)  # a copy: the frame's bytes are read-only
        r.usage = Usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens)
        if out.finish_reason is not None:
            r.finish_reason = out.finish_reason.text
            r.latency_s = now_s
            if r.ttft_s is None:
                r.ttft_s = now_s
        return out.text

    @property
    def done(self) -> bool:
        return self.result.finish_reason is not None


def per_token(flat: list, k: int, num_tokens: int) -> list[list]:
    """`flat`, K items per token one token after another, as one list per token."""
    return [flat[j * k : (j + 1) * k] for j in range(num_tokens)]
