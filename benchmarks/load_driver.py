"""The load driver: sends a workload to a server at its arrival times through one client,
streams every answer, and records when each text chunk came back.

The address picks the client: `tcp://HOST:PORT` the ZMQ AsyncClient, `http://HOST:PORT` the
OpenAI HTTP API through testing/http_client.py (zserve's HTTP front end, or another server such
as vLLM's, whose /metrics has none of zserve's stats: they are then empty).

Sampling is greedy; `ignore_eos` makes every request generate exactly its `max_tokens`.
Server stats are read before and after the run, so the run's prefix hits can be told apart
from what came before (warm-up requests, earlier runs against the same server).
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass

from tqdm import tqdm

from benchmarks.metrics import RequestRecord
from benchmarks.workloads import BenchRequest
from zserve.client import AsyncClient

WARMUP_PROMPT = "Warm-up request number {i}: say something short."


@dataclass(slots=True)
class LoadRun:
    records: list[RequestRecord]
    start_s: float  # perf_counter time of the first scheduled send
    stats_before: dict
    stats_after: dict

    def stat_delta(self, name: str) -> int | float:
        """How much a scheduler total grew during the run (counts are ints, seconds floats)."""
        return self.stats_after.get(name, 0) - self.stats_before.get(name, 0)


@dataclass(frozen=True, slots=True)
class LoadOptions:
    ignore_eos: bool = True
    request_timeout_s: float | None = None
    num_warmup_requests: int = 1
    progress_desc: str = "requests"
    show_progress: bool = True
    model: str | None = None  # the OpenAI `model` field, for HTTP servers that require it


def drive(address: str, requests: list[BenchRequest], offsets_s: list[float], options: LoadOptions) -> LoadRun:
    return asyncio.run(_drive(address, requests, offsets_s, options))


def open_client(address: str, timeout_s: float | None, model: str | None = None):
    """The client for `address`: ZMQ for tcp://, HTTP (OpenAI API) for http://."""
    if address.startswith("http://"):
        from testing.http_client import HttpClient

        return HttpClient(address, model=model, timeout_s=timeout_s)
    return AsyncClient(address, timeout_s=timeout_s)


async def _drive(address: str, requests: list[BenchRequest], offsets_s: list[float], options: LoadOptions) -> LoadRun:
    assert len(requests) == len(offsets_s)
    async with open_client(address, options.request_timeout_s, options.model) as client:
        # short, unrelated prompts: they warm the worker up without seeding the prefix cache
        await asyncio.gather(*(
            client.generate(WARMUP_PROMPT.format(i=i), max_tokens=4, temperature=0.0)
            for i in range(options.num_warmup_requests)
        ))
        stats_before = await client.stats()
        # progress in output tokens (a long run shows movement before the first request ends)
        bar = tqdm(total=sum(r.max_tokens for r in requests), desc=options.progress_desc, file=sys.stderr,
                   disable=not options.show_progress, mininterval=1.0, unit="tok", dynamic_ncols=True)
        done = [0]
        start_s = time.perf_counter() + 0.05  # room to create the tasks before the first send
        try:
            records = await asyncio.gather(*(
                _one_request(client, req, start_s + offset_s, options.ignore_eos, bar, done)
                for req, offset_s in zip(requests, offsets_s, strict=True)
            ))
        finally:
            bar.close()
        stats_after = await client.stats()
    return LoadRun(list(records), start_s, stats_before, stats_after)


async def _one_request(
    client: AsyncClient, req: BenchRequest, send_at_s: float, ignore_eos: bool, bar: tqdm, done: list[int],
) -> RequestRecord:
    delay_s = send_at_s - time.perf_counter()
    if delay_s > 0:
        await asyncio.sleep(delay_s)
    record = RequestRecord(send_s=time.perf_counter())
    try:
        async for delta, result in client.stream_outputs(
            **req.client_kwargs(), max_tokens=req.max_tokens, temperature=0.0, ignore_eos=ignore_eos,
        ):
            now_s = time.perf_counter() - record.send_s
            if delta:
                record.chunk_times_s.append(now_s)
            bar.update(result.usage.completion_tokens - record.num_output_tokens)
            record.num_output_tokens = result.usage.completion_tokens
            if result.finish_reason is not None:
                record.latency_s = now_s
                record.finish_reason = result.finish_reason
                record.num_prompt_tokens = result.usage.prompt_tokens
                record.num_cached_tokens = result.usage.cached_tokens
    except Exception as exc:  # a failed request is a figure of the run, not the end of it
        record.error = f"{type(exc).__name__}: {exc}"
    done[0] += 1
    bar.set_postfix_str(f"{done[0]} requests done", refresh=False)
    return record
