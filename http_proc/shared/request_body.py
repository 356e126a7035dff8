"""Any API's request body: its pydantic model (RequestModel) and the parse of a JSON body into it.

Undeclared fields are kept aside in `model_extra`, not refused here: UnknownFieldPolicy (unknown_fields.py)
ignores and logs them, or refuses them under --strict-requests. A body that is not its model is a 400 naming
every bad field (five at most).
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.unknown_fields import field_path

RequestT = TypeVar("RequestT", bound=BaseModel)


class RequestModel(BaseModel):
    """A request body or a part of one: undeclared fields go to `model_extra` (see the module doc)."""

    model_config = ConfigDict(extra="allow")


def parse_body(model: type[RequestT], raw: bytes) -> RequestT:
    """The request model from a JSON body; a 400 naming every bad field otherwise."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        parts = [f"{_error_path(e['loc'])}: {e['msg']}" for e in errors[:5]]
        if len(errors) > 5:
            parts.append(f"and {len(errors) - 5} more")
        param = next((_error_path(e["loc"]) for e in errors if e["loc"]), None)
        raise ApiError(400, "invalid request: " + "; ".join(parts), param=param) from None


def _error_path(loc: tuple[str | int, ...]) -> str:
    return field_path(tuple(x if isinstance(x, int) else str(x)[:64] for x in loc))
