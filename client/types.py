"""What the client returns and raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common.finish_reason import FinishReason

if TYPE_CHECKING:
    from common.messages import ReqOutput


class ServerError(RuntimeError):
    """The server refused or failed a request; the message is the server's."""


class ServerBusyError(ServerError):
    """The server's waiting queue is full; try again later."""


class ServerGoneError(ServerError):
    """The server stopped answering (it is down, or unreachable)."""


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
    ttft_s: float | None = None  # first text since send
    latency_s: float | None = None  # last output since send
    max_tokens_clamped_to: int | None = None  # the server cut max_tokens to fit the context


def raise_for_error(out: ReqOutput) -> None:
    if out.finish_reason is not FinishReason.ERROR:
        return
    message = out.error or "unknown server error"
    if message.startswith("server busy"):
        raise ServerBusyError(f"request {out.req_id}: {message}")
    raise ServerError(f"request {out.req_id}: {message}")
