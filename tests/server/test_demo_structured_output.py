"""Structured output on the real demo model (issue 16's acceptance): 30 generated JSON schemas
(nested objects, arrays, enums, required fields, bounded numbers) all answered with JSON that
validates; JSON mode always parses; a regex answer matches."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from testing.json_schemas import random_schemas
from testing.server_process import start_server
from zserve.client import Client
from zserve.launcher.demo_model import demo_model_dir, missing_files

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(missing_files(demo_model_dir())), reason="demo model not fetched (scripts/test.sh fetches it)"),
]


@pytest.fixture(scope="module")
def server():
    handle = start_server(demo_model_dir(), "--kv-cache-tokens", "16384")
    yield handle
    assert handle.stop() == 0, handle.log()


def ask(fields) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write a JSON object with the fields {', '.join(fields)}."}]


def test_thirty_generated_schemas_all_validate(server):
    schemas = random_schemas(30)
    assert len({json.dumps(s, sort_keys=True) for s in schemas}) == 30
    with Client(server.port, timeout_s=600) as c:
        req_ids = [c.submit(messages=ask(s["properties"]), max_tokens=400, json_schema=s) for s in schemas]
        results = [c.result(req_id) for req_id in req_ids]
    for schema, result in zip(schemas, results, strict=True):
        assert result.finish_reason == "stop", result
        jsonschema.validate(json.loads(result.text), schema)


def test_json_mode_always_parses_and_regex_matches(server):
    prompts = ["Describe Paris.", "List three colors.", "Who wrote Hamlet?", "Give me a recipe.", "What is 2 + 2?"]
    with Client(server.port, timeout_s=600) as c:
        req_ids = [c.submit(messages=[{"role": "user", "content": p}], max_tokens=300, json_object=True, temperature=0.8, seed=i)
                   for i, p in enumerate(prompts)]
        for req_id in req_ids:
            result = c.result(req_id)
            assert result.finish_reason == "stop" and isinstance(json.loads(result.text), dict), result
        date = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
        result = c.generate(messages=[{"role": "user", "content": "When did the Berlin wall fall? Answer with a date."}],
                            max_tokens=20, regex=date)
        assert re.fullmatch(date, result.text), result.text
        free = c.generate(messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=16)
        assert "Paris" in free.text  # free requests on the same server are untouched
