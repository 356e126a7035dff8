"""GET /server_info, /model_info (and their older names /get_server_info, /get_model_info) and /get_load,
in SGLang's shapes.

sglang-router (0.3.2) reads them when it registers a worker: GET /health first (is it HTTP, is it up),
then /server_info and /model_info, each falling back to the /get_ name on a 404. From /server_info it
takes the worker's model id, `served_model_name` (else `model_path`), which its /v1/models then lists and
its policies group workers by, and keeps `model_path`, `tp_size`, `dp_size` as the worker's labels; with
`tokenizer_path` it loads a tokenizer of its own (a failure there only warns). /model_info it proxies
for clients (the router's own GET /get_model_info). With --policy power_of_two it asks GET /get_load every
30 s (and whenever its own GET /get_loads is called), and takes the sum of `num_tokens` over the list as the
worker's load (a body of another shape reads as load -1).

The bodies hold what SGLang's hold that zserve has: the server's settings (SGLang's names), and, from
the scheduler's stats when they answer, `max_total_num_tokens` (the KV pool's tokens).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zserve.client.async_client import AsyncClient

STATS_TIMEOUT_S = 2.0  # past this, /server_info answers without the scheduler's numbers


@dataclass(frozen=True)
class ServerInfo:
    """The server's settings as SGLang's /server_info names them; built once by the HTTP process."""

    model_path: str
    tokenizer_path: str
    served_model_name: str
    context_length: int
    tp_size: int = 1
    page_size: int = 16
    max_running_requests: int = 64
    chunked_prefill_size: int = 512
    host: str = "127.0.0.1"
    port: int = 0
    dp_size: int = 1  # no data parallelism inside one zserve server: run replicas behind the router instead
    disaggregation_mode: str = "null"  # SGLang's value for a server that does both prefill and decode

    def server_info(self, stats: dict[str, Any] | None) -> dict[str, Any]:
        """SGLang's /server_info: the settings, then the scheduler's numbers (absent when stats did not answer)."""
        body: dict[str, Any] = {
            **asdict(self), "max_req_input_len": self.context_length - 1, "version": zserve_version(),
        }
        if stats is not None and "num_free_pages" in stats:
            num_pages = stats["num_free_pages"] + stats["num_cached_pages"] + stats["num_used_pages"]
            body["max_total_num_tokens"] = num_pages * self.page_size
        if stats is not None and "memory" in stats:
            body["memory"] = stats["memory"]  # the model worker's weights by form and type, and its KV pool
        return body

    def model_info(self) -> dict[str, Any]:
        """SGLang's /model_info."""
        config = model_config(self.model_path)
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "served_model_name": self.served_model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",  # SGLang's default: weights are never swapped in a running zserve
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": config.get("model_type"),
            "architectures": config.get("architectures"),
            "context_length": self.context_length,
        }


def load_info(stats: dict[str, Any], page_size: int) -> list[dict[str, Any]]:
    """SGLang's /get_load: one entry per data-parallel rank (here one); num_tokens is the KV held by live
    requests (their own pages and the cached pages they lock), as SGLang counts it."""
    num_pages = stats["num_used_pages"] + stats["num_cached_pages"] - stats["num_evictable_pages"]
    num_waiting = stats["num_waiting"]
    return [{"dp_rank": 0, "num_reqs": stats["num_running"] + stats["num_prefilling"] + num_waiting,
             "num_waiting_reqs": num_waiting, "num_tokens": num_pages * page_size}]


def model_config(model_path: str) -> dict[str, Any]:
    """config.json of a model directory; {} for a GGUF file or a directory without one."""
    path = Path(model_path) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def zserve_version() -> str:
    try:
        return importlib.metadata.version("zserve")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def server_info_routes(info: ServerInfo, client: AsyncClient) -> list[Route]:
    async def server_info(request: Request) -> Response:
        try:
            stats = await asyncio.wait_for(client.stats(), STATS_TIMEOUT_S)
        except Exception:  # answered without the scheduler's numbers (max_total_num_tokens is left out)
            stats = None
        return JSONResponse(info.server_info(stats))

    async def model_info(request: Request) -> Response:
        return JSONResponse(info.model_info())

    async def get_load(request: Request) -> Response:
        try:
            stats = await asyncio.wait_for(client.stats(), STATS_TIMEOUT_S)
        except Exception as exc:  # no load to report: the router reads a failed answer as "load unknown"
            return JSONResponse(
                {"error": {"message": f"no stats from the server: {type(exc).__name__}"}}, status_code=503,
            )
        return JSONResponse(load_info(stats, info.page_size))

    routes = {"/server_info": server_info, "/get_server_info": server_info, "/model_info": model_info,
              "/get_model_info": model_info, "/get_load": get_load}
    return [Route(path, handler, methods=["GET"]) for path, handler in routes.items()]
