"""The README's first command on the real demo model: the server answers the France question."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.request

import pytest

from testing.paths import REPO_ROOT
from testing.server_process import ServerProcess
from zserve.client import Client
from zserve.common.server_config import DEFAULT_CLIENT_PORT, DEFAULT_HTTP_PORT
from zserve.launcher.demo_model import demo_model_dir, missing_files

REPO = REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.mark.skipif(bool(missing_files(demo_model_dir())), reason="demo model not fetched (scripts/test.sh fetches it)")
def test_readme_demo_command_answers_paris():
    env = dict(os.environ, ZSERVE_DEMO_ONESHOT="1")
    proc = subprocess.run(
        ["bash", "scripts/demo.sh", "--kv-cache-tokens", "8192"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "zserve ready" in out
    answer = next(line for line in out.splitlines() if line.startswith("A: "))
    assert "Paris" in answer, out
    assert "finish=stop" in out  # it ended on EOS, not the token limit


def port_is_free(port: int) -> bool:
    """Free to listen on, as ZMQ and uvicorn bind (SO_REUSEADDR: a closed connection's TIME_WAIT does not count)."""
    try:
        with socket.create_server(("127.0.0.1", port)):
            return True
    except OSError:
        return False


@pytest.mark.skipif(bool(missing_files(demo_model_dir())), reason="demo model not fetched (scripts/test.sh fetches it)")
def test_launch_server_with_no_flags_serves_client_and_http_on_the_default_ports():
    """`launch_server` with no flags, then `Client()` with no arguments; /v1/models on the default
    HTTP port lists the served name; the ready line names both."""
    if not (port_is_free(DEFAULT_CLIENT_PORT) and port_is_free(DEFAULT_HTTP_PORT)):
        pytest.skip(f"port {DEFAULT_CLIENT_PORT} or {DEFAULT_HTTP_PORT} is taken on this machine")
    server = ServerProcess.spawn_with_defaults(["--kv-cache-tokens", "4096"]).wait_ready(600)
    try:
        ready = next(line for line in server.log_lines if "zserve ready" in line)
        assert f"tcp://127.0.0.1:{DEFAULT_CLIENT_PORT}" in ready and f"HTTP on http://127.0.0.1:{DEFAULT_HTTP_PORT}" in ready
        with Client() as c:
            # "Answer in one sentence.": the bare question's first token wins by under one bf16 step (see
            # tests/launcher/test_gguf_served.py); this way every token of the answer wins by 1.48 logits or more
            question = "What is the capital of France? Answer in one sentence."
            answer = c.generate(messages=[{"role": "user", "content": question}], max_tokens=16)
        assert "Paris" in answer.text
        with urllib.request.urlopen(f"http://127.0.0.1:{DEFAULT_HTTP_PORT}/v1/models", timeout=30) as r:
            models = json.loads(r.read())
        assert [m["id"] for m in models["data"]] == [demo_model_dir().name]
    finally:
        assert server.stop() == 0, server.log_tail()
