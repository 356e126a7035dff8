"""Engine: the whole server in a `with` block, for offline batches (vLLM's `LLM`, SGLang's `Engine`).

    from zserve import Engine

    with Engine("/path/to/model", max_running_requests=32) as engine:
        results = engine.generate(["Hello", "The capital of France is"], {"max_tokens": 32})
        for delta in engine.stream("Once upon a time", {"max_tokens": 64}):
            print(delta, end="")

It starts `launch_server` (every process) with the keyword arguments as its flags
(`max_running_requests=32` is `--max-running-requests 32`), on a free client port and without
HTTP unless asked, waits until it is ready (launcher/server_subprocess.py: the launcher's typed
ready record; its log lines go to stderr, so model loading shows progress), and talks to it through
the Python client. `generate` takes any number of prompts
(vLLM users pass tens of thousands): it keeps `max_in_flight` requests in flight, below the
server's queue cap, shows a progress bar (`use_tqdm=False`: none) and returns the results in the
prompts' order; `agenerate` is the asyncio form, `stream` streams one prompt. Without max_tokens a
request generates at most 128 tokens (SGLang's native default); `{"max_tokens": None}` asks for up
to the context. Leaving the block, `shutdown()`, or the interpreter exiting stops every process; nothing
is left behind, also when the block raises.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import fields
from typing import Any

from zserve.client.async_client import AsyncClient
from zserve.client.batch_progress import BatchProgress
from zserve.client.batch_window import arun_window, run_window
from zserve.client.client import Client
from zserve.client.types import GenerateResult
from zserve.common.net_ports import free_port
from zserve.common.sampling_params import SamplingParams
from zserve.common.server_config import ServerConfig
from zserve.common.server_flags import flag_of
from zserve.launcher.cli import parse_config
from zserve.launcher.server_subprocess import ServerStartError, ServerSubprocess

STOP_TIMEOUT_S = 30.0
IN_FLIGHT_PER_SLOT = 4  # requests in flight per request slot: the queue keeps every slot busy
Prompts = str | Sequence[str] | Sequence[Sequence[int]]


class EngineError(RuntimeError):
    """The server did not start (its last log lines are in the message) or stopped unexpectedly."""


class Engine:
    def __init__(
        self, model: str = "", *, server_args: Sequence[str] = (), startup_timeout_s: float = 600.0,
        echo_logs: bool = True,
        **flags: Any,
    ):
        """`model`: a model directory ("" = the demo model). `flags`: launch_server flags by their
        ServerConfig names (`tp_size=2`, `disable_radix_cache=True`); `server_args`: more, as on a
        command line. `echo_logs`: copy the server's log lines to stderr."""
        self.argv = [*(["--model", model] if model else []), *_flag_args(flags), *server_args]
        if not _given(self.argv, "--zmq-port"):
            self.argv += ["--zmq-port", str(free_port())]
        self.port: int | None = None  # the ZMQ client port, from the ready record (a given --zmq-port 0 picks one)
        if not _given(self.argv, "--port") and not _given(self.argv, "--http-port"):
            self.argv += ["--port", "0"]  # no HTTP server unless asked
        self._client: Client | None = None
        self._server = ServerSubprocess.start(self.argv, echo_logs=echo_logs, max_log_lines=1000)
        self._proc = self._server.proc
        self.log_lines = self._server.log_lines  # the server's output, the newest 1000 lines or more
        atexit.register(self.shutdown)
        try:
            try:
                self.port = self._server.wait_ready(startup_timeout_s).zmq_port
            except ServerStartError as exc:
                raise EngineError(str(exc)) from None
            self.max_in_flight = _max_in_flight(self.argv)
            self._client = Client(self.address)
        except BaseException:
            self.shutdown()
            raise

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    # ---- generation ----------------------------------------------------------------------------

    def generate(
        self, prompts: Prompts | None = None, sampling: dict[str, Any] | SamplingParams | None = None, *,
        messages: Sequence[list[dict]] | None = None, use_tqdm: bool = True,
    ) -> list[GenerateResult]:
        """One result per prompt (a string, or a list of token ids) or per conversation
        (`messages`), in their order; with `n`, each prompt's n choices in turn (prompt p's choice
        i at p * n + i). Any number of prompts: `max_in_flight` requests are in flight at a time
        (client/batch_window.py), and a progress bar on stderr counts finished prompts unless
        `use_tqdm=False`. No max_tokens: 128 each; `{"max_tokens": None}`: up to the context."""
        client = self._live_client()
        bodies = _bodies(prompts, messages)
        with BatchProgress(len(bodies), enabled=use_tqdm) as progress:
            return run_window(client, bodies, _sampling_dict(sampling), window=self.max_in_flight, progress=progress)

    def stream(
        self, prompt: str | Sequence[int] | None = None, sampling: dict[str, Any] | SamplingParams | None = None, *,
        messages: list[dict] | None = None,
    ) -> Iterator[str]:
        """Text deltas of one prompt as they come (leaving the loop early aborts it)."""
        [body] = _bodies(None if prompt is None else [prompt], None if messages is None else [messages])
        yield from self._live_client().stream(**body, **_sampling_dict(sampling))

    async def agenerate(
        self, prompts: Prompts | None = None, sampling: dict[str, Any] | SamplingParams | None = None, *,
        messages: Sequence[list[dict]] | None = None, use_tqdm: bool = False,
    ) -> list[GenerateResult]:
        """`generate` for asyncio code (its own AsyncClient for the call); no progress bar unless
        `use_tqdm=True` (several calls may run at once)."""
        self._live_client()
        bodies = _bodies(prompts, messages)
        options = _sampling_dict(sampling)
        async with AsyncClient(self.address) as client:
            with BatchProgress(len(bodies), enabled=use_tqdm) as progress:
                return await arun_window(client, bodies, options, window=self.max_in_flight, progress=progress)

    async def astream(
        self, prompt: str | Sequence[int] | None = None, sampling: dict[str, Any] | SamplingParams | None = None, *,
        messages: list[dict] | None = None,
    ) -> AsyncIterator[str]:
        [body] = _bodies(None if prompt is None else [prompt], None if messages is None else [messages])
        self._live_client()
        async with AsyncClient(self.address) as client:
            async for delta in client.stream(**body, **_sampling_dict(sampling)):
                yield delta

    def stats(self) -> dict:
        return self._live_client().stats()

    # ---- lifetime ------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop every process (in-flight requests are aborted); safe to call more than once."""
        atexit.unregister(self.shutdown)
        if self._client is not None:
            self._client.close()
            self._client = None
        try:
            self._server.stop(timeout_s=STOP_TIMEOUT_S, drain=False)  # nobody waits for the in-flight answers
        except subprocess.TimeoutExpired:
            self._server.kill()  # its children die with it (PR_SET_PDEATHSIG)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---- plumbing ------------------------------------------------------------------------------

    def _live_client(self) -> Client:
        if self._client is None:
            raise EngineError("the engine is shut down")
        if self._proc.poll() is not None:
            raise EngineError(f"the server exited with code {self._proc.returncode}:\n{self._server.log_tail(30)}")
        return self._client


