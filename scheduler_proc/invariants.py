"""The Scheduler's cross-component invariants, as checks that raise AssertionError naming the
first one broken. Each component checks its own state (`CacheManager`, `ReqTable`,
`DecodeManager.check_integrity`, and the PendingList and ConstrainedReqs theirs against the live
table); these check what holds *between* them, from plain values the
Scheduler passes in (`Scheduler.check_integrity` calls them all):

    check_reqs    each admitted request is running xor prefilling, with pages for what it computed
    check_pages   the ChunkedReq's prompt, and under `full` every reservation, finds its pages
"""

from __future__ import annotations

from collections.abc import Mapping

from zserve.common.int_math import cdiv
from zserve.scheduler_proc.decode_manager import DecodeManager
from zserve.scheduler_proc.req import ChunkedReq, PendingReq, Req


def check_reqs(
    reqs: list[Req], decode: DecodeManager, chunked: ChunkedReq | None, live: Mapping[int, PendingReq | Req],
    *, page_size: int, batch_in_flight: bool,
) -> None:
    """`reqs`: every request holding pages (live, or aborted in the batch in flight). Outside a
    step each is running or is the ChunkedReq, and holds the pages of its computed tokens."""
    for req in reqs:
        if req.in_flight:
            continue
        is_running = decode.holds(req)
        assert is_running != req.is_prefilling, (
            f"request {req.req_id}: running={is_running} "
            f"with {req.num_prompt_tokens - req.cached_len} prompt tokens left"
        )
        assert req.num_pages == cdiv(req.cached_len, page_size), (
            f"request {req.req_id} holds {req.num_pages} pages for {req.cached_len} tokens"
        )
    if chunked is not None:
        assert chunked.req.is_prefilling and live.get(chunked.req.req_id) is chunked.req
    if not batch_in_flight:
        prefilling = [r for r in reqs if r.is_prefilling]
        assert prefilling == ([chunked.req] if chunked else []), "a request is prefilling but not the ChunkedReq"


def check_pages(
    num_available_pages: int, num_chunk_pages: int, num_reserved_pages: int | None, num_retracted: int,
) -> None:
    """The ChunkedReq's next chunks always find their pages. Under `full` (`num_reserved_pages`
    given) every reservation is backed, so nothing is ever retracted; under `estimated` (None) the
    estimates may exceed what is left (that is the point), and a decode step retracts when they
    prove short."""
    available = num_available_pages
    assert num_chunk_pages <= available, (
        f"the ChunkedReq's prompt needs {num_chunk_pages} more pages, {available} are free or evictable"
    )
    if num_reserved_pages is not None:
        assert num_reserved_pages <= available, (
            f"{num_reserved_pages} pages are reserved but only {available} are free or evictable"
        )
        assert num_retracted == 0, "a request was retracted under the full reservation"
