"""Errors as Anthropic's API shapes them, for the /v1/messages routes (the anthropic SDK reads this shape):

    {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}

The status is the one the OpenAI-shaped error would have; the error type is Anthropic's name for it.
"""

from __future__ import annotations

from typing import Any

ANTHROPIC_PATH_PREFIX = "/v1/messages"
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PATH_PREFIX or path.startswith(ANTHROPIC_PATH_PREFIX + "/")


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    error_type = ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": error_type, "message": message}}
