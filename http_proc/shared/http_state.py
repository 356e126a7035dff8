"""What every HTTP route needs, built once when the HTTP process starts."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from zserve.client.async_client import AsyncClient
from zserve.http_proc.reasoning import ReasoningParser
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.health_monitor import HealthMonitor
from zserve.http_proc.shared.request_gate import GatePolicy
from zserve.http_proc.shared.server_info import ServerInfo
from zserve.http_proc.shared.server_metrics import ServerMetrics
from zserve.http_proc.shared.unknown_fields import UnknownFieldPolicy
from zserve.http_proc.tools.parser import ToolCallParser

STATS_TIMEOUT_S = 2.0  # /metrics renders without the scheduler's numbers past this
# What sglang-router 0.3.2 writes into a chat request that names no model before forwarding it: read as no name.
ROUTER_UNNAMED_MODEL = "unknown"


@dataclass(frozen=True)
class HttpState:
    client: AsyncClient
    model_name: str  # --served-model-name, or the model directory's name: what /v1/models lists and requests name
    model_path: str
    context_len: int
    metrics: ServerMetrics
    health: HealthMonitor
    gate: GatePolicy
    tool_parser: ToolCallParser | None = None  # --tool-call-parser, else the chat template's format; None: unknown
    reasoning_parser: ReasoningParser | None = None  # --reasoning-parser: chat answers' thinking split out
    # ignored and logged, or refused (--strict-requests)
    unknown_fields: UnknownFieldPolicy = field(default_factory=UnknownFieldPolicy)
    created_s: int = field(default_factory=lambda: int(time.time()))
    server_info: ServerInfo | None = None  # GET /server_info's settings (the HTTP process's); None: the basics above
    embedding_size: int | None = None  # --task embed: the length of /v1/embeddings' vectors; None: a generating server
    lora_names: tuple[str, ...] = ()  # the LoRA adapters requests may name (--lora-modules); empty: none served

    @property
    def info(self) -> ServerInfo:
        return self.server_info or ServerInfo(self.model_path, self.model_path, self.model_name, self.context_len)

    def check_model(self, requested: str | None) -> None:
        if requested is not None and requested not in (self.model_name, self.model_path, ROUTER_UNNAMED_MODEL):
            raise ApiError(404, f"the model `{requested}` does not exist; this server serves `{self.model_name}`",
                           param="model", code="model_not_found")

    def check_model_or_adapter(self, requested: str | None) -> str | None:
        """The OpenAI routes' `model`: the served model (None), or a LoRA adapter's name (vLLM's way of asking for
        one: that name); anything else a 404 naming it."""
        if requested is not None and requested in self.lora_names:
            return requested
        if requested is not None and self.lora_names and requested not in (
            self.model_name, self.model_path, ROUTER_UNNAMED_MODEL,
        ):
            raise ApiError(
                404, f"the model `{requested}` does not exist; this server serves `{self.model_name}` and the LoRA "
                     f"adapters {', '.join(self.lora_names)}", param="model", code="model_not_found",
            )
        self.check_model(requested)
        return None

    def take_lora_path(self, values: dict | None) -> str | None:
        """SGLang's `lora_path` (an adapter's name), taken out of `values` when this server serves adapters: the
        name, None when the field is absent or null; an unknown name a 404 naming it. A server without adapters
        leaves it in place (refused_fields.py refuses it)."""
        if not self.lora_names or not values or values.get("lora_path") in (None, ""):
            return None
        name = values.pop("lora_path")
        if not isinstance(name, str) or name not in self.lora_names:
            raise ApiError(404, f"the LoRA adapter {name!r} does not exist; this server serves "
                                f"{', '.join(self.lora_names)}", param="lora_path", code="lora_not_found")
        return name

    def check_accepting(self) -> None:
        if self.health.is_draining:
            raise ApiError(503, f"the server is not accepting requests ({self.health.reason})", code="server_draining")
