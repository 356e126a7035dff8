"""Structured output with xgrammar on a real server: whatever the (random) model prefers, the text
follows the grammar (a JSON schema, a regex, an EBNF grammar) and then ends; a spec xgrammar
refuses is a clear error for that request; requests under a grammar share steps with free ones."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest

from testing.server_process import start_server
from zserve.client import Client, InvalidRequestError

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["color", "size"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(model_dir):
    handle = start_server(model_dir, "--dtype", "float32", "--num-threads", "1", "--kv-cache-tokens", "4096")
    yield handle
    assert handle.stop() == 0


def test_json_schema_regex_and_ebnf_outputs_follow_their_grammar(server):
    with Client(server.port, timeout_s=120) as c:
        for seed in range(3):
            r = c.generate("Give me a thing:", max_tokens=60, temperature=1.0, seed=seed, json_schema=SCHEMA)
            assert r.finish_reason == "stop", r
            jsonschema.validate(json.loads(r.text), SCHEMA)
        r = c.generate("Code:", max_tokens=30, temperature=1.0, seed=1, regex=r"[a-c]{3}-[0-9]{2}")
        assert r.finish_reason == "stop" and re.fullmatch(r"[a-c]{3}-[0-9]{2}", r.text), r.text
        r = c.generate("Answer:", max_tokens=30, temperature=1.0, seed=2, ebnf='root ::= "yes" | "no" | "maybe"')
        assert r.finish_reason == "stop" and r.text in ("yes", "no", "maybe"), r.text


def test_constrained_and_free_requests_in_one_batch_and_n_copies(server):
    with Client(server.port, timeout_s=120) as c:
        free = c.submit("Hello", max_tokens=20, ignore_eos=True)
        constrained = c.submit("Hello", max_tokens=60, json_schema=SCHEMA, n=3, temperature=1.0, seed=5)
        results = [c.result(constrained + i) for i in range(3)]
        assert len(c.result(free).output_ids) == 20
    for r in results:
        jsonschema.validate(json.loads(r.text), SCHEMA)


def test_bad_specs_are_refused_with_the_reason(server):
    with Client(server.port, timeout_s=60) as c:
        with pytest.raises(InvalidRequestError, match=r"regex cannot be used: .*Unclosed"):
            c.generate("x", regex="[abc")
        with pytest.raises(InvalidRequestError, match="json_schema is not JSON"):
            c.generate("x", json_schema="{not json")
        with pytest.raises(InvalidRequestError, match="at most one of"):
            c.generate("x", regex="a", json_object=True)
        with pytest.raises(InvalidRequestError, match="ignore_eos cannot be used with structured output"):
            c.generate("x", regex="a", ignore_eos=True)
        with pytest.raises(InvalidRequestError, match="min_tokens cannot be used with structured output"):
            c.generate("x", json_object=True, min_tokens=3)
        assert c.generate("still serving", max_tokens=3).finish_reason in ("stop", "length")


def test_openai_response_format_through_http(model_dir):
    import openai

    from testing.server_process import free_port

    http_port = free_port()
    server = start_server(model_dir, "--http-port", str(http_port), "--num-threads", "1", "--kv-cache-tokens", "4096")
    try:
        oai = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "A color and a size, as JSON."}]
        r = oai.chat.completions.create(
            model=model_dir.name, messages=messages, max_tokens=60, temperature=1.0, seed=3,
            response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}},
        )
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
        r = oai.completions.create(model=model_dir.name, prompt="Code:", max_tokens=20, extra_body={"regex": "[0-9]{4}"})
        assert re.fullmatch("[0-9]{4}", r.choices[0].text)
        with pytest.raises(openai.BadRequestError, match="regex cannot be used"):
            oai.completions.create(model=model_dir.name, prompt="x", max_tokens=5, extra_body={"regex": "(unclosed"})
    finally:
        assert server.stop() == 0


def test_grammar_backend_none_refuses_structured_output_and_serves_the_rest(model_dir):
    server = start_server(model_dir, "--grammar-backend", "none", "--num-threads", "1", "--kv-cache-tokens", "2048")
    try:
        with Client(server.port, timeout_s=60) as c:
            with pytest.raises(InvalidRequestError, match=r"structured output is off on this server \(--grammar-backend none\)"):
                c.generate("x", json_schema=SCHEMA)
            assert c.generate("still serving", max_tokens=3).finish_reason in ("stop", "length")
        assert "structured output ready" not in server.log()
    finally:
        assert server.stop() == 0


def test_the_compiler_is_readied_at_startup(model_dir):
    """xgrammar and the vocabulary index are loaded in the background at startup, not by the first
    constrained request: a server that got no request logs them ready."""
    server = start_server(model_dir, "--num-threads", "1", "--kv-cache-tokens", "2048")
    try:
        deadline = time.monotonic() + 30
        while "structured output ready (xgrammar" not in server.log():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.1)
    finally:
        assert server.stop() == 0


def test_constrained_requests_survive_retraction_and_abort(model_dir):
    """A pool too small for 8 requests running to the context retracts some; a retracted request
    resumes with its matcher where its output left it (the output is folded into its prompt), so
    every text still follows the grammar, and the grammar never refuses a token it allowed."""
    handle = start_server(
        model_dir, "--dtype", "float32", "--page-size", "4", "--kv-cache-tokens", "256", "--context-length", "128",
        "--num-threads", "1", "--chunked-prefill-size", "64",
    )
    pattern = r"(abc-){200}"  # 800 characters: never complete within the context, so each request runs to it
    try:
        with Client(handle.port, timeout_s=180) as c:
            aborted = c.submit("Story 99:", regex=pattern, temperature=1.0, seed=99, max_tokens=None)
            c.abort(aborted)
            req_ids = [c.submit(f"Story {i}:", regex=pattern, temperature=1.0, seed=i, max_tokens=None) for i in range(8)]
            results = [c.result(req_id) for req_id in req_ids]
            stats = c.stats()
        for r in results:
            assert r.finish_reason == "length" and re.fullmatch(r"(abc-)*(a|ab|abc)?", r.text), r.text
        assert stats["num_retracted"] > 0, stats
        log = handle.log()
        assert "retracted:" in log and "the grammar refused" not in log
    finally:
        assert handle.stop() == 0, handle.log()
