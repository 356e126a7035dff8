"""How many choices a request's `n` asks for: the one rule every door and the frontend follow.

A request with `n` choices of one prompt occupies request ids req_id .. req_id + n - 1 (choice i
is req_id + i); it travels as one request, with `n`, from every door (Python client, HTTP) to the
frontend, which hands the scheduler one TokenizedReq with num_copies = n (the prompt is
computed once). A door never splits `n` into separate requests.
"""

from __future__ import annotations

from typing import Any

from zserve.common.request_limits import LIMITS


def num_choices(body: dict[str, Any]) -> int | None:
    """`n` of a request body (1 when it has none), or None when `n` is not an int in
    [1, LIMITS.max_copies] (the frontend refuses such a request, on req_id alone)."""
    n = body.get("n", 1)
    if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= LIMITS.max_copies:
        return n
    return None


def bad_n_error(body: dict[str, Any]) -> str:
    """The frontend's error for a body whose `n` num_choices refuses."""
    return f"n must be an integer in [1, {LIMITS.max_copies}], got {body.get('n')!r:.64}"
