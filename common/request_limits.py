"""RequestLimits: the bounds every request is held to, checked before any expensive work.

One frozen table, read by SamplingParams (numbers and lists) and the frontend's RequestValidator
(prompt, messages, the chat template's render). Each bound is what keeps one request from
costing every other client: a count or size cap on every list and string, and a range on every
number, so that stop matching, rendering and tokenizing stay cheap whatever a client sends.

The numbers are generous next to what real clients send (OpenAI's API takes at most 4 stop
strings; vLLM's bench client sends none) and small next to what would stall a process.
"""

from __future__ import annotations

from dataclasses import dataclass

INT32_MAX = 2**31 - 1
UINT64_LIMIT = 2**64  # seeds are taken modulo nothing: they must be below this


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_top_logprobs: int = 20  # OpenAI's cap
    max_tools: int = 128  # function definitions in one chat request
    max_tools_json_chars: int = 256 << 10  # their JSON, all together
    max_grammar_chars: int = 64 << 10  # a JSON schema, regex or EBNF grammar
    # xgrammar's compile time grows steeply with a schema's nesting (200 object levels: 1 s; 500: 20 s) and with
    # optional properties in one object (2,000: 9 s), and one compile holds the compile thread: these keep it < 0.2 s
    max_schema_depth: int = 64  # nested JSON containers in a schema document (32 levels of objects)
    max_schema_properties: int = 256  # names in one `properties`
    max_copies: int = 128  # n: choices of one prompt in one request
    max_stop_strings: int = 32  # the detokenizer scans each per output token: the count bounds its cost
    max_stop_string_chars: int = 256  # held-back text is at most this long
    max_stop_token_ids: int = 256
    max_logit_bias_entries: int = 1024  # the worker adds each to its row's logits every step
    max_penalty: float = 2.0  # presence and frequency penalties lie in [-max, max] (OpenAI's range)
    max_repetition_penalty: float = 10.0  # repetition_penalty lies in (0, this]
    max_logit_bias: float = 100.0  # a bias lies in [-this, this] (OpenAI's range)
    max_messages: int = 4096  # and fewer than the context's tokens: every template spends a token per message
    max_message_name_chars: int = 256
    max_top_k: int = INT32_MAX  # the vocabulary bounds it first (RequestValidator); this bounds it for any model
    max_max_tokens: int = INT32_MAX  # the context bounds it first (RequestValidator)
    # a rendered chat prompt longer than context x this is refused while rendering
    max_rendered_chars_per_token: int = 64
    render_timeout_s: float = 2.0  # a chat template rendering longer than this is stopped and the request refused


LIMITS = RequestLimits()
