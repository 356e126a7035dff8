"""Tool calls: the parser (Hermes `<tool_call>` blocks, Llama 3 JSON), the OpenAI shapes streamed
and not, and `tools` reaching the chat template (same text as transformers renders)."""

from __future__ import annotations

import json

import pytest

from client.types import GenerateResult
from http_proc.openai_formatter import OpenAIFormatter
from http_proc.openai_protocol import ChatCompletionRequest
from http_proc.request_group import ChoiceEvent
from http_proc.tool_call_parser import ToolCallParser
from tokenizer_proc.chat_template import ChatTemplate

HERMES = ToolCallParser("hermes")
LLAMA = ToolCallParser("llama3_json")
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}},
]
HERMES_TEMPLATE = (  # the tool part of Qwen2.5/Qwen3's template, in short
    "{% if tools %}<|im_start|>system\nYou may call functions.\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "</tools>\nFor each call return <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_hermes_blocks_become_tool_calls_and_the_rest_content():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    content, calls = HERMES.parse(text)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "add"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {"a": 1, "b": 2}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert HERMES.parse("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])  # stays text
    assert HERMES.parse("plain answer") == ("plain answer", [])


def test_llama3_json_calls():
    content, calls = LLAMA.parse('<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}')
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert LLAMA.parse("The answer is 3.") == ("The answer is 3.", [])


def test_streaming_holds_back_what_may_start_a_call():
    assert HERMES.safe_prefix_len("Hello <tool") == len("Hello ")
    assert HERMES.safe_prefix_len("Hello <tool_call>{") == len("Hello ")
    assert HERMES.safe_prefix_len("Hello world") == len("Hello world")
    assert LLAMA.safe_prefix_len('{"name"') == 0 and LLAMA.safe_prefix_len("Sure") == 4


def result(text: str, finish: str | None) -> GenerateResult:
    r = GenerateResult(req_id=1, text=text, output_ids=list(range(len(text))))
    r.finish_reason = finish
    return r


def test_chat_response_shapes_with_tool_calls_streamed_and_not():
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    fmt = OpenAIFormatter(True, "m", tool_parser=HERMES)
    subs = ChatCompletionRequest(messages=[{"role": "user", "content": "1+2?"}], tools=TOOLS).sub_requests()
    body = fmt.body(subs, [result("Sure. " + call, "stop")])
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Sure."
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}
    # streamed: the text before the call goes out as content, the call only at the end, whole
    chunks = []
    text = ""
    for piece in ["Sure. ", "<tool_", "call>\n{\"name\": \"add\", ", "\"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>"]:
        text += piece
        chunk = fmt.event_chunk(ChoiceEvent(0, piece, [0], result(text, None)))
        chunks += [json.loads(chunk[len(b"data: "):])] if chunk else []
    final = fmt.event_chunk(ChoiceEvent(0, "", [], result(text, "stop")))
    chunks.append(json.loads(final[len(b"data: "):]))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content", "") for d in deltas) == "Sure. "
    [calls] = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "add"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tools_and_earlier_calls_render_as_transformers_renders_them(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from testing.tokenizer_fixtures import build_byte_level_bpe

    build_byte_level_bpe(tmp_path, vocab_size=300)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    hf.chat_template = HERMES_TEMPLATE
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    expected = hf.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    ours = ChatTemplate(HERMES_TEMPLATE, "hermes").render(messages, add_generation_prompt=True, special_tokens={}, tools=TOOLS)
    assert ours == expected and "get_weather" in ours and "<tools>" in ours


@pytest.mark.parametrize("source, kind", [(HERMES_TEMPLATE, "hermes"), ("{{ '<|python_tag|>' }}{{ tools }}", "llama3_json"), ("{{ messages }}", None)])
def test_the_parser_follows_the_template(source, kind):
    parser = ToolCallParser.for_template(source)
    assert (parser.kind if parser else None) == kind


def test_tools_reach_the_template_through_http(model_dir, tmp_path):
    import shutil

    import openai

    from testing.server_process import free_port, start_server

    tool_model = tmp_path / "tool-model"
    shutil.copytree(model_dir, tool_model)
    (tool_model / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    http_port = free_port()
    server = start_server(tool_model, "--http-port", str(http_port), "--num-threads", "1", "--kv-cache-tokens", "4096")
    try:
        oai = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        plain = oai.chat.completions.create(model=tool_model.name, messages=messages, max_tokens=2)
        with_tools = oai.chat.completions.create(model=tool_model.name, messages=messages, max_tokens=2, tools=TOOLS)
        assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20  # the definitions are in the prompt
        follow_up = messages + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        answer = oai.chat.completions.create(model=tool_model.name, messages=follow_up, max_tokens=2, tools=TOOLS)
        assert answer.choices[0].finish_reason in ("stop", "length")  # a random model writes no call: plain content
    finally:
        assert server.stop() == 0
