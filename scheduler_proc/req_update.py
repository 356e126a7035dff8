"""ReqUpdate: what happened to one request in one step, for the detokenizer."""

from __future__ import annotations

from dataclasses import dataclass

FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(slots=True)
class ReqUpdate:
    """One per request per step in which something happened to it. A request's last update is
    the only one with `finish_reason` set, and nothing follows it.

    finish_reason: "stop" (an EOS id or a stop token id; that token is the update's last new
    token), "length" (max_tokens, or the context limit), "abort", or "error" (with `error`).
    """

    req_id: int
    new_token_ids: list[int]
    finish_reason: str | None
    error: str | None
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the radix cache
    logprobs: list[float] | None  # one per new token, when the request asked
    max_tokens_clamped_to: int | None = None  # set on the first update when max_tokens was clamped
