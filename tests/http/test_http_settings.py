"""What the HTTP process keeps of the config (http_proc/http_settings.py): its sections, and /server_info's
settings with the served name (--served-model-name, else the model directory's name)."""

from __future__ import annotations

from pathlib import Path

from zserve.common.config_sections import FrontendSection, HttpSection
from zserve.common.model_facts import ModelFacts
from zserve.common.server_config import ServerConfig
from zserve.http_proc.http_settings import HttpSettings


def test_the_http_process_keeps_its_sections_and_the_reported_settings(tmp_path):
    cfg = ServerConfig(model=str(tmp_path / "tiny"), http_port=8123, strict_requests=True, api_key="k", page_size=32,
                       max_prefill_tokens=256, tp_size=2)
    settings = HttpSettings.of(cfg, ModelFacts(context_len=300))
    assert settings.http == HttpSection(http_port=8123, strict_requests=True)
    assert settings.frontend == FrontendSection(api_key="k")
    info = settings.server_info
    assert (info.model_path, info.tokenizer_path) == (str((tmp_path / "tiny").resolve()),) * 2
    assert (info.served_model_name, info.context_length, info.port) == ("tiny", 300, 8123)
    assert (info.tp_size, info.page_size, info.chunked_prefill_size) == (2, 32, 256)
    named = HttpSettings.of(ServerConfig(model="m", served_model_name="mine"), ModelFacts(context_len=300))
    assert named.server_info.served_model_name == "mine" and named.server_info.model_path == str(Path("m").resolve())
