"""Logprobs through the official `openai` package, checked against transformers' log_softmax on
the same weights (fp32, greedy): the chosen tokens' and the top ones', chat and completions,
streamed and not."""

from __future__ import annotations

import openai
import pytest
import torch

from testing.e2e_fixtures import GreedyOracle
from testing.server_process import free_port, start_server
from zserve.client import Client

PROMPT = "The quick brown fox jumps over"
NUM_TOKENS = 5
TOP = 3


@pytest.fixture(scope="module")
def server(model_dir):
    http_port = free_port()
    handle = start_server(model_dir, "--http-port", str(http_port), "--dtype", "float32", "--num-threads", "1",
                          "--kv-cache-tokens", "4096")
    handle.http_port = http_port
    yield handle
    assert handle.stop() == 0


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="unused", max_retries=0, timeout=60)


@torch.no_grad()
def expected_logprobs(oracle: GreedyOracle, prompt_ids: list[int]) -> list[tuple[int, float, list[tuple[int, float]]]]:
    """(chosen id, its logprob, top (id, logprob)) per greedy step, from transformers."""
    ids, steps = list(prompt_ids), []
    for _ in range(NUM_TOKENS):
        logprobs = torch.log_softmax(oracle.model(torch.tensor([ids])).logits[0, -1].float(), -1)
        values, top_ids = torch.topk(logprobs, TOP)
        chosen = int(top_ids[0])
        steps.append((chosen, float(logprobs[chosen]), list(zip(top_ids.tolist(), values.tolist(), strict=True))))
        ids.append(chosen)
    return steps


def check(oracle, steps, tokens: list[str], logprobs: list[float], tops: list[list[tuple[str, float]]]):
    assert len(tokens) == len(logprobs) == len(tops) == NUM_TOKENS
    for (chosen, lp, top), token, got_lp, got_top in zip(steps, tokens, logprobs, tops, strict=True):
        assert token == oracle.tokenizer.decode([chosen])
        assert got_lp == pytest.approx(lp, abs=1e-4)
        assert [v for _, v in got_top] == pytest.approx([v for _, v in top], abs=1e-4)
        assert [t for t, _ in got_top] == [oracle.tokenizer.decode([i]) for i, _ in top]  # (both empty: checked by the caller)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_chat_logprobs_and_top_logprobs_match_transformers(server, oai, oracle, model_dir, stream):
    messages = [{"role": "user", "content": PROMPT}]
    steps = expected_logprobs(oracle, oracle.chat_ids(messages))
    kwargs = dict(model=model_dir.name, messages=messages, max_tokens=NUM_TOKENS, temperature=0, logprobs=True,
                  top_logprobs=TOP, extra_body={"ignore_eos": True})
    if stream:
        content = [c for chunk in oai.chat.completions.create(stream=True, **kwargs)
                   for choice in chunk.choices if choice.logprobs for c in choice.logprobs.content]
    else:
        content = oai.chat.completions.create(**kwargs).choices[0].logprobs.content
    check(oracle, steps, [c.token for c in content], [c.logprob for c in content],
          [[(t.token, t.logprob) for t in c.top_logprobs] for c in content])
    assert all(bytes(c.bytes) == c.token.encode() for c in content)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_completion_logprobs_match_transformers(server, oai, oracle, model_dir, stream):
    steps = expected_logprobs(oracle, oracle.encode(PROMPT))
    kwargs = dict(model=model_dir.name, prompt=PROMPT, max_tokens=NUM_TOKENS, temperature=0, logprobs=TOP,
                  extra_body={"ignore_eos": True})
    if stream:
        parts = [choice.logprobs for chunk in oai.completions.create(stream=True, **kwargs) for choice in chunk.choices if choice.logprobs]
        tokens = [t for p in parts for t in p.tokens]
        lps = [v for p in parts for v in p.token_logprobs]
        tops = [top for p in parts for top in p.top_logprobs]
    else:
        lp = oai.completions.create(**kwargs).choices[0].logprobs
        tokens, lps, tops = lp.tokens, lp.token_logprobs, lp.top_logprobs
    # the legacy shape maps token text -> logprob: two ids that decode alike share one entry, as in OpenAI's and vLLM's
    expected_tops = [list({oracle.tokenizer.decode([i]): v for i, v in top}.items()) for _, _, top in steps]
    assert [[t for t, _ in top.items()] for top in tops] == [[t for t, _ in e] for e in expected_tops]
    check(oracle, [(c, lp, []) for c, lp, _ in steps], tokens, lps, [[] for _ in tops])
    for top, expected in zip(tops, expected_tops, strict=True):
        assert list(top.values()) == pytest.approx([v for _, v in expected], abs=1e-4)


def test_without_logprobs_the_field_is_null(server, oai, model_dir):
    r = oai.completions.create(model=model_dir.name, prompt=PROMPT, max_tokens=2, temperature=0)
    assert r.choices[0].logprobs is None


