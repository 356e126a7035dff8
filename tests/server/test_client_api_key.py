"""--api-key on the ZMQ client port (issue 14 item 6): the frontend serves only clients that present
the key, refuses the others per request with ErrorCode.UNAUTHORIZED (UnauthorizedError), and the
HTTP process, itself a client of the frontend, presents it too."""

from __future__ import annotations

import asyncio
import http.client
import json

import pytest

from testing.server_process import free_port, start_server
from zserve.client import AsyncClient, Client, UnauthorizedError
from zserve.common.error_code import ErrorCode
from zserve.common.server_config import API_KEY_ENV

KEY = "zmq-s3cret"
FLAGS = ("--page-size", "4", "--kv-cache-tokens", "2048", "--num-threads", "1")


@pytest.fixture(scope="module")
def keyed_server(model_dir):
    http_port = free_port()
    handle = start_server(model_dir, *FLAGS, "--http-port", str(http_port), "--api-key", KEY)
    handle.http_port = http_port
    yield handle
    assert handle.stop() == 0, handle.log()


@pytest.fixture(autouse=True)
def no_key_in_environment(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)


@pytest.mark.parametrize("key", [None, "", "wrong", KEY + "x"])
def test_sync_client_without_the_key_is_refused(keyed_server, key):
    with Client(keyed_server.port, timeout_s=30, api_key=key) as c:
        with pytest.raises(UnauthorizedError, match="missing or wrong API key") as info:
            c.generate("hello", max_tokens=2)
        assert info.value.code is ErrorCode.UNAUTHORIZED
        with pytest.raises(UnauthorizedError):
            c.stats()


def test_sync_client_with_the_key_is_served(keyed_server):
    with Client(keyed_server.port, timeout_s=30, api_key=KEY) as c:
        assert c.generate("hello", max_tokens=3, temperature=0).usage.completion_tokens == 3
        assert c.stats()["num_running"] == 0


def test_the_key_defaults_to_the_environment(keyed_server, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    with Client(keyed_server.port, timeout_s=30) as c:
        assert c.generate("hello", max_tokens=2, temperature=0).usage.completion_tokens == 2


def test_async_client_needs_the_key(keyed_server):
    async def scenario() -> None:
        async with AsyncClient(keyed_server.port, timeout_s=30) as c:
            with pytest.raises(UnauthorizedError, match="missing or wrong API key"):
                await c.generate("hello", max_tokens=2)
            with pytest.raises(UnauthorizedError):
                await c.stats()
        async with AsyncClient(keyed_server.port, timeout_s=30, api_key=KEY) as c:
            result = await c.generate("hello", max_tokens=3, temperature=0)
            assert result.usage.completion_tokens == 3
            assert "num_running" in await c.stats()

    asyncio.run(scenario())


def test_http_is_served_with_the_key(keyed_server):
    """The HTTP process presents the key to the frontend: completions and the /health probe work."""
    conn = http.client.HTTPConnection("127.0.0.1", keyed_server.http_port, timeout=60)
    try:
        conn.request("GET", "/health")
        response = conn.getresponse()
        assert response.status == 200, response.read()
        response.read()
        body = json.dumps({"prompt": "hello", "max_tokens": 3, "temperature": 0})
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        response = conn.getresponse()
        out = response.read()
        assert response.status == 200, out
        assert json.loads(out)["usage"]["completion_tokens"] == 3
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        assert response.status == 401
    finally:
        conn.close()


def test_a_server_without_a_key_serves_any_client(model_dir):
    with start_server(model_dir, *FLAGS) as handle, Client(handle.port, timeout_s=30, api_key="anything") as c:
        assert c.generate("hello", max_tokens=2, temperature=0).usage.completion_tokens == 2
