"""The launcher's model facts for a test's config, as resolve_config reads them (config.json parsed once, passed on)."""

from __future__ import annotations

from zserve.common.model_config import ModelConfig
from zserve.common.model_facts import ModelFacts
from zserve.common.server_config import ServerConfig
from zserve.launcher.facts_resolver import resolve_model_facts


def facts_of(cfg: ServerConfig) -> ModelFacts:
    return resolve_model_facts(cfg, ModelConfig.from_model_dir(cfg.model))
