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

SGLang's shape: `Engine(model_path=..., tp_size=..., context_length=...)` (any spelling of a flag:
zserve/engine_keywords.py) and `generate(prompt=..., sampling_params=...)` with SGLang's names return
SGLang's dicts (`{"text", "output_ids", "meta_info"}`); vLLM's is zserve.LLM (zserve/llm.py), on this class.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from zserve.client.async_client import AsyncClient
from zserve.client.batch_progress import BatchProgress
from zserve.client.batch_window import arun_window, run_window
from zserve.client.client import Client
from zserve.client.sglang_shape import native_sampling, sglang_output
from zserve.client.types import GenerateResult
from zserve.common.net_ports import free_port
from zserve.common.sampling_params import SamplingParams as WireSamplingParams
from zserve.engine_keywords import config_values, flag_args
from zserve.launcher.cli import parse_config
from zserve.launcher.server_subprocess import ServerStartError, ServerSubprocess
from zserve.sampling_params import request_options
from zserve.sglang_result import SglangResult

STOP_TIMEOUT_S = 30.0
IN_FLIGHT_PER_SLOT = 4  # requests in flight per request slot: the queue keeps every slot busy
Prompts = str | Sequence[str] | Sequence[Sequence[int]]
Sampling = dict[str, Any] | WireSamplingParams  # zserve.SamplingParams is one too
Samplings = Sampling | Sequence[Sampling] | None  # one for every prompt, or one per prompt


class EngineError(RuntimeError):
    """The server did not start (its last log lines are in the message) or stopped unexpectedly."""


