"""The HTTP request gate (http_proc/shared/request_gate.py): Host, Origin/CORS, API key, JSON body and
its size. Unit tests drive the ASGI middleware directly; one module-scoped server checks the
same through a real HTTP process started with the flags."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess

import pytest

from testing.server_process import free_port, start_server
from zserve.http_proc.shared.request_gate import GatePolicy, RequestGate, host_name
from zserve.http_proc.shared.server_metrics import ServerMetrics

KEY = "s3cret-key"


def run_gate(policy: GatePolicy, method: str, path: str, headers: dict[str, str], body_chunks: list[bytes] = (b"",)) -> tuple[int, dict, bytes, list]:
    """One request through RequestGate in front of an app that echoes the body it received.
    Returns (status, response headers, response body, the body the app saw or None)."""
    seen = []

    async def app(scope, receive, send):
        message = await receive()
        seen.append(message.get("body", b""))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    messages = [{"type": "http.request", "body": c, "more_body": i < len(body_chunks) - 1} for i, c in enumerate(body_chunks)]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(RequestGate(app, policy, ServerMetrics())(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body, seen


def policy(**overrides) -> GatePolicy:
    args = {"listen_host": "127.0.0.1", "allowed_hosts": "", "allowed_origins": "", "api_key": "", "max_request_bytes": 100} | overrides
    return GatePolicy.build(**args)


JSON = {"host": "127.0.0.1:8000", "content-type": "application/json"}


def error_of(body: bytes) -> dict:
    return json.loads(body)["error"]


def test_host_names():
    assert host_name("[::1]:8000") == "::1" and host_name("LOCALHOST:80") == "localhost" and host_name("::1") == "::1"
    assert host_name("example.com") == "example.com"


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost", "[::1]:9", "LocalHost:1"])
def test_loopback_hosts_pass(host):
    status, _, _, seen = run_gate(policy(), "GET", "/v1/models", {"host": host})
    assert status == 200 and seen == [b""]


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", ""])
def test_other_hosts_are_403(host):
    status, _, body, seen = run_gate(policy(), "GET", "/v1/models", {"host": host} if host else {})
    assert status == 403 and error_of(body)["code"] == "host_not_allowed" and seen == []


def test_allowed_hosts_widen_and_star_allows_any():
    assert run_gate(policy(allowed_hosts="api.internal, other"), "GET", "/health", {"host": "API.internal:80"})[0] == 200
    assert run_gate(policy(allowed_hosts="*"), "GET", "/health", {"host": "anything"})[0] == 200
    assert run_gate(policy(listen_host="10.0.0.5"), "GET", "/health", {"host": "10.0.0.5:8000"})[0] == 200
    assert run_gate(policy(listen_host="0.0.0.0"), "GET", "/health", {"host": "0.0.0.0"})[0] == 403


def test_cross_origin_is_refused_unless_allowed():
    status, headers, body, seen = run_gate(policy(), "POST", "/v1/completions", JSON | {"origin": "http://evil.example"}, [b"{}"])
    assert status == 403 and error_of(body)["code"] == "origin_not_allowed" and seen == []
    assert "access-control-allow-origin" not in headers
    status, headers, _, seen = run_gate(policy(allowed_origins="http://ok.example"), "POST", "/v1/completions", JSON | {"origin": "http://ok.example"}, [b"{}"])
    assert status == 200 and headers["access-control-allow-origin"] == "http://ok.example" and seen == [b"{}"]


def test_preflight_of_an_allowed_origin():
    status, headers, _, seen = run_gate(policy(allowed_origins="*"), "OPTIONS", "/v1/completions", {"host": "localhost", "origin": "http://a.b"})
    assert status == 204 and headers["access-control-allow-origin"] == "http://a.b" and "POST" in headers["access-control-allow-methods"]
    assert "Authorization" in headers["access-control-allow-headers"] and seen == []
    assert run_gate(policy(), "OPTIONS", "/v1/completions", {"host": "localhost", "origin": "http://a.b"})[0] == 403


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""])
def test_posts_must_be_json(content_type):
    headers = {"host": "localhost"} | ({"content-type": content_type} if content_type else {})
    status, _, body, seen = run_gate(policy(), "POST", "/generate", headers, [b"{}"])
    assert status == 415 and error_of(body)["code"] == "unsupported_media_type" and seen == []
    assert run_gate(policy(), "POST", "/generate", {"host": "localhost", "content-type": "Application/JSON; charset=utf-8"}, [b"{}"])[0] == 200


def test_body_cap_on_the_header_and_while_reading():
    status, _, body, seen = run_gate(policy(), "POST", "/generate", JSON | {"content-length": "101"}, [b"x" * 101])
    assert status == 413 and error_of(body)["code"] == "request_too_large" and seen == []
    status, _, _, seen = run_gate(policy(), "POST", "/generate", JSON, [b"x" * 60, b"y" * 60])  # chunked past the cap
    assert status == 413 and seen == []
    status, _, _, seen = run_gate(policy(), "POST", "/generate", JSON, [b"a" * 50, b"b" * 50])  # exactly the cap, in two chunks
    assert status == 200 and seen == [b"a" * 50 + b"b" * 50]
    assert run_gate(policy(), "POST", "/generate", JSON | {"content-length": "-1"}, [b""])[0] == 413


def test_api_key_on_every_route_but_health():
    keyed = policy(api_key=KEY)
    assert run_gate(keyed, "GET", "/health", {"host": "localhost"})[0] == 200
    for path in ("/v1/models", "/metrics"):
        status, _, body, _ = run_gate(keyed, "GET", path, {"host": "localhost"})
        assert status == 401 and error_of(body)["code"] == "invalid_api_key" and error_of(body)["type"] == "authentication_error"
    assert run_gate(keyed, "GET", "/v1/models", {"host": "localhost", "authorization": "Bearer wrong"})[0] == 401
    assert run_gate(keyed, "GET", "/v1/models", {"host": "localhost", "authorization": f"Bearer {KEY}"})[0] == 200
    assert run_gate(keyed, "POST", "/generate", JSON | {"authorization": f"Bearer {KEY}"}, [b"{}"])[0] == 200


# ---- through a real server ----


@pytest.fixture(scope="module")
def gated_server(model_dir):
    http_port = free_port()
    handle = start_server(
        model_dir, "--http-port", str(http_port), "--page-size", "4", "--kv-cache-tokens", "2048", "--num-threads", "1",
        "--api-key", KEY, "--allowed-origins", "http://ok.example", "--max-request-bytes", "4096",
    )
    handle.http_port = http_port
    yield handle
    assert handle.stop() == 0, handle.log()


def request(port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    out = response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    conn.close()
    return out


def test_server_applies_the_gate(gated_server):
    port, auth = gated_server.http_port, {"Authorization": f"Bearer {KEY}"}
    body = json.dumps({"prompt": "hello", "max_tokens": 3, "temperature": 0}).encode()
    assert request(port, "GET", "/health")[0] == 200
    assert request(port, "GET", "/v1/models")[0] == 401
    assert request(port, "GET", "/v1/models", headers=auth)[0] == 200
    assert request(port, "GET", "/v1/models", headers=auth | {"Host": "evil.example"})[0] == 403
    assert request(port, "POST", "/v1/completions", body, auth | {"Content-Type": "text/plain"})[0] == 415
    assert request(port, "POST", "/v1/completions", b"[" * 5000, auth | {"Content-Type": "application/json"})[0] == 413
    assert request(port, "POST", "/v1/completions", body, auth | {"Content-Type": "application/json", "Origin": "http://evil.example"})[0] == 403
    status, headers, out = request(port, "POST", "/v1/completions", body, auth | {"Content-Type": "application/json", "Origin": "http://ok.example"})
    assert status == 200 and headers["access-control-allow-origin"] == "http://ok.example"
    assert json.loads(out)["usage"]["completion_tokens"] == 3


def test_the_key_is_on_no_child_command_line(gated_server):
    """The children get the config as JSON on their command lines (ps shows those): the key goes
    to the HTTP process in its environment instead."""
    lines = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True, check=True).stdout.splitlines()
    children = [line for line in lines if f'"http_port": {gated_server.http_port}' in line]
    assert any("-m zserve.http_proc" in line for line in children) and len(children) >= 4, children
    assert not any(KEY in line for line in children)
