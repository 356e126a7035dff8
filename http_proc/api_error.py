"""Errors as the OpenAI API shapes them, and the mapping from zserve client errors to them.

    {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": null}}

Status codes: 400 a bad request (validation, a prompt too long for the context), 404 an unknown
model or path, 503 the server cannot take the request now (queue full, draining, not answering),
500 a real internal fault (a process died, a bug).
"""

from __future__ import annotations

from dataclasses import dataclass

from client.types import RequestTimeoutError, ServerBusyError, ServerError, ServerGoneError

ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}
# ServerError messages that are the server's fault, not the request's (the rest are validation)
INTERNAL_PREFIXES = ("server failure", "duplicate req_id", "req_id ")


@dataclass
class ApiError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"

    def body(self) -> dict:
        error_type = ERROR_TYPES.get(self.status, "internal_server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.code}}

    @staticmethod
    def from_client_error(exc: BaseException) -> ApiError:
        """The HTTP error for an exception the async client raised for a request."""
        if isinstance(exc, ApiError):
            return exc
        if isinstance(exc, ServerBusyError):
            return ApiError(503, _server_message(exc), code="server_busy")
        if isinstance(exc, ServerGoneError):
            return ApiError(503, f"the server is not answering: {exc}", code="server_unavailable")
        if isinstance(exc, RequestTimeoutError):
            return ApiError(503, str(exc), code="timeout")
        if isinstance(exc, ServerError):
            message = _server_message(exc)
            if message.startswith(INTERNAL_PREFIXES):
                return ApiError(500, message, code="internal_error")
            return ApiError(400, message)
        return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")


def _server_message(exc: ServerError) -> str:
    """The server's own message, without the client's "request <id>: " prefix."""
    text = str(exc)
    if text.startswith("request ") and ": " in text:
        return text.split(": ", 1)[1]
    return text
