"""What the client returns and raises."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.server_config import API_KEY_ENV

if TYPE_CHECKING:
    from zserve.common.messages import ReqOutput, StatsOut


class ServerError(RuntimeError):
    """The server refused or failed a request. `code` (an ErrorCode) says whose fault it is;
    `message` is the server's own text, and str() adds the request it is about."""

    default_code = ErrorCode.INTERNAL

    def __init__(self, message: str, code: ErrorCode | None = None, req_id: int | None = None):
        super().__init__(message if req_id is None else f"request {req_id}: {message}")
        self.message = message
        self.code = self.default_code if code is None else code
        self.req_id = req_id


class ServerBusyError(ServerError):
    """The server's waiting queue is full; try again later."""

    default_code = ErrorCode.BUSY


class InvalidRequestError(ServerError):
    """The server can never serve this request as given (bad parameters, a prompt too long)."""

    default_code = ErrorCode.INVALID


class UnauthorizedError(ServerError):
    """The server has an API key and this client presented another, or none (`api_key=`, or $ZSERVE_API_KEY)."""

    default_code = ErrorCode.UNAUTHORIZED


class ServerShuttingDownError(ServerError):
    """The server is shutting down (draining): it finishes the requests it has and takes no new one."""

    default_code = ErrorCode.SHUTTING_DOWN


class ServerGoneError(ServerError):
    """The server stopped answering, or one of its processes died (it is down, or unreachable)."""

    default_code = ErrorCode.UNAVAILABLE


class RequestTimeoutError(TimeoutError):
    """The request did not finish within the client's timeout (it was aborted on the server)."""


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class GenerateResult:
    req_id: int
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length" or "abort" (FinishReason.text)
    usage: Usage = field(default_factory=Usage)
    logprobs: list[float] | None = None
    # per output token: (token id, logprob), most likely first
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # with prompt_logprobs=k: the prompt's ids, each one's logprob and k most likely (None for the first token)
    prompt_ids: list[int] | None = None
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None
    # token text, decoded by the server (no tokenizer needed here): a token's own text is its decoding alone
    token_texts: list[str] | None = None  # with logprobs: each output token's text
    top_logprob_texts: list[list[str]] | None = None  # the text of each top_logprobs token
    prompt_token_texts: list[str] | None = None  # with prompt_logprobs: each prompt token's text
    prompt_top_logprob_texts: list[list[str] | None] | None = None  # the text of each prompt_top_logprobs token
    prompt_text: str | None = None  # with return_prompt_text=True: the prompt as text (what an echo shows)
    embedding: np.ndarray | None = None  # float32[hidden]: an embedding request's vector (a --task embed server)
    ttft_s: float | None = None  # first text since send
    latency_s: float | None = None  # last output since send


def server_error(message: str, code: ErrorCode, req_id: int | None = None) -> ServerError:
    """The exception for an error with `code`: its type is picked by the code alone."""
    kind = {
        ErrorCode.BUSY: ServerBusyError,
        ErrorCode.INVALID: InvalidRequestError,
        ErrorCode.GONE: ServerGoneError,
        ErrorCode.UNAVAILABLE: ServerGoneError,
        ErrorCode.UNAUTHORIZED: UnauthorizedError,
        ErrorCode.SHUTTING_DOWN: ServerShuttingDownError,
    }.get(code, ServerError)
    return kind(message, code, req_id)


def raise_for_error(out: ReqOutput) -> None:
    if out.finish_reason is FinishReason.ERROR:
        raise server_error(out.error or "unknown server error", out.code or ErrorCode.INTERNAL, out.req_id)


def stats_or_raise(out: StatsOut) -> StatsOut:
    if out.code is not None:
        raise server_error(out.error or "stats refused", out.code)
    return out


def resolve_api_key(api_key: str | None) -> str:
    """The key a client presents: `api_key`, or $ZSERVE_API_KEY when it is None ("" = none)."""
    return os.environ.get(API_KEY_ENV, "") if api_key is None else api_key
