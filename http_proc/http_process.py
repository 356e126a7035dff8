"""Entry point of the HTTP process:
`python -m zserve.http_proc --config JSON --addresses JSON --model-facts JSON --client-port N`.

Started by the launcher with the other processes when the client port is fixed (the default), else
once the frontend has picked one. It binds --http-port and serves the Starlette app with uvicorn
(httptools) on a uvloop event loop at once, /health answering 503 "starting" until the server
answers its stats; then it tells the launcher it is ready, and serves until SIGTERM: then /health
turns 503 ("draining"), the listening socket closes, and in-flight responses get a few seconds to
finish.

It loads no tokenizer: token texts (logprobs, an echoed prompt of ids) come with the results, from
the detokenizer, and the context and tool-call format come from the launcher's ModelFacts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import uuid

import uvicorn
import uvloop
import zmq

from zserve.client.async_client import AsyncClient
from zserve.common.messages import LAUNCHER_INBOX, PROBE_CLIENT_PREFIX, ProcReady
from zserve.common.model_facts import ModelFacts
from zserve.common.proc_runtime import child_setup
from zserve.common.server_config import API_KEY_ENV, ServerConfig
from zserve.common.transport import Addresses, push
from zserve.http_proc.http_app import build_app
from zserve.http_proc.http_settings import HttpSettings
from zserve.http_proc.reasoning import ReasoningParser
from zserve.http_proc.shared.health_monitor import HealthMonitor
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.request_gate import WILDCARD_HOSTS, GatePolicy
from zserve.http_proc.shared.server_metrics import ServerMetrics
from zserve.http_proc.shared.unknown_fields import UnknownFieldPolicy
from zserve.http_proc.tools.parser import ToolCallParser

logger = logging.getLogger("http_proc")
GRACEFUL_SHUTDOWN_S = 3


class HttpServer(uvicorn.Server):
    """uvicorn's server, which marks the health monitor draining when a stop signal arrives."""

    def __init__(self, config: uvicorn.Config, health: HealthMonitor):
        super().__init__(config)
        self.health = health

    def handle_exit(self, sig: int, frame) -> None:
        if sig == signal.SIGINT:
            return  # a terminal's Ctrl-C reaches the whole process group: the launcher drains, then sends SIGTERM
        self.health.mark_draining(f"received {signal.Signals(sig).name}")
        super().handle_exit(sig, frame)


def bind_http_socket(host: str, port: int) -> socket.socket:
    try:
        sock = socket.create_server((host, port), backlog=2048)
    except OSError as exc:
        raise SystemExit(f"cannot listen for HTTP on {host}:{port}: {exc}") from None
    sock.setblocking(False)
    return sock


async def serve(settings: HttpSettings, addrs: Addresses, facts: ModelFacts, client_port: int) -> None:
    http, frontend, info = settings.http, settings.frontend, settings.server_info
    context_len = facts.context_len  # /v1/models
    sock = bind_http_socket(frontend.host, http.http_port)
    client_host = "127.0.0.1" if frontend.host in WILDCARD_HOSTS else frontend.host
    ctx = zmq.Context()
    try:
        api_key = frontend.api_key or os.environ.get(API_KEY_ENV, "")  # the launcher passes it in the environment
        probe_id = PROBE_CLIENT_PREFIX + uuid.uuid4().hex
        async with AsyncClient(client_port, host=client_host, api_key=api_key) as client, \
                AsyncClient(client_port, host=client_host, api_key=api_key, client_id=probe_id) as probe_client:
            health = HealthMonitor(client, probe_client, watchdog_s=http.watchdog_timeout_s,
                                   is_embedding=facts.task.is_embedding)
            model_path, model_name = info.model_path, info.served_model_name
            gate = GatePolicy.build(
                frontend.host, http.allowed_hosts, http.allowed_origins, api_key, frontend.max_request_bytes,
                context_len,
            )
            state = HttpState(client, model_name, model_path, context_len, ServerMetrics(model_name), health, gate,
                              tool_parser=ToolCallParser.for_format(facts.tool_call_format),  # the chat template's
                              unknown_fields=UnknownFieldPolicy(strict=http.strict_requests), server_info=info,
                              reasoning_parser=ReasoningParser.of(http.reasoning_parser, facts.think_end_ids),
                              embedding_size=facts.task.embedding_size,
                              lora_names=settings.lora_names)
            config = uvicorn.Config(
                build_app(state), loop="none", http="httptools", lifespan="off", access_log=False, log_config=None,
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                timeout_keep_alive=http.http_keep_alive_s,  # outlives the router's idle connections
            )
            server = HttpServer(config, health)
            serving = asyncio.create_task(server.serve(sockets=[sock]))  # /health answers 503 "starting" meanwhile
            url = f"http://{frontend.host}:{http.http_port}"
            logger.info(
                "HTTP listening on %s (model %s, client port %d); waiting for the server", url, model_name, client_port,
            )
            while health.state == "starting" and not serving.done():  # ready once the server answers
                await health.poll_once()
                await asyncio.sleep(0.05)
            health_task = asyncio.create_task(health.run())
            launcher = push(ctx, addrs.launcher_inbox, LAUNCHER_INBOX)  # kept open until exit (LINGER=0 drops on close)
            launcher.send(ProcReady(name="http", pid=os.getpid(), info={"port": http.http_port, "url": url}))
            try:
                await serving
            finally:
                health_task.cancel()
    finally:
        ctx.destroy(linger=0)


def parse_args(argv: list[str] | None = None) -> tuple[HttpSettings, Addresses, ModelFacts, int]:
    """The command line, the config kept as what this process reads of it (http_settings.py)."""
    parser = argparse.ArgumentParser(prog="python -m zserve.http_proc")
    parser.add_argument("--config", required=True)
    parser.add_argument("--addresses", required=True)
    parser.add_argument("--model-facts", required=True, type=ModelFacts.from_json)
    parser.add_argument("--client-port", type=int, required=True, help="the frontend's ZMQ client port")
    ns = parser.parse_args(argv)
    cfg = ServerConfig.from_json(ns.config)
    if cfg.http_port <= 0:
        parser.error("the config has no http_port")
    return HttpSettings.of(cfg, ns.model_facts), Addresses.from_json(ns.addresses), ns.model_facts, ns.client_port


def main(argv: list[str] | None = None) -> None:
    settings, addrs, facts, client_port = parse_args(argv)
    child_setup("http", settings.frontend.log_level)
    uvloop.run(serve(settings, addrs, facts, client_port))
