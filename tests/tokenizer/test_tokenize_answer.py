"""The frontend's answer to a TokenizeReq: a prompt's ids (with or without special tokens), messages through the
chat template, ids back to text, and a generate request's checks (INVALID with the reason)."""

from __future__ import annotations

import pytest

from testing.tokenizer_fixtures import build_byte_level_bpe
from zserve.common.error_code import ErrorCode
from zserve.common.messages import TokenizeReq
from zserve.tokenizer_proc.request_validator import RequestValidator
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer
from zserve.tokenizer_proc.tokenize_answer import answer_tokenize


@pytest.fixture(scope="module")
def validator(tmp_path_factory) -> RequestValidator:
    return RequestValidator(TextTokenizer.from_model_dir(build_byte_level_bpe(tmp_path_factory.mktemp("bl"))), 64)


def test_prompt_messages_and_ids(validator):
    tokenizer = validator.tokenizer
    for add_special in (True, False):
        out = answer_tokenize(validator, TokenizeReq(1, {"prompt": "Hello world"}, add_special))
        assert out.code is None and out.input_ids == tokenizer.encode("Hello world", add_special_tokens=add_special)
    messages = [{"role": "user", "content": "hi"}]
    assert answer_tokenize(validator, TokenizeReq(2, {"messages": messages})).input_ids == tokenizer.encode_chat(messages)
    ids = tokenizer.encode("round trip", add_special_tokens=False)
    out = answer_tokenize(validator, TokenizeReq(3, {"input_ids": ids}))
    assert (out.req_id, out.text) == (3, tokenizer.decode(ids))


@pytest.mark.parametrize(("body", "reason"), [
    ({}, "give exactly one of prompt, messages, input_ids; got none"),
    ({"prompt": "a", "input_ids": [1]}, "got prompt and input_ids"),
    ({"prompt": ""}, "prompt is empty"),
    ({"input_ids": [10**9]}, "is not a token id"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role must be one of"),
])
def test_a_bad_body_is_invalid_with_the_reason(validator, body, reason):
    out = answer_tokenize(validator, TokenizeReq(4, body))
    assert out.code == ErrorCode.INVALID and reason in out.error and out.input_ids == []
