"""Errors as the OpenAI API shapes them, and the mapping from zserve client errors to them.

    {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": null}}

A server error's HTTP status and OpenAI `code` come from its ErrorCode alone (STATUS_OF_CODE),
never from its text: 400 a bad request (validation, a prompt too long for the context), 404 an
unknown model or path, 503 the server cannot take the request now (queue full, draining, not
answering), 500 a real internal fault (a process died, a bug).
"""

from __future__ import annotations

from dataclasses import dataclass

from zserve.client.types import RequestTimeoutError, ServerError
from zserve.common.error_code import ErrorCode

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}
STATUS_OF_CODE: dict[ErrorCode, tuple[int, str | None]] = {  # ErrorCode -> (HTTP status, OpenAI error code)
    ErrorCode.BUSY: (503, "server_busy"),
    ErrorCode.INVALID: (400, None),
    ErrorCode.INTERNAL: (500, "internal_error"),
    ErrorCode.GONE: (500, "server_failure"),
    ErrorCode.UNAVAILABLE: (503, "server_unavailable"),
    ErrorCode.UNAUTHORIZED: (500, "frontend_unauthorized"),
    ErrorCode.SHUTTING_DOWN: (503, "server_draining"),  # the HTTP process's key is not the frontend's: a server fault
}


@dataclass
class ApiError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"

    def body(self) -> dict:
        error_type = ERROR_TYPES.get(
            self.status, "internal_server_error" if self.status >= 500 else "invalid_request_error",
        )
        return {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.code}}

    @staticmethod
    def from_client_error(exc: BaseException) -> ApiError:
        """The HTTP error for an exception the async client raised for a request."""
        if isinstance(exc, ApiError):
            return exc
        if isinstance(exc, RequestTimeoutError):
            return ApiError(503, str(exc), code="timeout")
        if isinstance(exc, ServerError):
            status, code = STATUS_OF_CODE[exc.code]
            message = (
                f"the server is not answering: {exc.message}" if exc.code is ErrorCode.UNAVAILABLE else exc.message
            )
            return ApiError(status, message, code=code)
        return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")


def error_code_of(status: int, api_code: str | None) -> ErrorCode:
    """The ErrorCode behind an HTTP error response (the inverse of STATUS_OF_CODE): by its OpenAI
    `code` when it is one of ours, else by its status."""
    for code, (_, known) in STATUS_OF_CODE.items():
        if known is not None and known == api_code:
            return code
    if 400 <= status < 500:
        return ErrorCode.INVALID
    return ErrorCode.UNAVAILABLE if status == 503 else ErrorCode.INTERNAL