def _flag_args(flags: dict[str, Any]) -> list[str]:
    """ServerConfig field names and values -> launch_server arguments; an unknown name is a TypeError."""
    known = {f.name: f for f in fields(ServerConfig)}
    argv: list[str] = []
    for name, value in flags.items():
        if name not in known:
            raise TypeError(f"Engine() got an unknown server flag {name!r}; the flags are ServerConfig's fields")
        flag = flag_of(name)
        if isinstance(value, bool):
            argv += [flag] if value else []
        else:
            argv += [flag, str(value)]
    return argv


def _max_in_flight(argv: list[str]) -> int:
    """How many requests `generate` keeps in flight: IN_FLIGHT_PER_SLOT per request slot, and never
    more than the server queues (--max-queued-requests), so the server does not answer busy."""
    with contextlib.redirect_stderr(io.StringIO()):  # the server printed its warnings about these flags already
        cfg = parse_config(argv)
    return max(1, min(cfg.max_queued_requests, IN_FLIGHT_PER_SLOT * cfg.max_running_requests))


def _given(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _bodies(prompts: Prompts | None, messages: Sequence[list[dict]] | None) -> list[dict[str, Any]]:
    if (prompts is None) == (messages is None):
        raise ValueError("give prompts or messages (one of them)")
    if messages is not None:
        return [{"messages": list(m)} for m in messages]
    if isinstance(prompts, str):
        prompts = [prompts]
    return [{"prompt": p} if isinstance(p, str) else {"input_ids": list(p)} for p in prompts]


def _sampling_dict(sampling: dict[str, Any] | SamplingParams | None) -> dict[str, Any]:
    if sampling is None:
        return {}
    if isinstance(sampling, SamplingParams):  # its max_tokens=None is the field's default: the clients' 128
        return {k: v for k, v in sampling.to_dict().items() if v is not None}
    return dict(sampling)  # {"max_tokens": None} stays: up to the context
