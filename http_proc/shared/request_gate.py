"""What every HTTP request passes before any route sees it (an ASGI middleware):

  1. Host: the `Host` header names this server: a loopback name (localhost, 127.0.0.1, ::1),
     the address it listens on (--host, unless a wildcard), or one of --allowed-hosts ("*": any).
     A web page the local user opens cannot reach the server through DNS rebinding: its
     requests carry the attacker's host name. 403 otherwise.
  2. Origin: a request with an `Origin` header (browsers send one on cross-origin requests and
     on every POST) is refused unless --allowed-origins lists it ("*": any); allowed origins get
     CORS headers and answered preflights. So no web page can make the server compute unless
     told. 403 otherwise.
  3. API key: with --api-key, every route but /health needs `Authorization: Bearer KEY` (or
     `x-api-key: KEY`, as the anthropic SDK sends it). 401.
  4. Body: a POST must say `Content-Type: application/json` (a form or text/plain post, the
     kind a page may send cross-site without a preflight, is refused: 415) and carry at most
     --max-request-bytes (413, checked on Content-Length and again while reading).
  5. Shape: a body over SCAN_MIN_BYTES is scanned (JsonShape, the event loop free between
     slices) before any route parses it; one with a longer array or more objects than any valid
     request has (a 1,000,000-id prompt, 100,000 messages) gets 400 `request_too_large` at once,
     so parsing it never holds up other clients (it would for seconds).

Refusals are OpenAI-shaped errors (Anthropic-shaped on /v1/messages), counted under the route
"refused" in /metrics.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.responses import JSONResponse

from zserve.common.request_limits import LIMITS
from zserve.http_proc.shared.anthropic_error import anthropic_error_body, is_anthropic_path
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.json_shape import JsonShape
from zserve.http_proc.shared.server_metrics import ServerMetrics

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "*"})
OPEN_PATHS = frozenset({"/health"})  # answered without the API key (load balancers, the launcher)
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type, X-Api-Key, Anthropic-Version"
SCAN_MIN_BYTES = 64 << 10  # a smaller body parses in a few milliseconds whatever its shape
MIN_JSON_RUN = 1 << 16  # entries one array may have whatever the context (a tool's enum, logit_bias)
MAX_JSON_OBJECTS = 4 * LIMITS.max_messages  # a chat's messages with their content parts and tool calls

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class BodyTooLarge(Exception):
    pass


def split_list(text: str) -> frozenset[str]:
    """A comma-separated flag value as a set of lower-cased, stripped items."""
    return frozenset(item.strip().lower() for item in text.split(",") if item.strip())


def host_name(host_header: str) -> str:
    """`Host` header -> the name without its port, lower-cased ('[::1]:8000' -> '::1')."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


@dataclass(frozen=True)
class GatePolicy:
    allowed_hosts: frozenset[str]  # "*" in it: any host
    allowed_origins: frozenset[str]  # "*" in it: any origin
    api_key: str  # "" = none
    max_request_bytes: int
    max_json_run: int = MIN_JSON_RUN  # entries in one JSON array (or members in one object) at most
    max_json_objects: int = MAX_JSON_OBJECTS

    @staticmethod
    def build(
        listen_host: str, allowed_hosts: str, allowed_origins: str, api_key: str, max_request_bytes: int,
        context_len: int = 0,
    ) -> GatePolicy:
        """`context_len`: the served context, which a prompt's token ids fit in (so one array may be that long)."""
        hosts = set(LOOPBACK_HOSTS) | split_list(allowed_hosts)
        if listen_host.lower() not in WILDCARD_HOSTS:
            hosts.add(host_name(listen_host))
        return GatePolicy(
            frozenset(hosts), split_list(allowed_origins), api_key, max_request_bytes, max(context_len, MIN_JSON_RUN),
        )

    def host_allowed(self, host_header: str | None) -> bool:
        return "*" in self.allowed_hosts or (host_header is not None and host_name(host_header) in self.allowed_hosts)

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.allowed_origins or origin.strip().lower().rstrip("/") in self.allowed_origins

    def key_ok(self, authorization: str | None, x_api_key: str | None = None) -> bool:
        if not self.api_key:
            return True
        if x_api_key is not None and hmac.compare_digest(x_api_key.strip().encode(), self.api_key.encode()):
            return True
        expected = f"Bearer {self.api_key}"
        return authorization is not None and hmac.compare_digest(authorization.strip().encode(), expected.encode())


