"""The request body both clients send (validated by the server, not here)."""

from __future__ import annotations

import secrets
from typing import Any


def new_req_id() -> int:
    return secrets.randbits(62)


def build_body(prompt: str | None, input_ids: list[int] | None, messages: list[dict] | None, sampling: dict[str, Any]) -> dict:
    given = [k for k, v in (("prompt", prompt), ("input_ids", input_ids), ("messages", messages)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of prompt, input_ids or messages (got {', '.join(given) or 'none'})")
    body: dict[str, Any] = {"sampling": {k: v for k, v in sampling.items() if v is not None}}
    if prompt is not None:
        body["prompt"] = prompt
    elif input_ids is not None:
        body["input_ids"] = [int(t) if not isinstance(t, int) else t for t in input_ids]
    else:
        body["messages"] = messages
    return body
