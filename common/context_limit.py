"""The context limit the server applies: the model's maximum, or less with `--context-length`.

prompt + output must fit in it. The tokenizer, the scheduler and the HTTP server all take it
from here, so they agree; the model worker reports the model's maximum (`WorkerReady`).
"""

from __future__ import annotations


def served_context_len(model_context_len: int, context_length: int) -> int:
    """`context_length` is the flag's value: 0 means the model's maximum."""
    return min(model_context_len, context_length) if context_length > 0 else model_context_len


def context_length_error(context_length: int, model_context_len: int) -> str | None:
    """Why `--context-length` cannot be used with this model, or None."""
    if context_length < 0:
        return f"--context-length must be >= 0 (0 = the model's maximum, {model_context_len}), got {context_length}"
    if context_length > model_context_len:
        return (
            f"--context-length {context_length} is above the model's maximum context length of "
            f"{model_context_len} tokens"
        )
    if context_length == 1:
        return "--context-length 1 leaves no room for a prompt and an output token"
    return None


def over_context_error(context_len: int, num_prompt_tokens: int, max_tokens: int, prompt_word: str = "prompt") -> str:
    """A request's prompt + max_tokens beyond the context, in vLLM's words."""
    return (
        f"This model's maximum context length is {context_len} tokens. However, you requested "
        f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the {prompt_word}, {max_tokens} in the "
        f"completion). Please reduce the length of the {prompt_word} or completion."
    )
