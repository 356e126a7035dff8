"""One server (a tiny model whose chat template misbehaves on cue, with HTTP) for every hostile
test, and a check after them all that no process died or was replaced."""

from __future__ import annotations

import pytest

from testing.hostile import NORMAL_MAX_TOKENS, NORMAL_PROMPT, build_hostile_model_dir
from testing.server_process import free_port, start_server
from zserve.client import Client


@pytest.fixture(scope="package")
def hostile_server(model_dir, tmp_path_factory):
    hostile_dir = build_hostile_model_dir(model_dir, tmp_path_factory.mktemp("hostile-model"))
    http_port = free_port()
    server = start_server(
        hostile_dir, "--dtype", "float32", "--num-threads", "1", "--kv-cache-tokens", "4096", "--http-port", str(http_port),
    )
    server.http_port = http_port
    children = sorted(server.child_pids())
    yield server
    try:
        assert server.proc.poll() is None, "the launcher exited during the hostile tests:\n" + server.log_tail()
        assert sorted(server.child_pids()) == children, "a server process died or was replaced:\n" + server.log_tail()
    finally:
        assert server.stop() == 0, server.log_tail()


@pytest.fixture(scope="package")
def expected(hostile_server):
    """The normal request's output on an undisturbed server."""
    with Client(hostile_server.port, timeout_s=60) as c:
        return c.generate(NORMAL_PROMPT, max_tokens=NORMAL_MAX_TOKENS, ignore_eos=True)
