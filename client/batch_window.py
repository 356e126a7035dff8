"""Offline batches of any size: a bounded window of requests in flight (zserve.Engine's generate).

Sending every prompt at once overflows the server's queue (--max-queued-requests, 1,024 by
default) and the server answers "busy". Here at most `window` requests (choices, with `n`) are in
flight; each finished prompt makes room for the next, and the results come back in the prompts'
order, each prompt's n choices in turn (prompt p's choice i at p * n + i). A body may carry options of its
own ({"prompt": ..., "max_tokens": 4, "n": 2}: per-prompt settings), which win over the shared `sampling`.

A prompt the server still refuses as busy (other clients fill its queue, retracted requests come
back to it) is sent again after a backoff that doubles up to MAX_BACKOFF_S, and nothing new is sent
meanwhile; any other error fails the call, and what is still in flight is aborted first.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from zserve.client.async_client import AsyncClient
from zserve.client.batch_progress import BatchProgress
from zserve.client.client import Client
from zserve.client.request_body import num_copies
from zserve.client.types import GenerateResult, ServerBusyError

FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 2.0


@dataclass(slots=True)
class Backoff:
    """When the next request may be sent, after the server answered busy."""

    delay_s: float = 0.0
    until_s: float = 0.0  # time.monotonic()

    def busy(self) -> None:
        self.delay_s = min(MAX_BACKOFF_S, max(FIRST_BACKOFF_S, 2 * self.delay_s))
        self.until_s = time.monotonic() + self.delay_s

    def served(self) -> None:
        self.delay_s = 0.0

    def wait_s(self) -> float:
        return max(0.0, self.until_s - time.monotonic())


def run_window(
    client: Client, bodies: list[dict], sampling: dict[str, Any], *, window: int, progress: BatchProgress,
) -> list[GenerateResult]:
    """Every body's result(s), in order, with at most `window` requests in flight on `client`."""
    copies = [num_copies({**sampling, **body}) for body in bodies]
    window = max(window, *copies, 1)  # one prompt's choices go together
    results: list[list[GenerateResult]] = [[] for _ in bodies]
    todo = deque(range(len(bodies)))  # body indices not yet sent, or sent again after busy (at the front)
    prompt_of: dict[int, int] = {}  # req_id in flight -> its body's index
    req_ids_of: dict[int, list[int]] = {}  # body index in flight -> its choices' req_ids
    backoff = Backoff()
    try:
        while todo or prompt_of:
            while todo and len(prompt_of) + copies[todo[0]] <= window and backoff.wait_s() == 0:
                idx = todo.popleft()
                req_ids = req_ids_of[idx] = client.submit_all([bodies[idx]], **sampling)
                prompt_of.update(dict.fromkeys(req_ids, idx))
            if not prompt_of:  # backing off with nothing in flight
                time.sleep(backoff.wait_s())
                continue
            for req_id in client.wait_finished(prompt_of, timeout_s=backoff.wait_s() or None):
                idx = prompt_of.pop(req_id)
                if any(r in prompt_of for r in req_ids_of[idx]):
                    continue  # another choice of this prompt is still running
                try:
                    results[idx] = client.results(req_ids_of.pop(idx))
                except ServerBusyError:
                    todo.appendleft(idx)
                    backoff.busy()
                    continue
                backoff.served()
                progress.update(results[idx])
    except BaseException:
        client.discard(list(prompt_of))
        raise
    return [r for choices in results for r in choices]


async def arun_window(
    client: AsyncClient, bodies: list[dict], sampling: dict[str, Any], *, window: int, progress: BatchProgress,
) -> list[GenerateResult]:
    """run_window for asyncio: window // n workers (the largest n), each sending one prompt at a time."""
    copies = max((num_copies({**sampling, **body}) for body in bodies), default=1)
    results: list[list[GenerateResult]] = [[] for _ in bodies]
    todo = iter(range(len(bodies)))  # shared by the workers: each index is taken once
    backoff = Backoff()

    async def worker() -> None:
        for idx in todo:
            while True:
                await asyncio.sleep(backoff.wait_s())
                try:
                    results[idx] = await client.results(await client.submit_all([bodies[idx]], **sampling))
                except ServerBusyError:
                    backoff.busy()
                    continue
                backoff.served()
                progress.update(results[idx])
                break

    workers = [asyncio.ensure_future(worker()) for _ in range(min(len(bodies), max(1, window // copies)))]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for w in workers:
            w.cancel()  # a cancelled read aborts its request
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    return [r for choices in results for r in choices]
