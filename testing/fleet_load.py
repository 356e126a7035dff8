"""Requests for a fleet's checks: a mixed load, groups sharing a long prefix, and a sender that
records every outcome (never raises for a failed request, never hangs past its timeout).

    requests = mixed_requests(200, model, seed=0)          # completions + chat, stream or not
    outcomes = asyncio.run(send_all(url, requests, concurrency=8))
    failed = [o for o in outcomes if not o.ok]

A stream is `ok` only when it ended with a finish reason and `data: [DONE]`: a stream cut by a
dying replica is a failure, reported with what was seen. `on_first_chunk` is called (in the
sender's event loop) when a stream's first chunk arrives: a test knows its streams are in flight.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


@dataclass(frozen=True)
class FleetRequest:
    path: str  # /v1/completions or /v1/chat/completions
    body: dict

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


@dataclass
class Outcome:
    request: FleetRequest
    ok: bool
    status: int  # HTTP status (0: no response: connection refused or reset)
    error: str
    ttft_s: float | None
    latency_s: float
    prompt_tokens: int = 0
    cached_tokens: int = 0


def sentence(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def mixed_requests(num_requests: int, model: str, seed: int = 0) -> list[FleetRequest]:
    """Completions and chat, streamed or not, prompts of 2-60 words, 1-24 output tokens. `model`:
    the served model's name (sglang-router refuses a completion without one, 422)."""
    rng = random.Random(seed)
    requests = []
    for idx in range(num_requests):
        text = f"request {idx}: " + sentence(rng, rng.randint(2, 60))
        body: dict = {"model": model, "max_tokens": rng.randint(1, 24), "temperature": 0.0, "stream": idx % 4 >= 2}
        if idx % 2 == 0:
            requests.append(FleetRequest("/v1/completions", {**body, "prompt": text}))
        else:
            requests.append(FleetRequest("/v1/chat/completions", {**body, "messages": [{"role": "user", "content": text}]}))
    return requests


def prefix_groups(
    num_groups: int, per_group: int, prefix_words: int, tag: str, model: str, seed: int = 1,
) -> list[list[FleetRequest]]:
    """`num_groups` groups of completions; the requests of a group share a `prefix_words`-word prefix
    and differ in a short tail. `tag` makes the prefixes differ from another call's (a fresh cache)
    while keeping their lengths."""
    rng = random.Random(seed)
    groups = []
    for group_idx in range(num_groups):
        prefix = f"{tag}{group_idx:02d} " + sentence(rng, prefix_words)
        groups.append([
            FleetRequest("/v1/completions", {"model": model, "prompt": f"{prefix} question {q}: {sentence(rng, 3)}", "max_tokens": 4, "temperature": 0.0})
            for q in range(per_group)
        ])
    return groups


async def send_one(
    session: aiohttp.ClientSession, base_url: str, request: FleetRequest, on_first_chunk: Callable[[], None] | None = None,
) -> Outcome:
    start = time.perf_counter()
    ttft_s, status = None, 0
    try:
        async with session.post(base_url + request.path, json=request.body) as response:
            status = response.status
            if status != 200:
                return Outcome(request, False, status, (await response.text())[:300], None, time.perf_counter() - start)
            if not request.stream:
                data = await response.json()
                usage = data.get("usage") or {}
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                ok = bool(data.get("choices")) and data["choices"][0].get("finish_reason") is not None
                latency_s = time.perf_counter() - start
                return Outcome(request, ok, status, "" if ok else json.dumps(data)[:300], latency_s, latency_s,
                               usage.get("prompt_tokens", 0), cached)
            finished, done = False, False
            async for line in response.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b"data: "):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return Outcome(request, False, status, json.dumps(chunk)[:300], ttft_s, time.perf_counter() - start)
                    if ttft_s is None:
                        ttft_s = time.perf_counter() - start
                        if on_first_chunk is not None:
                            on_first_chunk()
                    finished = finished or any(c.get("finish_reason") for c in chunk.get("choices", []))
            ok = finished and done
            error = "" if ok else f"stream ended without {'[DONE]' if finished else 'a finish reason'}"
            return Outcome(request, ok, status, error, ttft_s, time.perf_counter() - start)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        return Outcome(request, False, status, f"{type(exc).__name__}: {exc}"[:300], ttft_s, time.perf_counter() - start)


async def send_all(
    base_url: str, requests: list[FleetRequest], concurrency: int = 8, timeout_s: float = 60.0,
    on_first_chunk: Callable[[], None] | None = None,
) -> list[Outcome]:
    """Every request's outcome, in order, at most `concurrency` in flight."""
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:

        async def gated(request: FleetRequest) -> Outcome:
            async with gate:
                return await send_one(session, base_url, request, on_first_chunk)

        return list(await asyncio.gather(*(gated(r) for r in requests)))


async def send_groups(base_url: str, groups: list[list[FleetRequest]], timeout_s: float = 60.0) -> list[Outcome]:
    """The groups at once, each group's requests one after another (a later one can hit the
    prefix an earlier one left in the cache)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:

        async def one_group(group: list[FleetRequest]) -> list[Outcome]:
            return [await send_one(session, base_url, request) for request in group]

        results = await asyncio.gather(*(one_group(g) for g in groups))
    return [outcome for group in results for outcome in group]
