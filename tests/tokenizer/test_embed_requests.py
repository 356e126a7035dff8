"""RequestValidator on an embedding server (--task embed) and off it: an embedding request (`embed: true`)
is a prompt or input_ids only, answered only by an embedding server, which refuses generation."""

from __future__ import annotations

import pytest

from testing.tokenizer_fixtures import build_byte_level_bpe
from zserve.common.sampling_params import SamplingParams
from zserve.tokenizer_proc.request_validator import RequestValidator
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

CONTEXT_LEN = 64


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    return TextTokenizer.from_model_dir(build_byte_level_bpe(tmp_path_factory.mktemp("bl")))


def test_an_embedding_request_is_its_prompt_and_one_prefill(tokenizer):
    validator = RequestValidator(tokenizer, CONTEXT_LEN, default_sampling={"temperature": 0.7}, is_embedding=True)
    ids, params = validator.validate({"prompt": "Hello world", "embed": True, "sampling": {}})
    assert ids == tokenizer.encode("Hello world") and params == SamplingParams(max_tokens=1)
    assert validator.validate({"input_ids": [5, 6], "embed": True})[0] == [5, 6]


@pytest.mark.parametrize(("body", "words"), [
    ({"prompt": "hi"}, "runs --task embed: it answers embedding requests"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "runs --task embed"),
    ({"prompt": "hi", "embed": True, "sampling": {"max_tokens": 4}}, "takes a prompt or input_ids only, not sampling"),
    ({"messages": [{"role": "user", "content": "hi"}], "embed": True}, "not messages"),
    ({"prompt": "hi", "embed": True, "n": 2}, "not n"),
    ({"prompt": "hi", "embed": "yes"}, "embed must be a boolean"),
    ({"input_ids": list(range(3, 3 + CONTEXT_LEN)), "embed": True}, "context"),
])
def test_an_embedding_server_refuses(tokenizer, body, words):
    with pytest.raises(ValueError, match=words):
        RequestValidator(tokenizer, CONTEXT_LEN, is_embedding=True).validate(body)


def test_a_generating_server_refuses_an_embedding_request(tokenizer):
    with pytest.raises(ValueError, match="embeddings need a server started with --task embed"):
        RequestValidator(tokenizer, CONTEXT_LEN).validate({"prompt": "hi", "embed": True})
