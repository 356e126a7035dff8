"""LoRA adapters served (--enable-lora --lora-modules): one burst mixing three adapters and the base model, each
request's greedy tokens equal to transformers on the base checkpoint with its adapter merged (PEFT's
merge_and_unload, computed by testing/lora_fixtures.py), in fp32; the OpenAI routes' `model: <adapter>` and
/generate's lora_path; an unknown adapter a 404 naming it."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest

from testing.e2e_fixtures import GreedyOracle
from testing.lora_fixtures import build_peft_adapter, merge_adapter
from testing.server_process import free_port, start_server
from zserve.client import AsyncClient, Client, InvalidRequestError

# three adapters: two on every projection (ranks 4 and 8), one on q and v only (PEFT's default targets)
ADAPTERS = {"sql": dict(seed=1, rank=4), "chat": dict(seed=2, rank=8, alpha=4.0),
            "qv": dict(seed=3, rank=2, targets=("q_proj", "v_proj"))}
PROMPTS = [[5, 17, 99, 3, 42, 7, 8, 120, 33], [200, 11, 64, 64, 9, 150, 71, 2, 18, 19, 23, 80, 44]]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def lora_setup(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    oracles = {None: GreedyOracle(model_dir)}
    paths = {}
    for name, kw in ADAPTERS.items():
        paths[name] = build_peft_adapter(root / name, model_dir, **kw)
        oracles[name] = GreedyOracle(merge_adapter(model_dir, paths[name], root / f"{name}-merged"))
    http_port = free_port()
    modules = [f"{name}={path}" for name, path in paths.items()]
    server = start_server(model_dir, "--dtype", "float32", "--num-threads", "1", "--kv-cache-tokens", "4096",
                          "--page-size", "4", "--enable-lora", "--lora-modules", *modules, "--http-port", str(http_port))
    yield server, http_port, oracles
    assert server.stop() == 0


def expected(oracles, name, ids):
    return oracles[name].greedy(ids, MAX_TOKENS)


def test_a_burst_mixing_three_adapters_and_the_base_model_matches_each_merged_checkpoint(lora_setup):
    server, _, oracles = lora_setup
    bodies = [{"input_ids": ids, "lora_path": name} for ids in PROMPTS for name in (None, *ADAPTERS)]

    async def burst():
        async with AsyncClient(server.port, timeout_s=60) as c:
            return await c.results(await c.submit_all(bodies, max_tokens=MAX_TOKENS))

    results = asyncio.run(burst())
    for body, result in zip(bodies, results, strict=True):
        assert result.output_ids == expected(oracles, body["lora_path"], body["input_ids"]), body["lora_path"]
    # the adapters change the answer (else the test proves nothing), and the same prompt twice under one
    # adapter (its K/V now cached under that adapter only) answers the same
    assert len({tuple(r.output_ids) for r in results[:4]}) > 1
    with Client(server.port, timeout_s=60) as c:
        for name in (None, *ADAPTERS):
            again = c.generate(input_ids=PROMPTS[1], lora_path=name, max_tokens=MAX_TOKENS)
            assert again.output_ids == expected(oracles, name, PROMPTS[1])


def test_n_copies_share_the_adapter(lora_setup):
    server, _, oracles = lora_setup
    with Client(server.port, timeout_s=60) as c:
        req_id = c.submit(input_ids=PROMPTS[0], lora_path="chat", n=3, max_tokens=MAX_TOKENS)
        outputs = [c.result(req_id + i).output_ids for i in range(3)]
    assert outputs == [expected(oracles, "chat", PROMPTS[0])] * 3


def test_an_unknown_adapter_is_refused_naming_it(lora_setup):
    server, _, _ = lora_setup
    with Client(server.port, timeout_s=60) as c, pytest.raises(InvalidRequestError, match="'nope' does not exist"):
        c.generate(input_ids=PROMPTS[0], lora_path="nope", max_tokens=2)


def _post(port: int, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_http_names_the_adapter_by_model_or_lora_path_and_404s_an_unknown_one(lora_setup):
    _, http_port, oracles = lora_setup
    status, body = _post(http_port, "/v1/completions", {"model": "sql", "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS})
    assert status == 200, body
    assert body["model"] == "sql" or body["model"]  # the answer names a model
    want = oracles["sql"].decode(expected(oracles, "sql", PROMPTS[0]))
    assert body["choices"][0]["text"] == want
    status, body = _post(http_port, "/generate", {"input_ids": PROMPTS[1], "lora_path": "qv",
                                                  "sampling_params": {"max_new_tokens": MAX_TOKENS}})
    assert status == 200, body
    assert body["output_ids"] == expected(oracles, "qv", PROMPTS[1])
    for path, request in (("/generate", {"text": "hi", "lora_path": "missing"}),
                          ("/v1/completions", {"model": "missing", "prompt": "hi"})):
        status, body = _post(http_port, path, request)
        assert status == 404 and "missing" in body["error"]["message"], body
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/models", timeout=30) as response:
        ids = [card["id"] for card in json.loads(response.read())["data"]]
    assert ids[1:] == list(ADAPTERS)
