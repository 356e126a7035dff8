"""Tool calls: the parser (Hermes `<tool_call>` blocks, Llama 3 JSON), the OpenAI shapes streamed
and not, and `tools` reaching the chat template (same text as transformers renders)."""

from __future__ import annotations

import json

import pytest

from zserve.client.types import GenerateResult
from zserve.http_proc.apis.openai.chat_formatter import ChatFormatter
from zserve.http_proc.apis.openai.protocol import ChatCompletionRequest
from zserve.http_proc.shared.request_group import ChoiceEvent
from zserve.http_proc.tools.parser import ToolCallParser
from zserve.http_proc.tools.scan import ParsedCall
from zserve.tokenizer_proc.chat_template import ChatTemplate

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
    assert HERMES.scan("Hello <tool", False).content == "Hello "
    assert HERMES.scan("Hello <tool_call>{", False).content == "Hello "
    assert HERMES.scan("Hello world", False).content == "Hello world"
    assert LLAMA.scan('{"name"', False).content == "" and LLAMA.scan("Sure", False).content == "Sure"


def sse_objects(blob: bytes | None) -> list[dict]:
    """The JSON objects of an event's SSE chunks (a streamed tool call may take several)."""
    return [json.loads(part[len(b"data: "):]) for part in (blob or b"").split(b"\n\n") if part]


def result(text: str, finish: str | None) -> GenerateResult:
    r = GenerateResult(req_id=1, text=text, output_ids=list(range(len(text))))
    r.finish_reason = finish
    return r


def test_chat_response_shapes_with_tool_calls_streamed_and_not():
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    fmt = ChatFormatter(model_name="m", tool_parser=HERMES)
    subs = ChatCompletionRequest(messages=[{"role": "user", "content": "1+2?"}], tools=TOOLS).sub_requests()
    body = fmt.body(subs, [result("Sure. " + call, "stop")])
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Sure."
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}
    # streamed: the text before the call goes out as content, then the call's name, then its arguments
    chunks = []
    text = ""
    for piece in ["Sure. ", "<tool_", "call>\n{\"name\": \"add\", ", "\"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>"]:
        text += piece
        chunk = fmt.event_chunk(ChoiceEvent(0, piece, [0], result(text, None)))
        chunks += sse_objects(chunk)
    final = fmt.event_chunk(ChoiceEvent(0, "", [], result(text, "stop")))
    chunks += sse_objects(final)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content", "") for d in deltas) == "Sure."  # as the non-streamed content
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert calls[0] == {"index": 0, "id": calls[0]["id"], "type": "function", "function": {"name": "add", "arguments": ""}}
    assert "".join(c["function"]["arguments"] for c in calls) == json.dumps({"a": 1, "b": 2}) and len(calls) == 2
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


def test_forced_tool_choice_builds_the_schema_and_parses_its_answer():
    import jsonschema

    from zserve.http_proc.apis.openai.tool_choice import ForcedToolChoice

    required = ForcedToolChoice.of(TOOLS, "required")
    answer = [{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "add", "parameters": {"a": 1, "b": 2}}]
    jsonschema.validate(answer, required.schema)
    for wrong in ([], [{"name": "nope", "parameters": {}}], [{"name": "get_weather", "parameters": {}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, required.schema)
    content, calls = required.parse(json.dumps(answer))
    assert content is None and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
    assert required.parse('[{"name": "add", "param') == ('[{"name": "add", "param', [])  # cut short by max_tokens: text

    named = ForcedToolChoice.of(TOOLS, {"type": "function", "function": {"name": "add"}})
    assert named.schema == TOOLS[1]["function"]["parameters"] and named.scan('{"a": 1', False).calls == (ParsedCall("add", '{"a": 1'),)
    content, [call] = named.parse('{"a": 1, "b": 2}')
    assert content is None and call["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    assert ForcedToolChoice.of(TOOLS, "auto") is None and ForcedToolChoice.of(None, "none") is None


def test_forced_tool_choice_sends_its_schema_as_the_grammar():
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice="required")
    [sub] = req.sub_requests()
    assert json.loads(sub.sampling["json_schema"]) == req.forced_tool_choice.schema and sub.prompt["tools"] == TOOLS
    auto = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice="auto")
    assert "json_schema" not in auto.sub_requests()[0].sampling


def merged_calls(chunks) -> list:
    """A streamed answer's calls (openai SDK chunks): each call's first delta (id, type, name) with
    the argument pieces of its later deltas appended, as clients accumulate them by index."""
    calls = {}
    for chunk in chunks:
        for entry in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if entry.index not in calls:
                calls[entry.index] = entry.model_copy(deep=True)
            else:
                calls[entry.index].function.arguments += entry.function.arguments
    return list(calls.values())


BOUNDED_TOOLS = [  # two tools whose arguments a random model finishes in a few tokens
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"}},
        "required": ["a", "b"], "additionalProperties": False}}},
]


