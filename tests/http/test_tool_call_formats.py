"""Each tool-call format (--tool-call-parser): texts in that format (several calls, content around,
malformed blocks staying text) parse into OpenAI's `tool_calls`; streamed through the formatter at
every character boundary, split in two at every boundary, and in random chunks, the name and id of
each call come once (arguments ""), then argument pieces that concatenate to the non-streamed
arguments, and the content equals the non-streamed content."""

from __future__ import annotations

import json
import random

import pytest

from zserve.client.types import GenerateResult
from zserve.common.tool_call_format import TOOL_CALL_FORMATS, template_tool_call_format
from zserve.http_proc.apis.openai.chat_formatter import ChatFormatter
from zserve.http_proc.apis.openai.protocol import ChatCompletionRequest, with_tool_markup
from zserve.http_proc.apis.openai.tool_choice import ForcedToolChoice
from zserve.http_proc.shared.request_group import ChoiceEvent
from zserve.http_proc.tools.parser import SCANNERS, ToolCallParser

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}, "opts": {"type": "object"},
                                         "exact": {"type": "boolean"}, "tags": {"type": "array"}}}}},
]
PARIS, ADD = ("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})
QWEN3_CODER_CALL = (
    "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2.5\n</parameter>\n"
    "<parameter=opts>\n{\"round\": true}\n</parameter>\n<parameter=exact>\nfalse\n</parameter>\n"
    "<parameter=tags>\n[\"x\", \"</y>\"]\n</parameter>\n<parameter=note>\nline 1\nline 2\n</parameter>\n</function>\n</tool_call>"
)

# (format, answer, content, [(name, arguments)]): content None when only calls were written
CASES = [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\nDone.', "Let me check.\n\n\nDone.",
     [PARIS, ADD]),
    ("hermes", 'A <tool_call>not json</tool_call> B\n<tool_call>\n{"name": "add", "arguments": {"s": "}</tool_call>{"}}\n'
     "</tool_call>", "A <tool_call>not json</tool_call> B", [("add", {"s": "}</tool_call>{"})]),
    ("hermes", '<tool_call>{"arguments": {"a": 2}, "name": "add"}</tool_call>', None, [("add", {"a": 2})]),  # key order
    ("hermes", "No call here, just <tool", "No call here, just <tool", []),
    ("hermes", 'Cut short <tool_call>\n{"na', 'Cut short <tool_call>\n{"na', []),  # max_tokens inside the head
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
     '{"name": "add", "parameters": {"a": 1, "b": 2}}', None, [PARIS, ADD]),
    ("llama3_json", '{"name": "add", "arguments": {"a": 1, "b": 2}} and more', " and more", [ADD]),
    ("llama3_json", 'The JSON is {"name": "add"}', 'The JSON is {"name": "add"}', []),
    ("llama3_json", '{"nam": "add", "parameters": {}}', '{"nam": "add", "parameters": {}}', []),
    ("mistral", 'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "add", "arguments": {"a": 1, "b": 2}}]', "Sure.", [PARIS, ADD]),
    ("mistral", 'ok [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}', "ok",
     [PARIS, ADD]),
    ("mistral", '[{"name": "add", "arguments": {"a": 1, "b": 2}}]', None, [ADD]),  # its marker stripped
    ("mistral", "a [TOOL_CALLS] is not a call", "a [TOOL_CALLS] is not a call", []),
    ("pythonic", '[get_weather(city="Paris"), add(a=1, b=2)]', None, [PARIS, ADD]),
    ("pythonic", '<|python_start|>[add(a=1, b=[1, "x)"], c={"k": None})]<|python_end|>', None,
     [("add", {"a": 1, "b": [1, "x)"], "c": {"k": None}})]),
    ("pythonic", "I think [x] is a list", "I think [x] is a list", []),
    ("pythonic", "[add(a=1), f(x=undefined_name)]", None, [("add", {"a": 1}), ("f", {})]),  # never evaluated
    ("qwen3_coder", "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "</function>\n</tool_call>\n" + QWEN3_CODER_CALL, "Checking.",
     [PARIS, ("add", {"a": 1, "b": 2.5, "opts": {"round": True}, "exact": False, "tags": ["x", "</y>"],
                      "note": "line 1\nline 2"})]),
    ("qwen3_coder", '<tool_call>{"name": "add"}</tool_call> text', '<tool_call>{"name": "add"}</tool_call> text', []),
]
IDS = [f"{kind}-{i}" for i, (kind, *_) in enumerate(CASES)]


