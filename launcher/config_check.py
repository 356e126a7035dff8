"""What the launcher checks before it starts any process, so a bad configuration is refused in
one line (exit code 2) in well under a second, not by a child's traceback seconds later.

    argparse (launcher/cli.py)   each flag alone: types, choices, ranges from the flags table (common/server_flags.py)
    check_flags                  flags together, --device, and that --port / --zmq-port are free
    resolve_zmq_port             the default --zmq-port, when taken, becomes a free one
    (resolve_model)              the demo model is fetched when --model is empty
    check_model                  the model directory: config.json and a supported architecture,
                                 safetensors weights, tokenizer files; the rank layout and
                                 --context-length against the model

Nothing here imports torch or transformers (startup cost): the model directory is read as JSON
and safetensors headers. Every error names the flag it is about. A port found free can still be
taken before the child binds it; the child's own error covers that race.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import socket
import struct
from dataclasses import replace
from pathlib import Path

from zserve.common.context_limit import context_length_error
from zserve.common.gguf_source import GGUF_SOURCE_FILE, gguf_source
from zserve.common.lora_modules import check_lora_flags
from zserve.common.model_config import ModelConfig
from zserve.common.rank_layout import RankLayout
from zserve.common.server_config import DEFAULT_CLIENT_PORT, ServerConfig
from zserve.common.task import Task
from zserve.tokenizer_proc.tokenizer_files import TokenizerFiles

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
# as model_proc/checkpoints/checkpoint.py reads them (it imports torch)
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"
logger = logging.getLogger("launcher")


def check_flags(cfg: ServerConfig) -> RankLayout:
    """Rules between flags and what this machine must offer; cheap, so it runs before the model is fetched."""
    if not DEVICE_PATTERN.fullmatch(cfg.device):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    if cfg.gemm_backend == "zserve_dot" and cfg.quantization not in ("int8", "int4", "gguf"):
        raise ValueError(
            "--gemm-backend zserve_dot multiplies int8 weights by int8 activations: it needs --quantization int8"
        )
    check_attention_backend(cfg)
    Task.check_flags(cfg.task, cfg.pooler_config)
    check_lora_flags(cfg.enable_lora, cfg.lora_modules, cfg.max_loras, cfg.max_lora_rank, cfg.tp_size)
    layout = RankLayout.from_config(cfg)
    if not layout.is_head_node:
        return layout  # such a node runs model worker ranks only: nothing listens on --port or --zmq-port
    if cfg.http_port:
        check_port_free("--port", cfg.host, cfg.http_port)
    if cfg.zmq_port != DEFAULT_CLIENT_PORT:  # the default one moves when taken (resolve_zmq_port)
        if cfg.http_port and cfg.http_port == cfg.zmq_port:
            raise ValueError(f"--zmq-port {cfg.zmq_port} is also the HTTP port (--port): choose another")
        # port 0 still checks that --host is an address of this machine
        check_port_free("--zmq-port", cfg.host, cfg.zmq_port)
    return layout


def check_attention_backend(cfg: ServerConfig) -> None:
    """--attention-backend triton: CUDA's (a CPU runs it only in Triton's interpreter, TRITON_INTERPRET=1, for tests),
    and triton installed. --device auto is checked by the model worker (model_proc/layers/attention.py), which knows
    what it resolved to."""
    if cfg.attention_backend != "triton":
        return
    if cfg.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "--attention-backend triton runs on CUDA, not --device cpu "
            "(TRITON_INTERPRET=1 runs it on the CPU, for tests)"
        )
    if importlib.util.find_spec("triton") is None:
        raise ValueError("--attention-backend triton: the triton package is not installed")


def resolve_zmq_port(cfg: ServerConfig) -> ServerConfig:
    """The default --zmq-port when --port or another server holds it: a free port instead (the ready line and
    the log say which), so a second server started with only its own --port still starts."""
    if cfg.zmq_port != DEFAULT_CLIENT_PORT:
        return cfg
    try:
        if cfg.http_port == cfg.zmq_port:
            raise ValueError("it is --port")
        check_port_free("--zmq-port", cfg.host, cfg.zmq_port)
        return cfg
    except ValueError as exc:
        logger.warning("the default ZMQ client port %d is taken (%s): using a free one", cfg.zmq_port, exc)
    return replace(cfg, zmq_port=0)


def check_model(cfg: ServerConfig, layout: RankLayout) -> tuple[ServerConfig, ModelConfig]:
    """The model directory, and the flags that depend on the model; returns the config with
    --num-threads 0 resolved to this node's threads per rank, and the model's config.json as parsed
    (the launcher's one reading of it, passed on to resolve_model_facts)."""
    try:
        hf = ModelConfig.from_model_dir(cfg.model)  # config.json parses; the architecture is one we implement
        check_weights(Path(cfg.model))
        if not cfg.tokenizer:
            TokenizerFiles.read(cfg.model)
    except (ValueError, OSError) as exc:
        raise ValueError(f"--model {cfg.model}: {exc}") from None
    if cfg.tokenizer:
        try:
            TokenizerFiles.read(cfg.tokenizer)
        except (ValueError, OSError) as exc:
            raise ValueError(f"--tokenizer {cfg.tokenizer}: {exc}") from None
    if cfg.quantization == "gguf" and gguf_source(cfg.model) is None:
        raise ValueError(
            f"--quantization gguf keeps a GGUF file's matrices as stored: --model {cfg.model} is not a .gguf file"
        )
    layout.check_model(hf.num_heads, hf.num_kv_heads, hf.intermediate_size)
    error = context_length_error(cfg.context_length, hf.context_len)
    if error is not None:
        raise ValueError(error)
    if cfg.chat_template:
        check_chat_template(cfg.chat_template)
    return replace(cfg, num_threads=layout.threads_per_rank(cfg.num_threads)), hf


def check_chat_template(path: str) -> None:
    """--chat-template names a readable Jinja file that compiles."""
    from zserve.tokenizer_proc.chat_template import ChatTemplate

    try:
        ChatTemplate(Path(path).read_text(encoding="utf-8"), path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"--chat-template {path}: {exc}") from None


def check_port_free(flag: str, host: str, port: int) -> None:
    """Bind host:port for a moment (with SO_REUSEADDR, as ZMQ and uvicorn bind)."""
    bind_host = "" if host == "*" else host
    try:
        infos = socket.getaddrinfo(bind_host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family = infos[0][0]
        with socket.create_server((bind_host, port), family=family):
            pass
    except OSError as exc:
        what = f"{flag} {port}: cannot listen on {host}:{port}" if port else f"--host {host}: cannot listen there"
        if isinstance(exc, socket.gaierror) or not exc.errno:
            reason = exc.strerror or str(exc)
        else:
            reason = os.strerror(exc.errno)  # create_server's own text repeats the address
        raise ValueError(f"{what}: {reason}") from None


def check_weights(model_dir: Path) -> None:
    """model.safetensors, or every file model.safetensors.index.json lists, present with a readable header;
    or the GGUF file a directory made by launcher/gguf_model_dir.py points at."""
    source = gguf_source(model_dir)
    if source is not None:
        if not source.is_file():
            raise FileNotFoundError(f"{source} not found ({model_dir / GGUF_SOURCE_FILE} points at it)")
        return
    index_path = model_dir / WEIGHTS_INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
            files = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"{index_path} is malformed ({exc!r}); expected {{'weight_map': {{name: file}}}}"
            ) from None
    elif (model_dir / WEIGHTS_FILE).is_file():
        files = [WEIGHTS_FILE]
    else:
        raise FileNotFoundError(f"no weights in {model_dir}: expected {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE}")
    for name in files:
        check_safetensors_header(model_dir / name)


def check_safetensors_header(path: Path) -> None:
    """A safetensors file starts with a little-endian u64 header length, then that much JSON."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (the weights index lists it)")
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        header_len = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < header_len <= size - 8:
            raise ValueError(f"{path} is not a safetensors file (truncated, or another format)")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            header = None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a safetensors file: its header is not a JSON object")