def test_tool_choice_required_and_named_are_enforced_streamed_and_not(model_dir, tmp_path):
    """Qwen3-style (Hermes) template, two tools: under `required` a random model's answer is still
    one or more calls to the given tools with arguments valid for their schema; under a named
    function, a call to that one; the same when streamed (each call whole in one delta)."""
    import shutil

    import jsonschema
    import openai

    from testing.server_process import free_port, start_server

    tool_model = tmp_path / "tool-model"
    shutil.copytree(model_dir, tool_model)
    # the tools by name only: the tiny byte-level tokenizer spends a token per byte of a 512-token context
    (tool_model / "chat_template.jinja").write_text(HERMES_TEMPLATE.replace("{{ tool | tojson }}", "{{ tool.function.name }}"))
    http_port = free_port()
    server = start_server(tool_model, "--http-port", str(http_port), "--num-threads", "1", "--kv-cache-tokens", "4096")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in BOUNDED_TOOLS}

    def check(calls, names):
        assert calls, "no call"
        for call in calls:
            assert call.type == "function" and call.function.name in names and call.id.startswith("call_")
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])

    try:
        oai = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Weather in Paris, and 2 + 3?"}]
        for seed in range(3):
            r = oai.chat.completions.create(model=tool_model.name, messages=messages, max_tokens=150, temperature=1.0, seed=seed,
                                            tools=BOUNDED_TOOLS, tool_choice="required")
            assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None, r
            check(r.choices[0].message.tool_calls, schemas)
        named = {"type": "function", "function": {"name": "add"}}
        r = oai.chat.completions.create(model=tool_model.name, messages=messages, max_tokens=60, temperature=1.0, seed=7,
                                        tools=BOUNDED_TOOLS, tool_choice=named)
        assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls) == 1
        check(r.choices[0].message.tool_calls, {"add"})

        chunks = list(oai.chat.completions.create(model=tool_model.name, messages=messages, max_tokens=150, temperature=1.0, seed=4,
                                                  tools=BOUNDED_TOOLS, tool_choice="required", stream=True))
        assert not any(c.choices[0].delta.content for c in chunks if c.choices)  # the call never streams as content
        check(merged_calls(chunks), schemas)
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        with pytest.raises(openai.BadRequestError, match="not among the tools"):
            oai.chat.completions.create(model=tool_model.name, messages=messages, tools=BOUNDED_TOOLS,
                                        tool_choice={"type": "function", "function": {"name": "nope"}})
    finally:
        assert server.stop() == 0


