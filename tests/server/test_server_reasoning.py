"""--reasoning-parser qwen3 on a real server, read with the openai SDK: chat_template_kwargs reach the
chat template (enable_thinking false adds the template's empty think block to the prompt), the
thinking comes back as reasoning_content, streamed and not, and a grammar waits for the thinking to end.

The tiny model is random and never writes `</think>`: with thinking on, its whole answer is
thinking (the tags' split itself is tested in tests/http/test_reasoning_parser.py). The raw text
(separate_reasoning false) is the oracle for what each field must hold.
"""

from __future__ import annotations

import json

import pytest

from testing.qwen3_thinking import make_tiny_qwen3_thinking
from testing.server_process import free_port, start_server

MESSAGES = [{"role": "user", "content": "Why is the sky blue?"}]
GREEDY = {"max_tokens": 8, "temperature": 0}
EXTRA = {"ignore_eos": True}


@pytest.fixture(scope="module")
def oai(tmp_path_factory):
    import openai

    model_dir = make_tiny_qwen3_thinking(tmp_path_factory.mktemp("qwen3_thinking"))
    port = free_port()
    server = start_server(model_dir, "--http-port", str(port), "--reasoning-parser", "qwen3", "--dtype", "float32",
                          "--num-threads", "1", "--kv-cache-tokens", "4096")
    try:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0), model_dir.name
    finally:
        assert server.stop() == 0


def ask(oai, **extra_body):
    client, model = oai
    return client.chat.completions.create(model=model, messages=MESSAGES, **GREEDY, extra_body={**EXTRA, **extra_body})


def test_thinking_comes_back_as_reasoning_content(oai):
    raw = ask(oai, separate_reasoning=False).choices[0].message
    assert raw.content and getattr(raw, "reasoning_content", None) is None
    answer = ask(oai)
    message = answer.choices[0].message
    assert message.reasoning_content == raw.content and message.content is None
    assert answer.usage.completion_tokens == GREEDY["max_tokens"]  # usage counts the thinking's tokens
    client, model = oai
    stream = client.chat.completions.create(model=model, messages=MESSAGES, stream=True, **GREEDY, extra_body=EXTRA)
    deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == raw.content
    assert "".join(d.content or "" for d in deltas) == ""


def test_enable_thinking_false_reaches_the_template_and_answers_in_content(oai):
    thinking = ask(oai)
    plain = ask(oai, chat_template_kwargs={"enable_thinking": False})
    # the template's "<think>\n\n</think>\n\n" is in the prompt (the byte-level tokenizer: several tokens)
    assert plain.usage.prompt_tokens > thinking.usage.prompt_tokens + 4
    message = plain.choices[0].message
    assert message.content and getattr(message, "reasoning_content", None) is None


def test_a_grammar_waits_for_the_thinking_to_end_and_runs_with_thinking_off(oai):
    # the model never writes </think> here: the grammar never starts, the answer is all free thinking
    client, model = oai
    raw = client.chat.completions.create(model=model, messages=MESSAGES, **GREEDY,
                                         extra_body={"separate_reasoning": False}).choices[0].message.content
    message = client.chat.completions.create(model=model, messages=MESSAGES, **GREEDY,
                                             response_format={"type": "json_object"}).choices[0].message
    assert raw and message.reasoning_content == raw and message.content is None
    answer = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=40, temperature=0, response_format={"type": "json_object"},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert json.loads(answer.choices[0].message.content) is not None  # thinking off: constrained from the start
