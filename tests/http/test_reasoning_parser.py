"""--reasoning-parser: the thinking split from the answer, whole and streamed (cut at every character),
and the chat response shapes (message.reasoning_content, delta.reasoning_content, with tools)."""

from __future__ import annotations

import itertools
import json

import pytest

from zserve.client.types import GenerateResult
from zserve.http_proc.apis.openai.chat_formatter import ChatFormatter
from zserve.http_proc.apis.openai.protocol import ChatCompletionRequest
from zserve.http_proc.reasoning import ReasoningOptions, ReasoningParser
from zserve.http_proc.shared.request_group import ChoiceEvent
from zserve.http_proc.tools.parser import ToolCallParser

QWEN3 = ReasoningParser("qwen3")
R1 = ReasoningParser("deepseek-r1")
OFF = {"enable_thinking": False}
# (parser, chat_template_kwargs, text) -> (reasoning, content)
CASES = [
    (QWEN3, None, "<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.", ("\nLet me see: 2+2.\n", "\n\nIt is 4.")),
    (QWEN3, None, "the template opened it</think>answer", ("the template opened it", "answer")),  # <think> in the prompt
    (QWEN3, None, "<think>cut by max_tokens", ("cut by max_tokens", "")),
    (QWEN3, None, "no tags: all thinking", ("no tags: all thinking", "")),  # thinking on: as vLLM and SGLang
    (QWEN3, OFF, "It is 4.", ("", "It is 4.")),  # thinking off: the template closed an empty <think> in the prompt
    (QWEN3, OFF, "a stray </think> stays", ("", "a stray </think> stays")),
    (QWEN3, OFF, "<think>it thinks anyway</think>4", ("it thinks anyway", "4")),
    (R1, None, "R1 starts thinking</think>The answer is 42.", ("R1 starts thinking", "The answer is 42.")),
    (R1, OFF, "<think>0528 writes the tag</think>42", ("0528 writes the tag", "42")),
    (R1, None, "a < b, </thin is not it</think>ok </think> twice", ("a < b, </thin is not it", "ok </think> twice")),
    (QWEN3, None, "<thi", ("<thi", "")),
    (QWEN3, OFF, "<thi", ("", "<thi")),
    (QWEN3, None, "", ("", "")),
    (QWEN3, None, "<think>思考 🙂</think>答え", ("思考 🙂", "答え")),
]


@pytest.mark.parametrize("parser, kwargs, text, expected", CASES)
def test_split(parser, kwargs, text, expected):
    assert parser.split(text, kwargs) == expected


@pytest.mark.parametrize("parser, kwargs, text, expected", CASES)
def test_streamed_deltas_concatenate_to_the_split_wherever_the_text_is_cut(parser, kwargs, text, expected):
    cuts = range(len(text) + 1)
    pairs = list(itertools.combinations(cuts, 2)) if len(text) <= 48 else [(i, j) for i in cuts for j in (i + 1, i + 7)]
    for a, b in [(0, 0), *pairs]:  # every single cut, and two cuts (every pair for the short texts)
        pieces = [text[:a], text[a:b], text[b:]]
        split = parser.splitter(kwargs)
        outs = [split.feed(p) for p in pieces] + [split.finish()]
        assert ("".join(r for r, _ in outs), "".join(c for _, c in outs)) == expected, (a, b)
        # nothing is given out early: reasoning never holds a partial tag, content never precedes the end tag
        assert all("</think>" not in r for r, _ in outs)
    # one character at a time
    split = parser.splitter(kwargs)
    outs = [split.feed(ch) for ch in text] + [split.finish()]
    assert ("".join(r for r, _ in outs), "".join(c for _, c in outs)) == expected


def test_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="qwen3, deepseek-r1"):
        ReasoningParser("granite")
    assert ReasoningParser.of("none") is None and ReasoningParser.of("qwen3") == QWEN3


def result(text: str, finish: str | None) -> GenerateResult:
    r = GenerateResult(req_id=1, text=text, output_ids=list(range(len(text))))
    r.finish_reason = finish
    return r


def streamed(fmt: ChatFormatter, pieces: list[str]) -> list[dict]:
    text, deltas = "", []
    for piece in pieces:
        text += piece
        deltas += deltas_of(fmt.event_chunk(ChoiceEvent(0, piece, [0], result(text, None))))
    return deltas + deltas_of(fmt.event_chunk(ChoiceEvent(0, "", [], result(text, "stop"))))


def deltas_of(blob: bytes | None) -> list[dict]:
    """The deltas of an event's SSE chunks (a streamed tool call may take several)."""
    return [json.loads(part[len(b"data: "):])["choices"][0]["delta"] for part in (blob or b"").split(b"\n\n") if part]


def joined(deltas: list[dict], key: str) -> str:
    return "".join(d.get(key, "") for d in deltas)


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "2+2?"}], **fields)


PIECES = ["<thi", "nk>\nLet me", " see.</th", "ink>\n\nIt is", " 4."]


def test_message_and_deltas_carry_reasoning_content():
    request = chat()
    fmt = ChatFormatter(model_name="m", reasoning=request.reasoning(QWEN3))
    body = fmt.body(request.sub_requests(), [result("".join(PIECES), "stop")])
    assert body["choices"][0]["message"] == {
        "role": "assistant", "content": "\n\nIt is 4.", "reasoning_content": "\nLet me see.",
    }
    deltas = streamed(ChatFormatter(model_name="m", reasoning=request.reasoning(QWEN3)), PIECES)
    assert joined(deltas, "reasoning_content") == "\nLet me see." and joined(deltas, "content") == "\n\nIt is 4."
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(not d.get("reasoning_content") for d in deltas[first_content + 1:])