TWO_CALLS = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def test_parallel_tool_calls_false_keeps_only_the_first_call_streamed_and_not():
    single = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS, parallel_tool_calls=False)
    parser = single.tool_parser(HERMES)
    assert parser == HERMES.with_tools(TOOLS).single_call() and HERMES.parse(TWO_CALLS)[1][1]["function"]["name"] == "add"
    assert [c["function"]["name"] for c in parser.parse(TWO_CALLS)[1]] == ["get_weather"]
    assert len(LLAMA.single_call().parse('{"name": "add", "parameters": {}}; {"name": "add", "parameters": {"a": 1}}')[1]) == 1
    default = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS)
    assert default.tool_parser(HERMES) == HERMES.with_tools(TOOLS) and default.tool_parser(None) is None

    fmt = ChatFormatter(model_name="m", tool_parser=parser)
    [choice] = fmt.body(single.sub_requests(), [result(TWO_CALLS, "stop")])["choices"]
    assert choice["finish_reason"] == "tool_calls" and [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather"]
    final = fmt.event_chunk(ChoiceEvent(0, TWO_CALLS, [0], result(TWO_CALLS, "stop")))
    delta_calls = [call for c in sse_objects(final) for call in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [c["function"]["name"] for c in delta_calls if "id" in c] == ["get_weather"]
    assert {c["index"] for c in delta_calls} == {0}


def test_parallel_tool_calls_false_makes_tool_choice_required_one_call():
    import jsonschema

    single = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice="required",
                                   parallel_tool_calls=False)
    schema = json.loads(single.sub_requests()[0].sampling["json_schema"])
    one, two = [{"name": "add", "parameters": {"a": 1}}], [{"name": "add", "parameters": {"a": 1}}, {"name": "add", "parameters": {}}]
    jsonschema.validate(one, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(two, schema)
    jsonschema.validate(two, ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                                                   tool_choice="required").forced_tool_choice.schema)


def regex_of(text: str) -> str:
    """`text` as a regex that matches it alone (xgrammar's regex: escape the metacharacters only)."""
    return "".join("\\" + ch if ch in "\\^$.|?*+()[]{}" else ch for ch in text)


def test_tool_calls_parse_in_the_chat_template_given_by_flag(model_dir, tmp_path):
    """--chat-template with a Hermes tool format over a model whose own template has none: the
    HTTP process parses the calls in the template the prompts were rendered with (it used to
    load the model's own, so the calls stayed text). A regex makes the random model write two
    calls; parallel_tool_calls false answers the first only, streamed and not."""
    import openai

    from testing.server_process import free_port, start_server

    template = tmp_path / "hermes.jinja"
    template.write_text(HERMES_TEMPLATE.replace("{{ tool | tojson }}", "{{ tool.function.name }}"))
    http_port = free_port()
    server = start_server(model_dir, "--http-port", str(http_port), "--num-threads", "1", "--kv-cache-tokens", "4096",
                          "--chat-template", str(template))
    try:
        oai = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="x", max_retries=0)
        kwargs = dict(model=model_dir.name, messages=[{"role": "user", "content": "Weather in Paris, and 1 + 2?"}], max_tokens=200,
                      tools=TOOLS, extra_body={"regex": regex_of(TWO_CALLS)})
        both = oai.chat.completions.create(**kwargs).choices[0]
        assert both.finish_reason == "tool_calls" and both.message.content is None, both
        assert [(c.function.name, json.loads(c.function.arguments)) for c in both.message.tool_calls] == [
            ("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
        first = oai.chat.completions.create(**kwargs, parallel_tool_calls=False).choices[0]
        assert first.finish_reason == "tool_calls" and [c.function.name for c in first.message.tool_calls] == ["get_weather"]
        chunks = list(oai.chat.completions.create(**kwargs, parallel_tool_calls=False, stream=True))
        assert [c.function.name for c in merged_calls(chunks)] == ["get_weather"] and chunks[-1].choices[0].finish_reason == "tool_calls"
        assert not any(c.choices[0].delta.content for c in chunks if c.choices)

        forced = dict(kwargs, tools=BOUNDED_TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=1.0, max_tokens=150)
        del forced["extra_body"]
        for seed in range(2):
            r = oai.chat.completions.create(**forced, seed=seed).choices[0]
            assert r.finish_reason == "tool_calls" and len(r.message.tool_calls) == 1, r
    finally:
        assert server.stop() == 0
