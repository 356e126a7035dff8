"""chat_template_kwargs reach the chat template: Qwen3's thinking template renders as transformers'
apply_chat_template(..., enable_thinking=...) does, through the request validator's ids too."""

from __future__ import annotations

import pytest

from testing.qwen3_thinking import make_tiny_qwen3_thinking
from zserve.tokenizer_proc.request_validator import RequestValidator
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CONVERSATIONS = {
    "one_turn": [{"role": "user", "content": "Why is the sky blue?"}],
    "system": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2? 你好 🙂"}],
    "multi_turn_thinking_dropped": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>\nThey greet me.\n</think>\n\nHello!"},
        {"role": "user", "content": "weather in Paris?"},
    ],
    "tool_round": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ],
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_qwen3_thinking(tmp_path_factory.mktemp("qwen3_thinking"))


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("thinking", [None, True, False])
def test_enable_thinking_renders_as_transformers(model_dir, hf_tokenizer, name, thinking):
    messages = CONVERSATIONS[name]
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    tools = TOOLS if name == "tool_round" else None
    theirs = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True, **kwargs)
    ours = TextTokenizer.from_model_dir(model_dir).apply_chat_template(messages, tools=tools, template_kwargs=kwargs)
    assert ours == theirs
    assert ours.endswith("<think>\n\n</think>\n\n") == (thinking is False)  # the test can tell the branches apart
    # and the request body's field gets there: the same ids as transformers tokenizes
    body = {"messages": messages, "chat_template_kwargs": kwargs, **({"tools": tools} if tools else {})}
    ids, _ = RequestValidator(TextTokenizer.from_model_dir(model_dir), context_len=4096).validate(body)
    assert ids == hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True,
                                                   return_dict=False, **kwargs)


@pytest.mark.parametrize("body_kwargs, error", [
    ({"messages": []}, "cannot set 'messages'"),
    ({"add_generation_prompt": False}, "cannot set 'add_generation_prompt'"),
    (["enable_thinking"], "must be an object"),
])
def test_bad_chat_template_kwargs_are_refused(model_dir, body_kwargs, error):
    validator = RequestValidator(TextTokenizer.from_model_dir(model_dir), context_len=4096)
    with pytest.raises(ValueError, match=error):
        validator.validate({"messages": CONVERSATIONS["one_turn"], "chat_template_kwargs": body_kwargs})
    with pytest.raises(ValueError, match="needs messages"):
        validator.validate({"prompt": "hi", "chat_template_kwargs": {"enable_thinking": False}})
