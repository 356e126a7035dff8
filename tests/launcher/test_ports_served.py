"""`--port` is the HTTP port, as SGLang and vLLM users type it: `launch_server --model-path M --port P` (SGLang's
habit) and `launch_server M --port P` (vLLM's) answer HTTP on P; the Python client's ZMQ port is --zmq-port."""

from __future__ import annotations

import json
import urllib.request

import pytest

from testing.server_process import ServerProcess, free_port
from zserve import Client

FLAGS = ["--num-threads", "1", "--kv-cache-tokens", "1024"]


def http_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("model_flag", ["--model-path", "positional"])
def test_port_serves_http_and_zmq_port_serves_the_client(model_dir, model_flag):
    http_port, zmq_port = free_port(), free_port()
    model = [str(model_dir)] if model_flag == "positional" else [model_flag, str(model_dir)]
    argv = [*model, "--port", str(http_port), "--zmq-port", str(zmq_port), *FLAGS]
    server = ServerProcess.spawn_argv(argv).wait_ready(120)
    try:
        assert (server.ready.zmq_port, server.ready.http_port) == (zmq_port, http_port)  # the typed ready record
        assert f"HTTP on http://127.0.0.1:{http_port}" in server.log()  # and the human line, before it
        models = http_json(f"http://127.0.0.1:{http_port}/v1/models")
        assert [m["id"] for m in models["data"]] == [model_dir.name]
        with Client(zmq_port, timeout_s=60) as client:
            assert client.generate("Hello", max_tokens=3, ignore_eos=True).usage.completion_tokens == 3
    finally:
        assert server.stop() == 0, server.log_tail()


def test_tokenizer_flag_serves_a_model_directory_without_tokenizer_files(model_dir, tmp_path):
    """vLLM's --tokenizer (SGLang's --tokenizer-path): every process that tokenizes (frontend, detokenizer,
    the scheduler's grammars) and the launcher's model facts (the chat template) read the tokenizer from there."""
    weights_only = tmp_path / "weights"
    weights_only.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (weights_only / name).symlink_to(model_dir / name)
    http_port, zmq_port = free_port(), free_port()
    argv = [str(weights_only), "--tokenizer", str(model_dir), "--port", str(http_port), "--zmq-port", str(zmq_port), *FLAGS]
    server = ServerProcess.spawn_argv(argv).wait_ready(120)
    try:
        with Client(zmq_port, timeout_s=60) as client:
            plain = client.generate(messages=[{"role": "user", "content": "Hi"}], max_tokens=4, ignore_eos=True)
            constrained = client.generate("Hi", max_tokens=8, regex="(yes|no)")
        assert plain.usage.completion_tokens == 4 and plain.text
        assert constrained.text in ("yes", "no"), constrained.text  # the grammar was compiled from --tokenizer's vocabulary
        body = json.dumps({"model": "weights", "prompt": "Hi", "max_tokens": 2, "logprobs": 1}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            choice = json.loads(resp.read())["choices"][0]
        assert len(choice["logprobs"]["tokens"]) == 2  # token texts come from the detokenizer's tokenizer
    finally:
        assert server.stop() == 0, server.log_tail()