class RequestGate:
    """ASGI middleware applying a GatePolicy in front of `app`."""

    def __init__(self, app: Callable, policy: GatePolicy, metrics: ServerMetrics):
        self.app, self.policy, self.metrics = app, policy, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        refusal = self.check(scope, headers, origin)
        if refusal is not None:
            await self.refuse(refusal, scope, receive, send, origin)
            return
        if origin is not None and scope["method"] == "OPTIONS":  # an allowed origin's preflight
            await self.preflight(send, origin)
            return
        if scope["method"] == "POST":
            try:
                receive, body = await self.buffered_body(receive)
            except BodyTooLarge:
                await self.refuse(self.too_large(), scope, receive, send, origin)
                return
            refusal = await self.check_shape(body)
            if refusal is not None:
                await self.refuse(refusal, scope, receive, send, origin)
                return
        await self.app(scope, receive, self.with_cors(send, origin) if origin is not None else send)

    def check(self, scope: Scope, headers: dict[str, str], origin: str | None) -> ApiError | None:
        policy = self.policy
        if not policy.host_allowed(headers.get("host")):
            return ApiError(
                403,
                f"host {headers.get('host')!r} is not served here "
                "(loopback names and --host; widen with --allowed-hosts)",
                code="host_not_allowed",
            )
        if origin is not None and not policy.origin_allowed(origin):
            return ApiError(
                403, f"cross-origin requests from {origin!r} are not allowed (see --allowed-origins)",
                code="origin_not_allowed",
            )
        if scope["method"] == "OPTIONS" and origin is not None:
            return None  # a preflight carries no credentials
        key_ok = policy.key_ok(headers.get("authorization"), headers.get("x-api-key"))
        if scope["path"] not in OPEN_PATHS and not key_ok:
            return ApiError(401, "missing or wrong API key: send `Authorization: Bearer <key>`", code="invalid_api_key")
        if scope["method"] == "POST":
            content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if content_type != "application/json":
                return ApiError(
                    415,
                    f"the request body must be JSON (Content-Type: application/json), got {content_type or 'none'!r}",
                    code="unsupported_media_type",
                )
            length = headers.get("content-length")
            if length is not None and (not length.strip().isdigit() or int(length) > policy.max_request_bytes):
                return self.too_large()
        return None

    def too_large(self) -> ApiError:
        return ApiError(
            413, f"the request body is larger than {self.policy.max_request_bytes} bytes (--max-request-bytes)",
            code="request_too_large",
        )

    async def check_shape(self, body: bytes) -> ApiError | None:
        if len(body) < SCAN_MIN_BYTES:
            return None
        policy = self.policy
        shape = await JsonShape.of(body, policy.max_json_run - 1, policy.max_json_objects)
        if shape.longest_run >= policy.max_json_run:
            return ApiError(
                400,
                f"the request body has a JSON array (or object) of more than {policy.max_json_run} entries; no valid "
                f"request has one (a prompt's token ids fit the context, stop lists and logit_bias are short)",
                code="request_too_large",
            )
        if shape.num_objects > policy.max_json_objects:
            return ApiError(
                400,
                f"the request body has more than {policy.max_json_objects} JSON objects; no valid request has as many "
                f"(a chat has at most {LIMITS.max_messages} messages)",
                code="request_too_large",
            )
        return None

    async def buffered_body(self, receive: Receive) -> tuple[Receive, bytes]:
        """Read the whole body (at most max_request_bytes), then hand it to the app in one message;
        later receive() calls go to the connection (shared/disconnect_watch.py waits on them). Returns
        that receive and the body (empty when the client left before sending it all)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                first = message  # a disconnect while the body was on its way
                break
            size += len(message.get("body", b""))
            if size > self.policy.max_request_bytes:
                raise BodyTooLarge()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        pending = [first]

        async def replay() -> dict:
            return pending.pop() if pending else await receive()

        return replay, first.get("body", b"") if first["type"] == "http.request" else b""

    def with_cors(self, send: Send, origin: str) -> Send:
        async def send_with_cors(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    *message.get("headers", []),
                    (b"access-control-allow-origin", origin.encode("latin-1")),
                    (b"vary", b"Origin"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        return send_with_cors

    async def preflight(self, send: Send, origin: str) -> None:
        headers = [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-allow-methods", CORS_METHODS.encode()),
            (b"access-control-allow-headers", CORS_HEADERS.encode()),
            (b"access-control-max-age", b"600"),
            (b"vary", b"Origin"),
            (b"content-length", b"0"),
        ]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def refuse(self, error: ApiError, scope: Scope, receive: Receive, send: Send, origin: str | None) -> None:
        self.metrics.count_response("refused", error.status)
        allowed_origin = origin is not None and self.policy.origin_allowed(origin)
        body = anthropic_error_body(error.status, error.message) if is_anthropic_path(scope["path"]) else error.body()
        response = JSONResponse(body, status_code=error.status)
        await response(scope, receive, self.with_cors(send, origin) if allowed_origin else send)
