"""Known request fields that would change the answer but that zserve does not honour: a 400 naming the field.

SGLang's request fields `lora_path`, `return_hidden_states`, `priority`, `logprob_start_len`,
`custom_logit_processor`, `session_params`, `return_text_in_logprobs` and `token_ids_logprob` each ask for
something zserve does not do (an adapter, the hidden states, a queue order, the prompt's logprobs from a
position, a client's logit processor, a session's history, token texts or chosen ids' logprobs), as do vLLM's
`guided_whitespace_pattern` and a `guided_decoding_backend` other than xgrammar; the OpenAI routes also refuse
vLLM's `bad_words`, `allowed_token_ids` and `prompt_logprobs` when set (VLLM_UNHONOURED). Accepting
them silently would answer a 200 with something other than what was asked, so a value
other than the field's default is refused, --strict-requests or not. At its default (null, false, -1: what
sglang-router adds to every request it forwards) the field changes nothing and stays accepted with the one
INFO note of shared/unknown_fields.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zserve.http_proc.shared.api_error import ApiError

# field name -> (its values that change nothing, why any other value is refused)
REFUSED_UNLESS_DEFAULT: dict[str, tuple[tuple[Any, ...], str]] = {
    "lora_path": ((None, ""), "LoRA adapters are not supported"),
    "return_hidden_states": ((None, False), "hidden states are not returned"),
    "priority": ((None, 0), "requests are served first come, first served (no priorities)"),
    "logprob_start_len": ((None, -1), "prompt logprobs from a position are not supported (use prompt_logprobs)"),
    "custom_logit_processor": ((None, ""), "custom logit processors are not supported"),
    "session_params": ((None, {}), "sessions are not supported"),
    # vLLM's older structured-output tuning (apis/openai/structured_output.py refuses the same in structured_outputs)
    "guided_whitespace_pattern": ((None, ""), "the grammar's whitespace is xgrammar's"),
    "guided_decoding_backend": ((None, "", "xgrammar", "auto"), "the grammar backend is --grammar-backend's"),
    # SGLang's /generate: they ask for output zserve never sends (sglang-router sends the first at its default)
    "return_text_in_logprobs": ((None, False), "logprobs come as token ids only (no token texts)"),
    "token_ids_logprob": ((None, []), "logprobs of chosen token ids are not returned"),
}

# vLLM's sampling fields the OpenAI routes declare and refuse when set (null or [] change nothing), and why
VLLM_UNHONOURED: dict[str, str] = {
    "bad_words": "banned word sequences are not supported (logit_bias bans single tokens)",
    "allowed_token_ids": "a per-request allowed-token set is not supported (use a grammar: regex or guided_choice)",
    "prompt_logprobs": "the prompt's logprobs come with echo and logprobs on /v1/completions, or on /generate",
}


def refuse_unhonoured(values: Mapping[str, Any] | None, prefix: str = "") -> None:
    """Raise the 400 for the first field of `values` that asks for something zserve does not honour."""
    for name, value in (values or {}).items():
        known = REFUSED_UNLESS_DEFAULT.get(name)
        if known is None or _is_default(value, known[0]):
            continue
        raise ApiError(400, f"{prefix}{name} is not supported by this server: {known[1]}", param=f"{prefix}{name}")


def _is_default(value: Any, defaults: tuple[Any, ...]) -> bool:
    # the type must match too: `return_hidden_states: 0` or `priority: false` is not what SGLang's default means
    return value is None or any(type(value) is type(d) and value == d for d in defaults)
