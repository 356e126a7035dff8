"""The launcher's configuration, resolved once before any process starts.

    parse_config (cli.py)         each flag alone                               (exit code 2 when bad)
    resolve_config:
      resolve_speculative_config  --speculative-config JSON into the --speculative-* fields
      check_flags                 flags together; --port and --zmq-port free    (config_check.py)
      resolve_zmq_port            node 0: the default --zmq-port, when taken, becomes 0 (a free one)
      resolve_model               the demo model when --model is empty; a hub id's snapshot in the hub cache
                                  (hub_model.py); a GGUF file's metadata directory
      check_model                 the model directory (config.json parsed once, passed on); --num-threads 0
                                  becomes this node's threads per rank
      resolve_cpu_isa             --cpu-isa auto becomes this CPU's feature set; a feature it lacks is refused
      resolve_model_facts         context, chat template, tool-call format, task (facts_resolver.py)

Every step returns a new frozen config (or raises ValueError naming the flag): the ServerConfig
and ModelFacts that come out are what every child receives, and nothing changes them later.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from zserve.common.isa_features import resolve_cpu_isa
from zserve.common.model_facts import ModelFacts
from zserve.common.server_config import ServerConfig
from zserve.common.speculative_settings import resolve_speculative_config
from zserve.common.start_phases import StartPhases
from zserve.launcher.config_check import check_flags, check_model, resolve_zmq_port
from zserve.launcher.facts_resolver import resolve_model_facts

logger = logging.getLogger("launcher")


def resolve_config(cfg: ServerConfig, phases: StartPhases | None = None) -> tuple[ServerConfig, ModelFacts]:
    """The parsed flags as the config and model facts every child gets (ValueError: refuse them);
    `phases`: the launcher's start timeline, marked after the flags, the model directory and the facts."""
    phases = phases or StartPhases()
    cfg = resolve_speculative_config(cfg)
    layout = check_flags(cfg)
    if layout.is_head_node:  # a node other than 0 listens on no client port
        cfg = resolve_zmq_port(cfg)
    phases.done("flags")
    cfg = resolve_model(cfg)
    phases.done("model directory")
    cfg, model_config = check_model(cfg, layout)  # config.json read once, here
    cfg = replace(cfg, cpu_isa=resolve_cpu_isa(cfg.cpu_isa))
    facts = resolve_model_facts(cfg, model_config)
    phases.done("model facts")
    return cfg, facts


def resolve_model(cfg: ServerConfig) -> ServerConfig:
    """The demo model when --model is empty; a hub id becomes its snapshot in the hub cache (fetched when missing and
    allowed: launcher/hub_model.py); a GGUF file becomes a directory of its metadata (launcher/gguf_model_dir.py)
    whose weights stay in the file. What comes out is a local directory, the one --model every child sees."""
    if not cfg.model:
        from zserve.launcher.demo_model import ensure_demo_model

        return replace(cfg, model=str(ensure_demo_model(progress=True)))
    from zserve.launcher.gguf_model_dir import gguf_file_of, gguf_model_dir
    from zserve.launcher.hub_cache import HubCache
    from zserve.launcher.hub_model import resolve_hub_model

    hub_path = resolve_hub_model(cfg.model, cfg.gguf_file, cfg.revision, HubCache.from_env(cfg.download_dir))
    if hub_path is not None:  # the API's model name is the id as typed, not the snapshot's commit hash
        cfg = replace(cfg, model=str(hub_path), served_model_name=cfg.served_model_name or cfg.model)
        # a file of the hub cache is a symlink into blobs/: keep its name (gguf_file_of would follow the link)
        gguf_file = hub_path.absolute() if hub_path.suffix == ".gguf" else None
    else:
        for flag, value in (("--revision", cfg.revision), ("--download-dir", cfg.download_dir)):
            if value:
                logger.warning("%s %s has no effect: --model %s is a local path, not a hub id", flag, value, cfg.model)
        gguf_file = gguf_file_of(cfg.model, cfg.gguf_file)
    if gguf_file is None:
        return cfg
    model_dir = gguf_model_dir(gguf_file, with_tokenizer=not cfg.tokenizer)
    logger.info("--model %s: metadata in %s, weights read from the GGUF file", gguf_file, model_dir)
    # the API's model name is the file's, not the cache directory's
    return replace(cfg, model=str(model_dir), served_model_name=cfg.served_model_name or gguf_file.name)
