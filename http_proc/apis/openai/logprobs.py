"""Logprobs in the OpenAI response shapes, from a result's token texts, logprobs and top logprobs.

    chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
                  "refusal": None}
    completions: {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}] | None,
                  "text_offset": [...]}

A token's text is its own decoding, attached by the detokenizer (a byte-level piece of a character
shows as U+FFFD, and its `bytes` say what it is). Logprobs are the model's own (raw) distribution,
as vLLM reports them.
"""

from __future__ import annotations

from typing import Any

TextLogprobs = list[tuple[str, float]]  # one position's top tokens: (text, logprob), most likely first


def with_texts(pairs: list[tuple[int, float]] | None, texts: list[str] | None) -> TextLogprobs | None:
    """One position's (token id, logprob) pairs as (text, logprob): the ids' texts come from the server."""
    if pairs is None:
        return None
    return [(text, logprob) for text, (_, logprob) in zip(texts or [], pairs, strict=True)]


def chat_logprobs(tokens: list[str], logprobs: list[float], tops: list[TextLogprobs] | None) -> dict[str, Any]:
    def entry(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace"))}

    content = []
    for j, (text, logprob) in enumerate(zip(tokens, logprobs, strict=True)):
        item = entry(text, logprob)
        item["top_logprobs"] = [entry(t, lp) for t, lp in tops[j]] if tops else []
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(
    tokens: list[str], logprobs: list[float | None], tops: list[TextLogprobs | None] | None, text_offset: int = 0,
) -> dict[str, Any]:
    """(An echoed prompt's first token has None for its logprob and its top logprobs, as in OpenAI's API.)"""
    offsets = []
    for text in tokens:
        offsets.append(text_offset)
        text_offset += len(text)
    top = [None if tops[j] is None else dict(tops[j]) for j in range(len(tokens))] if tops else None
    return {"tokens": list(tokens), "token_logprobs": list(logprobs), "top_logprobs": top, "text_offset": offsets}


def joined_completion_logprobs(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """An echoed prompt's logprobs followed by the completion's (both with or both without top logprobs)."""
    top = None if first["top_logprobs"] is None and second["top_logprobs"] is None else (
        (first["top_logprobs"] or [None] * len(first["tokens"]))
        + (second["top_logprobs"] or [None] * len(second["tokens"]))
    )
    joined = {key: first[key] + second[key] for key in ("tokens", "token_logprobs", "text_offset")}
    return joined | {"top_logprobs": top}
