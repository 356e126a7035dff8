"""Logprobs in the OpenAI response shapes, from a result's token ids, logprobs and top logprobs.

    chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
                  "refusal": None}
    completions: {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}] | None,
                  "text_offset": [...]}

A token's text is its own decoding (a byte-level piece of a character shows as U+FFFD, and its
`bytes` say what it is). Logprobs are the model's own (raw) distribution, as vLLM reports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TokenText = Callable[[int], str]


def chat_logprobs(
    ids: list[int], logprobs: list[float], tops: list[list[tuple[int, float]]] | None, token_text: TokenText,
) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace"))}

    content = []
    for j, (token_id, logprob) in enumerate(zip(ids, logprobs, strict=True)):
        item = entry(token_id, logprob)
        item["top_logprobs"] = [entry(t, lp) for t, lp in tops[j]] if tops else []
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(
    ids: list[int], logprobs: list[float | None], tops: list[list[tuple[int, float]] | None] | None, token_text: TokenText,
    text_offset: int = 0,
) -> dict[str, Any]:
    """(An echoed prompt's first token has None for its logprob and its top logprobs, as in OpenAI's API.)"""
    tokens = [token_text(t) for t in ids]
    offsets = []
    for text in tokens:
        offsets.append(text_offset)
        text_offset += len(text)
    top = [None if tops[j] is None else {token_text(t): lp for t, lp in tops[j]} for j in range(len(ids))] if tops else None
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": top, "text_offset": offsets}


def joined_completion_logprobs(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """An echoed prompt's logprobs followed by the completion's (both with or both without top logprobs)."""
    top = None if first["top_logprobs"] is None and second["top_logprobs"] is None else \
        (first["top_logprobs"] or [None] * len(first["tokens"])) + (second["top_logprobs"] or [None] * len(second["tokens"]))
    return {key: first[key] + second[key] for key in ("tokens", "token_logprobs", "text_offset")} | {"top_logprobs": top}
