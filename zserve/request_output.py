"""vLLM's result shapes for zserve.LLM: a RequestOutput per prompt holding a CompletionOutput per choice, made
from the clients' GenerateResults (client/types.py).

What zserve does not report is None: `stop_reason` (which stop string or id matched), a chosen token's
`rank` when it is not among the top logprobs asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zserve.client.types import GenerateResult


@dataclass(frozen=True, slots=True)
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = the most likely
    decoded_token: str | None = None


# per position: token id -> its Logprob (the chosen token and the most likely ones)
PositionLogprobs = dict[int, Logprob]


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None  # with logprobs asked for: the sum of the chosen tokens'
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None  # "stop", "length" or "abort"
    stop_reason: int | str | None = None  # not reported: None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool = True
    num_cached_tokens: int = 0
    results: list[GenerateResult] = field(default_factory=list, repr=False)  # zserve's own, one per choice


def request_output(prompt: str | None, prompt_ids: list[int], results: list[GenerateResult]) -> RequestOutput:
    """One prompt's RequestOutput from its choices' results (choice i at results[i])."""
    first = results[0]
    prompt_logprobs = None
    if first.prompt_logprobs is not None:
        num = len(first.prompt_logprobs)
        prompt_logprobs = [
            None if lp is None else _position(tid, lp, top, text, texts_of_top)
            for tid, lp, top, text, texts_of_top in zip(
                first.prompt_ids or prompt_ids, first.prompt_logprobs, _or_nones(first.prompt_top_logprobs, num),
                _or_nones(first.prompt_token_texts, num), _or_nones(first.prompt_top_logprob_texts, num),
                strict=False,
            )
        ]
    return RequestOutput(
        request_id=str(first.req_id), prompt=prompt, prompt_token_ids=prompt_ids, prompt_logprobs=prompt_logprobs,
        outputs=[_completion(i, r) for i, r in enumerate(results)],
        finished=all(r.finish_reason is not None for r in results),
        num_cached_tokens=first.usage.cached_tokens, results=results,
    )


def _completion(index: int, r: GenerateResult) -> CompletionOutput:
    logprobs = None
    if r.logprobs is not None:
        num = len(r.logprobs)
        logprobs = [
            _position(tid, lp, top, text, texts_of_top)
            for tid, lp, top, text, texts_of_top in zip(
                r.output_ids, r.logprobs, _or_nones(r.top_logprobs, num), _or_nones(r.token_texts, num),
                _or_nones(r.top_logprob_texts, num), strict=False,
            )
        ]
    return CompletionOutput(
        index=index, text=r.text, token_ids=list(r.output_ids),
        cumulative_logprob=None if r.logprobs is None else sum(r.logprobs), logprobs=logprobs,
        finish_reason=r.finish_reason,
    )


def _position(
    token_id: int, logprob: float, top: list[tuple[int, float]] | None, text: str | None,
    texts_of_top: list[str] | None,
) -> PositionLogprobs:
    """The chosen token's Logprob and the most likely tokens' (their rank is their place, from 1)."""
    top = top or []
    texts_of_top = texts_of_top or [None] * len(top)
    out = {tid: Logprob(lp, rank, t) for rank, ((tid, lp), t) in enumerate(zip(top, texts_of_top, strict=False), 1)}
    if token_id not in out:
        out = {token_id: Logprob(logprob, None, text), **out}
    return out


def _or_nones(values: list | None, num: int) -> list:
    return values if values is not None else [None] * num