def test_generate_route_returns_top_logprobs_and_refuses_n(server, oracle):
    import json
    import urllib.request

    steps = expected_logprobs(oracle, oracle.encode(PROMPT))

    def post(body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/generate", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, body = post({"prompt": PROMPT, "max_tokens": NUM_TOKENS, "ignore_eos": True, "top_logprobs": TOP})
    assert status == 200 and body["output_ids"] == [c for c, _, _ in steps]
    assert body["logprobs"] == pytest.approx([lp for _, lp, _ in steps], abs=1e-4)
    assert [[i for i, _ in top] for top in body["top_logprobs"]] == [[i for i, _ in top] for _, _, top in steps]
    status, body = post({"prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 1})
    assert status == 200 and body["prompt_ids"] == oracle.encode(PROMPT) and body["prompt_logprobs"][0] is None
    assert len(body["prompt_logprobs"]) == len(body["prompt_top_logprobs"]) == len(body["prompt_ids"])
    status, body = post({"prompt": PROMPT, "n": 2})
    assert status == 400 and body["error"]["param"] == "n"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_completion_echo_returns_the_prompt_and_its_logprobs(server, oai, oracle, model_dir, stream):
    """`echo` with `logprobs`: the text starts with the prompt, and the logprobs cover the prompt's
    tokens first (the first with null, as in OpenAI's API), each equal to transformers' log_softmax
    over the prompt, then the completion's; text offsets run over the whole text."""
    ids = oracle.encode(PROMPT)
    with torch.no_grad():
        logprobs = torch.log_softmax(oracle.model(torch.tensor([ids])).logits[0].float(), -1)
    prompt_lps = [float(logprobs[p - 1, ids[p]]) for p in range(1, len(ids))]
    steps = expected_logprobs(oracle, ids)
    kwargs = dict(model=model_dir.name, prompt=PROMPT, max_tokens=NUM_TOKENS, temperature=0, logprobs=TOP, echo=True,
                  extra_body={"ignore_eos": True})
    if stream:
        chunks = [choice for chunk in oai.completions.create(stream=True, **kwargs) for choice in chunk.choices]
        text = "".join(c.text for c in chunks)
        parts = [c.logprobs for c in chunks if c.logprobs]
        tokens = [t for p in parts for t in p.tokens]
        lps = [v for p in parts for v in p.token_logprobs]
        tops = [top for p in parts for top in p.top_logprobs]
        offsets = [o for p in parts for o in p.text_offset]
    else:
        choice = oai.completions.create(**kwargs).choices[0]
        text, lp = choice.text, choice.logprobs
        tokens, lps, tops, offsets = lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset
    completion = oracle.decode([c for c, _, _ in steps])
    assert text == PROMPT + completion
    assert tokens == [oracle.tokenizer.decode([i]) for i in ids] + [oracle.tokenizer.decode([c]) for c, _, _ in steps]
    assert lps[0] is None and tops[0] is None
    assert lps[1:] == pytest.approx(prompt_lps + [lp for _, lp, _ in steps], abs=1e-4)
    assert all(len(top) >= 1 for top in tops[1:])
    assert offsets[len(ids)] == len(PROMPT) and offsets == sorted(offsets)


def test_completion_echo_without_logprobs_and_with_token_ids(server, oai, oracle, model_dir):
    r = oai.completions.create(model=model_dir.name, prompt=PROMPT, max_tokens=3, temperature=0, echo=True)
    assert r.choices[0].text.startswith(PROMPT) and r.choices[0].logprobs is None
    ids = oracle.encode(PROMPT)
    r = oai.completions.create(model=model_dir.name, prompt=ids, max_tokens=3, temperature=0, echo=True, logprobs=0)
    choice = r.choices[0]
    assert choice.text.startswith(oracle.tokenizer.decode(ids)) and len(choice.logprobs.tokens) == len(ids) + 3
    assert r.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_completion_echo_with_max_tokens_zero_scores_the_prompt_only(server, oai, oracle, model_dir, stream):
    """lm-eval-harness' loglikelihood request: echo, logprobs, max_tokens 0. The answer is the prompt
    and its logprobs (transformers' log_softmax, the first null), finish "length", 0 completion tokens."""
    ids = oracle.encode(PROMPT)
    with torch.no_grad():
        logprobs = torch.log_softmax(oracle.model(torch.tensor([ids])).logits[0].float(), -1)
    prompt_lps = [float(logprobs[p - 1, ids[p]]) for p in range(1, len(ids))]
    kwargs = dict(model=model_dir.name, prompt=PROMPT, max_tokens=0, temperature=0, logprobs=1, echo=True)
    if stream:
        chunks = list(oai.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
        choices = [choice for chunk in chunks for choice in chunk.choices]
        assert len(choices) == 1
        usage = chunks[-1].usage
    else:
        r = oai.completions.create(**kwargs)
        choices, usage = r.choices, r.usage
    choice = choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert choice.logprobs.tokens == [oracle.tokenizer.decode([i]) for i in ids]
    assert choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(prompt_lps, abs=1e-4)
    assert choice.logprobs.text_offset[0] == 0 and len(choice.logprobs.top_logprobs) == len(ids)
    assert usage.prompt_tokens == len(ids) and usage.completion_tokens == 0
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        oai.completions.create(model=model_dir.name, prompt=PROMPT, max_tokens=0)


def test_python_client_gets_token_texts_ready_made(server, oracle):
    """The detokenizer attaches every text the answers above show: the Python client gets them too
    (each output and top token's own text, the prompt tokens', and the prompt of ids as text)."""
    ids = oracle.encode(PROMPT)
    with Client(server.port) as client:
        r = client.generate(input_ids=ids, max_tokens=NUM_TOKENS, top_logprobs=TOP, prompt_logprobs=2, return_prompt_text=True)
    assert r.token_texts == [oracle.tokenizer.decode([i]) for i in r.output_ids]
    assert r.top_logprob_texts == [[oracle.tokenizer.decode([i]) for i, _ in top] for top in r.top_logprobs]
    assert r.prompt_token_texts == [oracle.tokenizer.decode([i]) for i in ids]
    assert r.prompt_top_logprob_texts[0] is None
    assert r.prompt_top_logprob_texts[1:] == [[oracle.tokenizer.decode([i]) for i, _ in top] for top in r.prompt_top_logprobs[1:]]
    assert r.prompt_text == oracle.tokenizer.decode(ids)
