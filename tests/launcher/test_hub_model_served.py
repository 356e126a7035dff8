"""`launch_server --model org/name` and `--model org/repo:Q4_K_M` against a hub cache the test lays out
(testing/hub_cache_fixtures.py), with HF_HUB_OFFLINE=1 and the hub's endpoint on a closed local port: each starts
and answers the greedy tokens of serving the local directory (for the GGUF: of transformers on the same weights)."""

from __future__ import annotations

import pytest

import zserve
from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import write_gguf
from testing.hub_cache_fixtures import commit_of, files_of, write_hub_snapshot
from testing.server_process import ServerProcess
from zserve.client import Client

FLAGS = ["--page-size", "4", "--kv-cache-tokens", "2048", "--num-threads", "1", "--dtype", "float32"]
PROMPT = "The quick brown fox jumps over the lazy dog and"


@pytest.fixture(scope="module")
def hub_env(model_dir, tmp_path_factory) -> dict[str, str]:
    """The environment of a server reading a hub cache that holds org/tiny and org/tiny-GGUF, offline."""
    root = tmp_path_factory.mktemp("hub-served")
    hub = root / "hub"
    write_hub_snapshot(hub, "org/tiny", files_of(model_dir), listed_only={"pytorch_model.bin": 99})
    gguf = write_gguf(model_dir, root / "tiny.gguf", "F32")  # picked by its name; F32 so the oracle is exact
    write_hub_snapshot(hub, "org/tiny-GGUF", {"tiny-Q4_K_M.gguf": gguf, "tiny-Q8_0.gguf": gguf})
    return {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub), "HF_ENDPOINT": "http://127.0.0.1:9",
            "ZSERVE_CACHE_DIR": str(private_cache_dir(root / "cache"))}


@pytest.fixture(scope="module")
def servers(model_dir, hub_env):
    """Three servers loading at once: the local directory, its hub id, and a GGUF of it by quant tag."""
    env = hub_env
    pending = {name: ServerProcess.spawn(model, FLAGS, env=env)
               for name, model in (("local", model_dir), ("hub", "org/tiny"), ("gguf", "org/tiny-GGUF:q4_k_m"))}
    started = {name: server.wait_ready(300) for name, server in pending.items()}
    yield started
    for server in started.values():
        assert server.stop() == 0, server.log_tail()


def greedy(server: ServerProcess) -> list[int]:
    with Client(server.port, timeout_s=60) as client:
        return client.generate(PROMPT, max_tokens=12, temperature=0, ignore_eos=True).output_ids


def test_a_hub_id_serves_as_its_local_directory(servers):
    assert greedy(servers["hub"]) == greedy(servers["local"])
    assert "models--org--tiny/snapshots/" in servers["hub"].ready.model


def test_a_gguf_by_quant_tag_serves_that_file(servers, oracle):
    assert greedy(servers["gguf"]) == oracle.greedy(oracle.encode(PROMPT), 12, stop_at_eos=False)
    assert "tiny-Q4_K_M.gguf" in servers["gguf"].log()


def test_the_engine_takes_a_hub_id_and_a_revision(servers, hub_env, monkeypatch):
    """zserve.Engine starts launch_server with the same --model (and --revision): the same resolution."""
    for name, value in hub_env.items():
        monkeypatch.setenv(name, value)
    flags = {"page_size": 4, "kv_cache_tokens": 2048, "num_threads": 1, "dtype": "float32"}
    with zserve.Engine("org/tiny", revision=commit_of("org/tiny"), echo_logs=False, **flags) as engine:
        out = engine.generate([PROMPT], {"max_tokens": 12, "ignore_eos": True})[0]
    assert out.output_ids == greedy(servers["local"])
