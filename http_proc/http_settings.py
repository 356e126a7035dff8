"""What the HTTP process reads of the one server configuration, as typed records: its own section
(HttpSection: the port, the gate's lists, the parsers, the watchdog, keep-alive), the frontend's
(FrontendSection: the host, the API key, the body cap, the log level), and the settings it reports on
/server_info in SGLang's names (ServerInfo: the model's and tokenizer's paths and served name, the model
facts' context, and --tp-size, --page-size, --max-running-requests, --max-prefill-tokens of the other
sections). The process receives the whole ServerConfig as JSON and keeps only these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zserve.common.config_sections import FrontendSection, HttpSection
from zserve.common.lora_modules import lora_names
from zserve.common.model_facts import ModelFacts
from zserve.common.server_config import ServerConfig
from zserve.http_proc.shared.server_info import ServerInfo


@dataclass(frozen=True)
class HttpSettings:
    http: HttpSection
    frontend: FrontendSection
    server_info: ServerInfo  # also the served model's path and name (/v1/models, the metrics' label)
    lora_names: tuple[str, ...] = ()  # the LoRA adapters requests may name (--lora-modules)

    @staticmethod
    def of(cfg: ServerConfig, facts: ModelFacts) -> HttpSettings:
        model_path = str(Path(cfg.model).resolve())
        info = ServerInfo(
            model_path, str(Path(cfg.tokenizer_dir).resolve()), cfg.served_model_name or Path(model_path).name,
            facts.context_len, tp_size=cfg.tp_size, page_size=cfg.page_size,
            max_running_requests=cfg.max_running_requests, chunked_prefill_size=cfg.max_prefill_tokens,
            host=cfg.host, port=cfg.http_port,
        )
        return HttpSettings(cfg.section(HttpSection), cfg.section(FrontendSection), info,
                            lora_names(cfg.enable_lora, cfg.lora_modules))