def test_separate_reasoning_false_keeps_the_thinking_in_content_and_no_parser_changes_nothing():
    text = "".join(PIECES)
    for request, parser in [(chat(separate_reasoning=False), QWEN3), (chat(), None)]:
        fmt = ChatFormatter(model_name="m", reasoning=request.reasoning(parser))
        assert fmt.body(request.sub_requests(), [result(text, "stop")])["choices"][0]["message"] == {
            "role": "assistant", "content": text,
        }
        deltas = streamed(ChatFormatter(model_name="m", reasoning=request.reasoning(parser)), PIECES)
        assert joined(deltas, "content") == text and not joined(deltas, "reasoning_content")


def test_stream_reasoning_false_sends_the_thinking_in_one_delta_once_it_ends():
    request = chat(stream_reasoning=False)
    deltas = streamed(ChatFormatter(model_name="m", reasoning=request.reasoning(QWEN3)), PIECES)
    assert [d["reasoning_content"] for d in deltas if d.get("reasoning_content")] == ["\nLet me see."]
    assert joined(deltas, "content") == "\n\nIt is 4."
    cut = streamed(ChatFormatter(model_name="m", reasoning=request.reasoning(QWEN3)), ["<think>a", "b", "c"])
    assert [d.get("reasoning_content") for d in cut] == ["abc"]  # cut short: sent at the end


def test_thinking_off_answers_in_content():
    request = chat(chat_template_kwargs=OFF)
    fmt = ChatFormatter(model_name="m", reasoning=request.reasoning(QWEN3))
    message = fmt.body(request.sub_requests(), [result("It is 4.", "stop")])["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "It is 4.", "reasoning_content": None}
    assert request.sub_requests()[0].prompt["chat_template_kwargs"] == OFF  # and it reaches the template


def test_tool_calls_are_parsed_from_the_content_after_the_thinking():
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    text = "<think>I should call add.</think>\n\n" + call
    request = chat(tools=tools)
    hermes = request.tool_parser(ToolCallParser("hermes"))
    body = ChatFormatter(model_name="m", tool_parser=hermes, reasoning=request.reasoning(QWEN3)).body(
        request.sub_requests(), [result(text, "stop")])
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning_content"] == "I should call add."
    assert choice["message"]["content"] is None
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"a": 1, "b": 2}
    pieces = [text[i:i + 5] for i in range(0, len(text), 5)]
    deltas = streamed(ChatFormatter(model_name="m", tool_parser=hermes, reasoning=request.reasoning(QWEN3)), pieces)
    assert joined(deltas, "reasoning_content") == "I should call add."
    assert joined(deltas, "content").strip() == ""  # the call never streams as content
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert calls[0]["function"] == {"name": "add", "arguments": ""}  # the name first, then the arguments in pieces
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"a": 1, "b": 2}


@pytest.mark.parametrize("fields, grammar", [
    ({"response_format": {"type": "json_object"}}, "json_object"),
    ({"regex": "[0-9]+"}, "regex"),
    ({"guided_choice": ["yes", "no"]}, "ebnf"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}, "json_schema"),
    ({"tools": [{"type": "function", "function": {"name": "add"}}], "tool_choice": "required"}, "json_schema"),
])
def test_with_thinking_on_a_grammar_starts_after_the_think_end_ids(fields, grammar):
    think = ReasoningParser("qwen3", end_ids=(7, 8))
    [sub] = chat(**fields).thinking_first(chat(**fields).sub_requests(), think)
    assert sub.sampling["grammar_after"] == [7, 8] and grammar in sub.sampling
    assert chat(**fields).reasoning(think) == ReasoningOptions(think)  # no refusal: the thinking is split as ever
    r1 = ReasoningParser("deepseek-r1", end_ids=(9,))  # deepseek-r1 always thinks
    r1_request = chat(**fields, chat_template_kwargs=OFF)
    assert r1_request.thinking_first(r1_request.sub_requests(), r1)[0].sampling["grammar_after"] == [9]
    for request, parser in [(chat(**fields, chat_template_kwargs=OFF), think), (chat(**fields), None)]:
        [sub] = request.thinking_first(request.sub_requests(), parser)  # thinking off, or no parser: from the start
        assert "grammar_after" not in sub.sampling and grammar in sub.sampling
    [free] = chat().thinking_first(chat().sub_requests(), think)  # no grammar: nothing to wait for
    assert "grammar_after" not in free.sampling


def test_a_forced_tool_call_while_thinking_needs_the_thinking_split_off():
    from zserve.http_proc.shared.api_error import ApiError

    forced = {"tools": [{"type": "function", "function": {"name": "add"}}], "tool_choice": "required"}
    with pytest.raises(ApiError) as caught:
        chat(**forced, separate_reasoning=False).reasoning(QWEN3)
    assert caught.value.status == 400 and caught.value.param == "separate_reasoning"
    assert chat(**forced, separate_reasoning=False, chat_template_kwargs=OFF).reasoning(QWEN3) is None  # no thinking
    assert chat(response_format={"type": "json_object"}, separate_reasoning=False).reasoning(QWEN3) is None  # raw text


def test_the_flag_takes_vllms_and_sglangs_spellings():
    from zserve.launcher.cli import build_parser

    parser = build_parser()
    assert [parser.parse_args(["--reasoning-parser", name]).reasoning_parser
            for name in ("qwen3", "deepseek-r1", "deepseek_r1")] == ["qwen3", "deepseek-r1", "deepseek-r1"]
    assert parser.parse_args([]).reasoning_parser == "none"