class Engine:
    def __init__(
        self, model: str = "", *, server_args: Sequence[str] = (), startup_timeout_s: float = 600.0,
        echo_logs: bool = True,
        **flags: Any,
    ):
        """`model`: a model directory, a .gguf file or a hub id (org/name, org/repo:QUANT; `revision=`,
        `download_dir=`: launcher/hub_model.py) ("" = the demo model; SGLang's `model_path=` too). `flags`:
        launch_server flags by their ServerConfig names or any spelling of the flag, SGLang's and vLLM's included
        (`tp_size=2`, `tensor_parallel_size=2`, `context_length=`, `enable_prefix_caching=False`:
        zserve/engine_keywords.py); `server_args`: more, as on a command line. `echo_logs`: copy the
        server's log lines to stderr."""
        values = config_values(flags, "Engine()", {"model": "model"} if model else None)
        self.argv = [*(["--model", model] if model else []), *flag_args(values), *server_args]
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
        self, prompts: Prompts | None = None, sampling: Samplings = None, *,
        messages: Sequence[list[dict]] | None = None, use_tqdm: bool = True,
        prompt: Prompts | None = None, sampling_params: Samplings = None, input_ids: Sequence | None = None,
    ) -> list[GenerateResult] | list[dict[str, Any]] | dict[str, Any]:
        """One result per prompt (a string, or a list of token ids) or per conversation
        (`messages`), in their order; with `n`, each prompt's n choices in turn (prompt p's choice
        i at p * n + i). `sampling`: one setting for every prompt, or a list of one per prompt. Any
        number of prompts: `max_in_flight` requests are in flight at a time (client/batch_window.py),
        and a progress bar on stderr counts finished prompts unless `use_tqdm=False`. No max_tokens:
        128 each; `{"max_tokens": None}`: up to the context.

        SGLang's form: called with its keywords `prompt=`, `sampling_params=` or `input_ids=`, it
        returns SGLang's shape, a dict `{"text", "output_ids", "meta_info"}` for one prompt (a
        string, or one list of ids) and a list of them for a list. SGLang's sampling names
        (`max_new_tokens`, ...) are taken in either form, and each result of the positional form
        reads as SGLang's dict too (`result["text"]`: SglangResult), so SGLang's quick start works."""
        if prompt is None and sampling_params is None and input_ids is None:
            results = self._generate(_bodies(prompts, messages), _sglang_sampling(sampling), use_tqdm)
            return [SglangResult.of(r) for r in results]
        texts = _one_of("prompts", prompts, "prompt", prompt)
        settings = _one_of("sampling", sampling, "sampling_params", sampling_params)
        if input_ids is not None:
            if texts is not None:
                raise ValueError("give prompt or input_ids (one of them)")
            single = not input_ids or not hasattr(input_ids[0], "__len__")  # one list of ids
            texts = [input_ids] if single else input_ids
        else:
            single = isinstance(texts, str)
        results = self._generate(_bodies(texts, messages), _sglang_sampling(settings), use_tqdm)
        outputs = [sglang_output(r) for r in results]
        return outputs[0] if single and len(outputs) == 1 else outputs

    def tokenize(self, prompt: str | None = None, *, messages: list[dict] | None = None) -> list[int]:
        """The token ids a request with this prompt (or these chat messages, templated) would have."""
        [body] = _bodies(None if prompt is None else [prompt], None if messages is None else [messages])
        return list(self._live_client().tokenize(body).input_ids)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids` (special tokens kept)."""
        return self._live_client().tokenize({"input_ids": list(token_ids)}).text or ""

    def stream(
        self, prompt: str | Sequence[int] | None = None, sampling: Sampling | None = None, *,
        messages: list[dict] | None = None,
    ) -> Iterator[str]:
        """Text deltas of one prompt as they come (leaving the loop early aborts it)."""
        [body] = _bodies(None if prompt is None else [prompt], None if messages is None else [messages])
        yield from self._live_client().stream(**body, **request_options(sampling))

    async def agenerate(
        self, prompts: Prompts | None = None, sampling: Samplings = None, *,
        messages: Sequence[list[dict]] | None = None, use_tqdm: bool = False,
    ) -> list[GenerateResult]:
        """`generate` for asyncio code (its own AsyncClient for the call); no progress bar unless
        `use_tqdm=True` (several calls may run at once)."""
        self._live_client()
        options, bodies = _with_sampling(_bodies(prompts, messages), sampling)
        async with AsyncClient(self.address) as client:
            with BatchProgress(len(bodies), enabled=use_tqdm) as progress:
                results = await arun_window(client, bodies, options, window=self.max_in_flight, progress=progress)
        return [SglangResult.of(r) for r in results]

    async def astream(
        self, prompt: str | Sequence[int] | None = None, sampling: Sampling | None = None, *,
        messages: list[dict] | None = None,
    ) -> AsyncIterator[str]:
        [body] = _bodies(None if prompt is None else [prompt], None if messages is None else [messages])
        self._live_client()
        async with AsyncClient(self.address) as client:
            async for delta in client.stream(**body, **request_options(sampling)):
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

    def _generate(self, bodies: list[dict[str, Any]], sampling: Samplings, use_tqdm: bool) -> list[GenerateResult]:
        client = self._live_client()
        options, bodies = _with_sampling(bodies, sampling)
        with BatchProgress(len(bodies), enabled=use_tqdm) as progress:
            return run_window(client, bodies, options, window=self.max_in_flight, progress=progress)

    def _live_client(self) -> Client:
        if self._client is None:
            raise EngineError("the engine is shut down")
        if self._proc.poll() is not None:
            raise EngineError(f"the server exited with code {self._proc.returncode}:\n{self._server.log_tail(30)}")
        return self._client


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


def _with_sampling(bodies: list[dict[str, Any]], sampling: Samplings) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the options every body shares, the bodies): a list of settings, one per body, goes into its body."""
    if sampling is None or isinstance(sampling, (dict, WireSamplingParams)):
        return request_options(sampling), bodies
    settings = list(sampling)
    if len(settings) != len(bodies):
        raise ValueError(f"{len(settings)} sampling settings for {len(bodies)} prompts: give one, or one per prompt")
    return {}, [{**body, **request_options(s)} for body, s in zip(bodies, settings, strict=True)]


def _sglang_sampling(sampling: Samplings) -> Samplings:
    """SGLang's sampling_params (a dict, or a list of them) in zserve's names."""
    if isinstance(sampling, dict):
        return native_sampling(sampling)
    if sampling is None or isinstance(sampling, WireSamplingParams):
        return sampling
    return [native_sampling(s) if isinstance(s, dict) else s for s in sampling]


def _one_of(name: str, value: Any, peer_name: str, peer_value: Any) -> Any:
    if value is not None and peer_value is not None:
        raise TypeError(f"give {name} or {peer_name}, not both")
    return peer_value if peer_value is not None else value
