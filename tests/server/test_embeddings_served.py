"""POST /v1/embeddings on a served tiny Qwen3 embedding model (--task embed, mean pooling, normalised, chunked
prefill forced by a small token budget) against transformers' AutoModel on the same weights, pooled per the
sentence-transformers config, to 1e-5 in fp32; the Python client's embed; what is refused; nothing held after."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from testing.embedding_fixtures import hf_embeddings, make_embedding_checkpoint
from testing.model_fixtures import random_prompt
from testing.server_process import free_port, start_server, wait_idle
from zserve.client.client import Client

TEXTS = ["Hello world", "Ünïcödé ✓ and a longer sentence, long enough to take several chunks of the budget"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model_dir = make_embedding_checkpoint(tmp_path_factory.mktemp("emb"), "mean")
    port = free_port()
    server = start_server(model_dir, "--task", "embed", "--http-port", str(port), "--num-threads", "1",
                          "--dtype", "float32", "--kv-cache-tokens", "1024", "--page-size", "4",
                          "--max-prefill-tokens", "16")
    yield port, server, model_dir
    assert server.stop() == 0


def post(port: int, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_batch_of_texts_and_token_lists_equals_transformers(served):
    port, server, model_dir = served
    text_ids = [post(port, "/tokenize", {"prompt": t})[1]["tokens"] for t in TEXTS]
    id_lists = [random_prompt(40, seed=1), random_prompt(3, seed=2), random_prompt(17, seed=3)]
    expected = hf_embeddings(model_dir, text_ids + id_lists)
    status, body = post(port, "/v1/embeddings", {"input": TEXTS, "model": model_dir.name})
    assert status == 200, body
    status, by_ids = post(port, "/v1/embeddings", {"input": id_lists, "user": "ignored"})
    assert status == 200, by_ids
    assert body["object"] == "list" and body["model"] == model_dir.name
    data = body["data"] + by_ids["data"]
    assert [d["index"] for d in data] == [0, 1, 0, 1, 2] and {d["object"] for d in data} == {"embedding"}
    ours = np.array([d["embedding"] for d in data], np.float32)
    assert np.abs(ours - expected).max() < 1e-5
    assert np.abs(ours[0] - ours[1]).max() > 1e-2  # different inputs, different vectors
    num_tokens = sum(map(len, id_lists))
    assert by_ids["usage"] == {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
    status, single = post(port, "/v1/embeddings", {"input": id_lists[0]})  # one prompt as token ids
    assert status == 200 and len(single["data"]) == 1
    assert np.abs(np.array(single["data"][0]["embedding"]) - expected[2]).max() < 1e-5


def test_base64_is_the_same_floats(served):
    port, _, _ = served
    floats = post(port, "/v1/embeddings", {"input": TEXTS[0]})[1]["data"][0]["embedding"]
    status, body = post(port, "/v1/embeddings", {"input": TEXTS[0], "encoding_format": "base64"})
    assert status == 200, body
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), "<f4")
    assert decoded.tolist() == np.array(floats, np.float32).tolist()


def test_python_client_embed_and_no_pages_held_after(served):
    port, server, model_dir = served
    ids = random_prompt(23, seed=4)
    with Client(server.port) as client:
        vector = client.embed(input_ids=ids)
        assert vector.dtype == np.float32 and np.abs(vector - hf_embeddings(model_dir, [ids])[0]).max() < 1e-5
        stats = wait_idle(client)
    assert stats["num_used_pages"] == 0 and stats["num_cached_pages"] == 0, stats  # radix cache off: nothing kept


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True}),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}),
])
def test_generation_routes_are_refused_naming_the_task(served, path, body):
    status, answer = post(served[0], path, body)
    assert status == 400 and "--task embed" in answer["error"]["message"], answer


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"input": "hi", "dimensions": 7}, "dimensions", "dimensions must be the model's embedding size, 64"),
    ({"input": []}, "input", "input is empty"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format", "encoding_format"),
    ({"input": "hi", "truncate_prompt_tokens": 8}, "truncate_prompt_tokens", "truncate_prompt_tokens is not supported"),
])
def test_refused_fields_name_the_field(served, body, param, words):
    status, answer = post(served[0], "/v1/embeddings", body)
    assert status == 400 and answer["error"]["param"] == param and words in answer["error"]["message"], answer


def test_matching_dimensions_is_accepted_and_too_long_an_input_is_a_400(served):
    port = served[0]
    assert post(port, "/v1/embeddings", {"input": "hi", "dimensions": 64})[0] == 200
    status, answer = post(port, "/v1/embeddings", {"input": random_prompt(300, seed=5)})
    assert status == 400 and "context" in answer["error"]["message"], answer


def test_generate_refuses_the_native_embed_field(served):
    status, answer = post(served[0], "/generate", {"prompt": "hi", "embed": True})
    assert status == 400 and answer["error"]["param"] == "embed" and "/v1/embeddings" in answer["error"]["message"]
