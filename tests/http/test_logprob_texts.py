"""The OpenAI logprob shapes and echoes built from the token texts that come with a result (the
detokenizer's): the HTTP process decodes nothing itself."""

from __future__ import annotations

import json

from zserve.client.types import GenerateResult, Usage
from zserve.http_proc.apis.openai.chat_formatter import ChatFormatter
from zserve.http_proc.apis.openai.completion_formatter import CompletionFormatter
from zserve.http_proc.apis.openai.protocol import ChatCompletionRequest, CompletionRequest
from zserve.http_proc.apis.openai.route import echoed
from zserve.http_proc.shared.request_group import ChoiceEvent


def logprob_result() -> GenerateResult:
    """Two output tokens, the second a piece of a character (U+FFFD), with two top logprobs each."""
    return GenerateResult(
        1, text=" ok", output_ids=[11, 12], finish_reason="length", usage=Usage(3, 2, 0),
        logprobs=[-0.1, -0.2], top_logprobs=[[(11, -0.1), (13, -2.0)], [(12, -0.2), (14, -3.0)]],
        token_texts=[" o", "\ufffd"], top_logprob_texts=[[" o", " a"], ["\ufffd", "k"]],
        prompt_ids=[1, 2, 3], prompt_logprobs=[None, -1.0, -1.5],
        prompt_top_logprobs=[None, [(2, -1.0)], [(9, -0.5)]],
        prompt_token_texts=["A", "B", "C"], prompt_top_logprob_texts=[None, ["B"], ["Z"]], prompt_text="ABC",
    )


def test_chat_logprobs_use_the_attached_texts():
    fmt = ChatFormatter(model_name="m", wants_logprobs=True)
    subs = ChatCompletionRequest(messages=[{"role": "user", "content": "a"}], logprobs=True, top_logprobs=2).sub_requests()
    [choice] = fmt.body(subs, [logprob_result()])["choices"]
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [" o", "\ufffd"]
    assert content[1]["bytes"] == list("\ufffd".encode())
    assert [[t["token"] for t in c["top_logprobs"]] for c in content] == [[" o", " a"], ["\ufffd", "k"]]
    assert [t["logprob"] for t in content[0]["top_logprobs"]] == [-0.1, -2.0]


def test_completion_echo_of_token_ids_shows_the_servers_prompt_text_and_its_logprobs():
    [sub] = CompletionRequest(prompt=[1, 2, 3], echo=True, logprobs=1).sub_requests()
    sub = echoed(sub)
    assert sub.sampling["return_prompt_text"] is True  # the server decodes the prompt, here nothing does
    [text_sub] = CompletionRequest(prompt="ABC", echo=True).sub_requests()
    assert "return_prompt_text" not in echoed(text_sub).sampling  # a text prompt is echoed as sent
    fmt = CompletionFormatter(model_name="m", wants_logprobs=True, echoes={0: None})
    [choice] = fmt.body([sub], [logprob_result()])["choices"]
    assert choice["text"] == "ABC ok"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["A", "B", "C", " o", "\ufffd"]
    assert lp["token_logprobs"] == [None, -1.0, -1.5, -0.1, -0.2]
    assert lp["top_logprobs"] == [None, {"B": -1.0}, {"Z": -0.5}, {" o": -0.1, " a": -2.0}, {"\ufffd": -0.2, "k": -3.0}]
    assert lp["text_offset"] == [0, 1, 2, 3, 5]


def test_streamed_echo_sends_the_prompt_text_in_the_first_chunk():
    [sub] = CompletionRequest(prompt=[1, 2, 3], echo=True).sub_requests()
    fmt = CompletionFormatter(model_name="m", echoes={0: None})
    first = GenerateResult(1, text=" o", output_ids=[11], prompt_text="ABC")
    chunk = fmt.event_chunk(ChoiceEvent(0, " o", [11], first))
    body = json.loads(chunk.removeprefix(b"data: "))
    assert body["choices"][0]["text"] == "ABC o" and body["choices"][0]["logprobs"] is None
    later = fmt.event_chunk(ChoiceEvent(0, "k", [12], GenerateResult(1, text=" ok", output_ids=[11, 12], prompt_text="ABC")))
    assert json.loads(later.removeprefix(b"data: "))["choices"][0]["text"] == "k"