def result(text: str, finish: str | None) -> GenerateResult:
    r = GenerateResult(req_id=1, text=text, output_ids=list(range(len(text))))
    r.finish_reason = finish
    return r


def parser_of(kind: str) -> ToolCallParser:
    return ToolCallParser(kind).with_tools(TOOLS)


def non_streamed(kind: str | ForcedToolChoice, text: str) -> dict:
    parser = parser_of(kind) if isinstance(kind, str) else kind
    subs = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS).sub_requests()
    [choice] = ChatFormatter(model_name="m", tool_parser=parser).body(subs, [result(text, "stop")])["choices"]
    return choice


def streamed(kind: str | ForcedToolChoice, pieces: list[str]) -> tuple[str, list[tuple[str, str]], str]:
    """(content, [(name, arguments)], finish_reason) of the answer sent in `pieces`, checking the
    chunks' shapes on the way: a call's id, type and name once, with arguments ""; then only
    index and argument pieces."""
    fmt = ChatFormatter(model_name="m", tool_parser=parser_of(kind) if isinstance(kind, str) else kind)
    text, events = "", []
    for piece in pieces:
        text += piece
        events.append(fmt.event_chunk(ChoiceEvent(0, piece, [0], result(text, None))))
    events.append(fmt.event_chunk(ChoiceEvent(0, "", [], result(text, "stop"))))
    chunks = [json.loads(part[len(b"data: "):]) for blob in events if blob for part in blob.split(b"\n\n") if part]
    content, calls, ids = "", {}, set()
    for chunk in chunks:
        [choice] = chunk["choices"]
        assert choice["finish_reason"] is None or chunk is chunks[-1]
        delta = choice["delta"]
        content += delta.get("content", "")
        for entry in delta.get("tool_calls", []):
            idx = entry["index"]
            if "id" in entry:
                assert idx == len(calls) and entry["type"] == "function" and entry["function"]["arguments"] == ""
                assert entry["id"].startswith("call_") and entry["id"] not in ids
                ids.add(entry["id"])
                calls[idx] = [entry["function"]["name"], ""]
            else:
                assert set(entry) == {"index", "function"} and set(entry["function"]) == {"arguments"}
                assert entry["function"]["arguments"]
                calls[idx][1] += entry["function"]["arguments"]
    return content, [tuple(c) for c in calls.values()], chunks[-1]["choices"][0]["finish_reason"]


@pytest.mark.parametrize(("kind", "text", "content", "calls"), CASES, ids=IDS)
def test_each_format_parses_its_calls_and_leaves_the_rest_text(kind, text, content, calls):
    choice = non_streamed(kind, text)
    message = choice["message"]
    assert message["content"] == content
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
    assert got == calls
    assert choice["finish_reason"] == ("tool_calls" if calls else "stop")
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in message.get("tool_calls", []))


