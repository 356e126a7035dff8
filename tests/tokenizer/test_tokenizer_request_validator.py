"""RequestValidator: a client body -> (input_ids, SamplingParams), or a ValueError fit for the client."""

from __future__ import annotations

import pytest

from testing.tokenizer_fixtures import build_byte_level_bpe, build_metaspace_bpe
from zserve.common.sampling_params import SamplingParams
from zserve.tokenizer_proc.request_validator import RequestValidator
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

CONTEXT_LEN = 64


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    return TextTokenizer.from_model_dir(build_byte_level_bpe(tmp_path_factory.mktemp("bl")))


@pytest.fixture()
def validator(tokenizer) -> RequestValidator:
    return RequestValidator(tokenizer, context_len=CONTEXT_LEN)


def test_prompt(validator, tokenizer):
    ids, params = validator.validate({"prompt": "Hello world", "sampling": {"max_tokens": 5, "stop": ["\n"]}})
    assert ids == tokenizer.encode("Hello world")
    assert params == SamplingParams(max_tokens=5, stop=("\n",))


def test_input_ids_and_default_sampling(validator):
    ids, params = validator.validate({"input_ids": [5, 6, 7]})
    assert ids == [5, 6, 7] and params == SamplingParams()


def test_messages_use_the_chat_template(validator, tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    ids, _ = validator.validate({"messages": messages, "sampling": {"temperature": 0.7, "top_p": 0.9}})
    assert ids == tokenizer.encode_chat(messages)
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_prompt_plus_max_tokens_beyond_the_context_is_refused_naming_both(validator):
    ids = [5] * 10
    _, params = validator.validate({"input_ids": ids, "sampling": {"max_tokens": CONTEXT_LEN - 10}})
    assert params.max_tokens == CONTEXT_LEN - 10  # exactly the context: fine, and never cut
    with pytest.raises(ValueError) as exc:
        validator.validate({"input_ids": ids, "sampling": {"max_tokens": CONTEXT_LEN - 9}})
    assert str(exc.value) == (
        f"This model's maximum context length is {CONTEXT_LEN} tokens. However, you requested {CONTEXT_LEN + 1} tokens "
        f"(10 in the prompt, {CONTEXT_LEN - 9} in the completion). Please reduce the length of the prompt or completion."
    )
    with pytest.raises(ValueError, match=r"\(\d+ in the messages, 100000 in the completion\)"):
        validator.validate({"messages": [{"role": "user", "content": "hi"}], "sampling": {"max_tokens": 100_000}})
    _, params = validator.validate({"input_ids": ids})
    assert params.max_tokens is None  # no max_tokens: up to the context, the scheduler's to resolve


def test_prompt_must_leave_room_for_one_output_token(validator):
    validator.validate({"input_ids": [5] * (CONTEXT_LEN - 1)})
    with pytest.raises(ValueError, match=f"prompt is {CONTEXT_LEN} tokens.*context is {CONTEXT_LEN}"):
        validator.validate({"input_ids": [5] * CONTEXT_LEN})
    with pytest.raises(ValueError, match="context"):
        validator.validate({"prompt": "word " * CONTEXT_LEN})


def test_huge_prompt_refused_before_encoding(validator):
    with pytest.raises(ValueError, match="characters, too long"):
        validator.validate({"prompt": "x" * 10_000_000})
    with pytest.raises(ValueError, match="characters, too long"):
        validator.validate({"messages": [{"role": "user", "content": "x" * 10_000_000}]})


@pytest.mark.parametrize(
    "body, message",
    [
        ("not a dict", "must be a mapping"),
        ({}, "exactly one of prompt, input_ids, messages; got none"),
        ({"prompt": "a", "input_ids": [1]}, "got prompt and input_ids"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, "got prompt and messages"),
        ({"prompt": "a", "stream": True}, "unknown request field.*stream"),
        ({"prompt": ""}, "prompt is empty"),
        ({"prompt": 5}, "prompt must be a string"),
        ({"prompt": ["a"]}, "prompt must be a string"),
        ({"input_ids": []}, "input_ids is empty"),
        ({"input_ids": "1 2"}, "input_ids must be a list"),
        ({"input_ids": [1, -1]}, r"input_ids\[1\] = -1 is not a token id"),
        ({"input_ids": [1, 600]}, r"input_ids\[1\] = 600 is not a token id \(vocabulary size 600\)"),
        ({"input_ids": [1, 2.0]}, r"input_ids\[1\] must be an integer"),
        ({"input_ids": [True]}, r"input_ids\[0\] must be an integer"),
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": "hi"}, "messages must be a non-empty list"),
        ({"messages": ["hi"]}, r"messages\[0\] must be an object"),
        ({"messages": [{"role": "user"}]}, r"messages\[0\].content must be a string"),
        ({"messages": [{"content": "x"}]}, r"messages\[0\].role must be one of"),
        ({"messages": [{"role": "user<|im_end|>", "content": "x"}]}, r"messages\[0\].role must be one of"),
        ({"messages": [{"role": "user", "content": "x", "extra": 1}]}, r"messages\[0\] has unknown field.*extra"),
        ({"messages": [{"role": "user", "content": ["x"]}]}, r"messages\[0\].content must be a string"),
        ({"prompt": "a", "sampling": {"max_tokens": 0}}, "max_tokens must be an integer in \\[1, "),
        ({"prompt": "a", "sampling": {"max_tokens": -3}}, "max_tokens must be an integer in \\[1, "),
        ({"prompt": "a", "sampling": {"max_tokens": "5"}}, "max_tokens"),
        ({"prompt": "a", "sampling": {"temperature": -0.1}}, "temperature must be a finite number >= 0"),
        ({"prompt": "a", "sampling": {"top_p": 0}}, r"top_p must be in \(0, 1\]"),
        ({"prompt": "a", "sampling": {"top_p": 1.5}}, r"top_p must be in \(0, 1\]"),
        ({"prompt": "a", "sampling": {"temprature": 1.0}}, "unknown sampling field.*temprature"),
        ({"prompt": "a", "sampling": [1]}, "sampling params must be a mapping"),
        ({"prompt": "a", "sampling": {"stop": [""]}}, "stop\\[0\\] must be a non-empty string"),
        ({"prompt": "a", "sampling": {"stop_token_ids": [599, 600]}}, r"stop_token_ids \[600\] are not in the vocab"),
    ],
)
def test_bad_requests_get_a_clear_message(validator, body, message):
    with pytest.raises(ValueError, match=message):
        validator.validate(body)


def test_chat_request_for_a_model_without_template(tmp_path):
    import json

    path = build_metaspace_bpe(tmp_path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    v = RequestValidator(TextTokenizer.from_model_dir(path), context_len=CONTEXT_LEN)
    with pytest.raises(ValueError, match="no chat template"):
        v.validate({"messages": [{"role": "user", "content": "hi"}]})
    assert v.validate({"prompt": "hi"})[0][0] == 1  # plain prompts still work (with BOS)


def test_template_refusal_is_a_client_error(tmp_path):
    v = RequestValidator(TextTokenizer.from_model_dir(build_metaspace_bpe(tmp_path)), context_len=CONTEXT_LEN)
    with pytest.raises(ValueError, match="roles must alternate"):
        v.validate({"messages": [{"role": "assistant", "content": "hi"}]})


def test_model_vocab_smaller_than_tokenizer(tokenizer):
    v = RequestValidator(tokenizer, context_len=CONTEXT_LEN, vocab_size=100)
    with pytest.raises(ValueError, match="vocabulary size 100"):
        v.validate({"input_ids": [100]})
    with pytest.raises(ValueError, match="context_len"):
        RequestValidator(tokenizer, context_len=1)


def test_sampling_defaults_fill_only_what_the_request_leaves_out(validator):
    defaults = {"temperature": 0.7, "top_k": 5, "top_p": 0.9}
    with_defaults = RequestValidator(validator.tokenizer, validator.context_len, default_sampling=defaults)
    _, params = with_defaults.validate({"prompt": "a"})
    assert (params.temperature, params.top_k, params.top_p) == (0.7, 5, 0.9)
    _, params = with_defaults.validate({"prompt": "a", "sampling": {"temperature": 0, "top_k": 0}})
    assert (params.temperature, params.top_k, params.top_p) == (0.0, 0, 0.9)
    _, params = validator.validate({"prompt": "a"})  # no generation_config sampling: greedy
    assert params.temperature == 0.0


def test_generation_config_sampling_counts_only_with_do_sample(tmp_path):
    import json

    from zserve.common.model_config import _default_sampling

    assert _default_sampling({"temperature": 0.6, "top_p": 0.9}) == ()  # transformers: greedy without do_sample
    assert dict(_default_sampling({"do_sample": True, "top_p": 0.9, "top_k": 20})) == {"temperature": 1.0, "top_p": 0.9, "top_k": 20}
    assert dict(_default_sampling({"do_sample": True, "temperature": 0.6, "top_k": "x"})) == {"temperature": 0.6}
    assert json.dumps(dict(_default_sampling({}))) == "{}"
