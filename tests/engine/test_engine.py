"""zserve.Engine: the server in a `with` block. 256 prompts come back in order, equal to what a
server started by hand answers; streaming and asyncio forms; no process left behind, also when
the block raises."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

import zserve
from testing.processes import wait_dead
from testing.server_process import start_server

FLAGS = {"dtype": "float32", "num_threads": 1, "kv_cache_tokens": 8192, "max_running_requests": 32}
PROMPTS = [f"Prompt number {i}: the {'quick ' * (i % 7)}brown fox" for i in range(256)]
SAMPLING = {"max_tokens": 8, "ignore_eos": True}


def child_pids(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.fixture(scope="module")
def expected(model_dir):
    flags = [arg for name, value in FLAGS.items() for arg in ("--" + name.replace("_", "-"), str(value))]
    server = start_server(model_dir, *flags)
    try:
        with zserve.Client(server.port, timeout_s=120) as c:
            return [c.generate(p, **SAMPLING).output_ids for p in PROMPTS]
    finally:
        assert server.stop() == 0


def test_generate_256_prompts_in_order_equal_to_the_servers_outputs_then_stops_everything(model_dir, expected):
    with zserve.Engine(str(model_dir), echo_logs=False, **FLAGS) as engine:
        launcher_pid = engine._proc.pid
        children = child_pids(launcher_pid)
        results = engine.generate(PROMPTS, SAMPLING)
        assert [r.output_ids for r in results] == expected
        assert all(r.finish_reason == "length" for r in results)
        text = "".join(engine.stream(PROMPTS[3], SAMPLING))
        assert text == results[3].text
        async_results = asyncio.run(engine.agenerate(PROMPTS[:4], zserve.SamplingParams(max_tokens=8, ignore_eos=True)))
        assert [r.output_ids for r in async_results] == expected[:4]
        ids_results = engine.generate([results[0].output_ids], {"max_tokens": 2})  # token-id prompts too
        assert len(ids_results[0].output_ids) == 2
        seeded = {"max_tokens": 4, "temperature": 1.0, "ignore_eos": True}
        choices = engine.generate(PROMPTS[:2], {**seeded, "n": 2, "seed": 7})  # each prompt's choices in turn
        singles = [engine.generate([p], {**seeded, "seed": 7 + i})[0] for p in PROMPTS[:2] for i in range(2)]
        assert [r.output_ids for r in choices] == [r.output_ids for r in singles]
        async_choices = asyncio.run(engine.agenerate(PROMPTS[:2], {**seeded, "n": 2, "seed": 7}))
        assert [r.output_ids for r in async_choices] == [r.output_ids for r in singles]
    assert engine._proc.returncode == 0
    assert wait_dead([launcher_pid, *children], 10) == []


def test_an_exception_in_the_block_still_stops_every_process(model_dir):
    # zmq_port=0: the server picks the port and the Engine reads it from the ready line
    with pytest.raises(KeyError, match="boom"), zserve.Engine(str(model_dir), echo_logs=False, zmq_port=0, **FLAGS) as engine:
        launcher_pid = engine._proc.pid
        children = child_pids(launcher_pid)
        assert len(children) >= 4
        assert engine.port and engine.generate(["hi"], {"max_tokens": 1}, use_tqdm=False)[0].usage.completion_tokens == 1
        raise KeyError("boom")
    assert wait_dead([launcher_pid, *children], 10) == []
    with pytest.raises(zserve.EngineError, match="shut down"):
        engine.generate(["too late"])


def test_bad_flags_fail_at_once_with_the_servers_reason(model_dir):
    with pytest.raises(TypeError, match="unknown server flag 'no_such_flag'"):
        zserve.Engine(str(model_dir), no_such_flag=1)
    with pytest.raises(zserve.EngineError, match="--page-size: must be >= 1"):
        zserve.Engine(str(model_dir), echo_logs=False, page_size=0)


def test_public_names():
    for name in ("Engine", "Client", "AsyncClient", "SamplingParams", "ServerError", "InvalidRequestError",
                 "ServerBusyError", "ServerGoneError", "ServerShuttingDownError", "UnauthorizedError", "RequestTimeoutError"):
        assert hasattr(zserve, name), name