@pytest.mark.parametrize(("kind", "text", "content", "calls"), CASES, ids=IDS)
def test_streamed_calls_concatenate_to_the_non_streamed_ones_at_every_cut(kind, text, content, calls):
    choice = non_streamed(kind, text)
    expected = (
        choice["message"]["content"] or "",
        [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls", [])],
        choice["finish_reason"],
    )
    assert streamed(kind, list(text)) == expected  # one character per event: every boundary
    for cut in range(len(text) + 1):  # two events, cut at each boundary
        assert streamed(kind, [text[:cut], text[cut:]]) == expected, cut
    rng = random.Random(0)
    for _ in range(20):  # random chunks, as tokens of a few characters arrive
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert streamed(kind, pieces) == expected, pieces
    if calls and "<tool_call>{\"arguments\"" not in text:  # arguments are sent in pieces, not in one blob at the end
        fmt = ChatFormatter(model_name="m", tool_parser=parser_of(kind))
        sent = [fmt.event_chunk(ChoiceEvent(0, ch, [0], result(text[:i + 1], None))) for i, ch in enumerate(text)]
        pieces = [e for blob in sent if blob for part in blob.split(b"\n\n") if part
                  for e in json.loads(part[len(b"data: "):])["choices"][0]["delta"].get("tool_calls", []) if "id" not in e]
        assert len(pieces) >= len(calls) + 2, pieces


def test_parallel_tool_calls_false_streams_the_first_call_only():
    kind, text, _, _ = CASES[0]
    parser = parser_of(kind).single_call()
    fmt = ChatFormatter(model_name="m", tool_parser=parser)
    blobs = [fmt.event_chunk(ChoiceEvent(0, ch, [0], result(text[:i + 1], None))) for i, ch in enumerate(text)]
    blobs.append(fmt.event_chunk(ChoiceEvent(0, "", [], result(text, "stop"))))
    names = [e["function"]["name"] for blob in blobs if blob for part in blob.split(b"\n\n") if part
             for e in json.loads(part[len(b"data: "):])["choices"][0]["delta"].get("tool_calls", []) if "id" in e]
    assert names == ["get_weather"] and [c["function"]["name"] for c in parser.parse(text)[1]] == ["get_weather"]


@pytest.mark.parametrize(("source", "kind"), [
    ("{% for t in tools %}{{ t }}{% endfor %}<tool_call>\n<function={{ name }}>\n<parameter={{ p }}>", "qwen3_coder"),
    ("{% if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", "mistral"),
    ("Respond as [func_name1(params_name1=params_value1), func_name2(params)]", "pythonic"),
    ("{{ '<|python_start|>' }}{{ tools }}", "pythonic"),
    ("<tool_call>{{ tools }}</tool_call>", "hermes"),
])
def test_template_detection_knows_the_new_formats(source, kind):
    assert template_tool_call_format(source) == kind


def test_one_scanner_per_format_and_a_clear_error_for_others():
    assert tuple(SCANNERS) == TOOL_CALL_FORMATS
    with pytest.raises(ValueError, match="tool-call format must be one of hermes, llama3_json"):
        ToolCallParser("xml")


def test_mistral_keeps_its_special_tokens_in_the_text():
    """[TOOL_CALLS] and [ARGS] are special tokens: the route asks for them (skip_special_tokens false)."""
    assert ToolCallParser("mistral").needs_special_tokens
    assert not any(ToolCallParser(kind).needs_special_tokens for kind in TOOL_CALL_FORMATS if kind != "mistral")
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "n": 2})
    subs = body.sub_requests()  # what the chat route and the /v1/responses, /v1/messages translations send
    assert all(s.sampling["skip_special_tokens"] is False for s in with_tool_markup(subs, ToolCallParser("mistral")))
    assert with_tool_markup(subs, ToolCallParser("hermes")) == subs and with_tool_markup(subs, None) == subs


@pytest.mark.parametrize(("tool_choice", "text", "calls"), [
    ({"type": "function", "function": {"name": "add"}}, '{"a": 1, "b": 2}', [ADD]),
    ("required", '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "add", "parameters": {"a": 1, "b": 2}}]',
     [PARIS, ADD]),
    ("required", '[{"name": "add", "param', []),  # cut short by max_tokens before a call began: text
], ids=["named", "required", "required-cut-short"])
def test_forced_tool_choice_streams_like_the_formats(tool_choice, text, calls):
    forced = ForcedToolChoice.of(TOOLS, tool_choice)
    choice = non_streamed(forced, text)
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"].get("tool_calls", [])]
    assert got == calls and choice["message"]["content"] == (None if calls else text)
    expected = (choice["message"]["content"] or "",
                [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls", [])],
                choice["finish_reason"])
    assert streamed(forced, list(text)) == expected
    for cut in range(len(text) + 1):
        assert streamed(forced, [text[:cut], text[cut:]]) == expected, cut
