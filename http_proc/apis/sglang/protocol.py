"""SGLang's /generate request and response shape, next to our native one (http_proc/apis/sglang/route.py).

An SGLang client posts `{"text": ..., "sampling_params": {"max_new_tokens": 16, ...}, "stream": ...}` (or
`input_ids` for text; sglang-router 0.3.2 forwards every /generate in this shape, adding `model: null`,
`log_metrics`, `return_text_in_logprobs`, ... and dropping fields SGLang does not declare) and
reads `{"text", "output_ids", "meta_info": {"finish_reason": {"type": ...}, "prompt_tokens", ...}}`; streamed,
each `data:` chunk carries the text and ids *so far* (SGLang's default), so the client slices off what it
printed. A body with `text` or `sampling_params` is read this way: its fields are renamed into ours
(`max_new_tokens` -> `max_tokens`, `min_new_tokens` -> `min_tokens`, `top_logprobs_num` -> `top_logprobs`,
`sampling_seed` -> `seed`, `top_k` -1 -> 0); `skip_special_tokens` and `no_stop_trim` are honoured; SGLang's
fields that change nothing here (`rid`, `log_metrics`, `stream_interval`, ...) are accepted and noted once at
INFO (shared/unknown_fields.py); any other field is ignored as OpenAI's unknown fields are (one warning per name; a
400 under --strict-requests). A list of texts or of id lists (SGLang's batch, not streamed) runs as one
request per prompt and is answered with a list of responses in the prompts' order.
The sampling names and the response shape are client/sglang_shape.py (zserve.Engine returns it too).
"""

from __future__ import annotations

from typing import Any

from zserve.client.sglang_shape import RENAMED_SAMPLING
from zserve.http_proc.shared.api_error import ApiError

RENAMED_TOP = {"text": "prompt", "top_logprobs_num": "top_logprobs"}
KEPT_TOP = ("input_ids", "return_logprob", "stream")
KEPT_SAMPLING = (
    "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "json_schema", "regex", "ebnf", "logit_bias", "n",
    "skip_special_tokens", "no_stop_trim",
)
# top-level fields only SGLang's shape has: sglang-router adds them to every /generate it forwards, with or
# without sampling_params (an input_ids request may come without)
SGLANG_ONLY_TOP = ("log_metrics", "return_text_in_logprobs", "top_logprobs_num", "rid")


def is_sglang_body(body: dict[str, Any]) -> bool:
    return "text" in body or "sampling_params" in body or any(key in body for key in SGLANG_ONLY_TOP)


def from_sglang_body(body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Our native body for an SGLang one, and the names of the fields it ignores (`sampling_params.x` for those
    inside it)."""
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise ApiError(400, "sampling_params must be a JSON object", param="sampling_params")
    native: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in body.items():
        if key in RENAMED_TOP:
            native[RENAMED_TOP[key]] = value
        elif key in KEPT_TOP:
            native[key] = value
        elif key != "sampling_params":
            ignored.append(key)
    for key, value in params.items():
        if key in RENAMED_SAMPLING:
            native[RENAMED_SAMPLING[key]] = value
        elif key in KEPT_SAMPLING:
            native[key] = 0 if key == "top_k" and value == -1 else value  # SGLang's "off" is -1, ours 0
        else:
            ignored.append(f"sampling_params.{key}")
    return native, ignored


def is_batch(key: str, value: Any) -> bool:
    """SGLang's batch: `text` as a list of strings, or `input_ids` as a list of id lists."""
    return isinstance(value, list) and (key == "prompt" or (bool(value) and isinstance(value[0], list)))
