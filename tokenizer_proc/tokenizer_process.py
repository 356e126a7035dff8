"""Entry point of the tokenizer / frontend process (torch-free: starts in well under a second)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import zmq

from zserve.common.config_sections import API_KEY_ENV, FrontendSection, ModelSection
from zserve.common.lora_modules import lora_names
from zserve.common.messages import FRONTEND_INBOX, LAUNCHER_INBOX, SCHEDULER_INBOX, ProcReady
from zserve.common.model_facts import ModelFacts
from zserve.common.proc_runtime import child_args, child_setup
from zserve.common.transport import Addresses, pull, push
from zserve.tokenizer_proc.client_registry import ClientRegistry
from zserve.tokenizer_proc.frontend import Frontend
from zserve.tokenizer_proc.request_validator import RequestValidator
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

logger = logging.getLogger("tokenizer_proc")


MIN_CLIENT_FRAME_BYTES = 64 << 20  # a client frame above max(this, 2 x --max-request-bytes) drops its connection


def bind_client_port(
    ctx: zmq.Context, host: str, port: int, max_frame_bytes: int = MIN_CLIENT_FRAME_BYTES,
) -> tuple[zmq.Socket, int]:
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)  # ZMQ drops a peer that sends more, before it is buffered
    if port == 0:
        port = router.bind_to_random_port(f"tcp://{host}")
    else:
        router.bind(f"tcp://{host}:{port}")
    return router, port


def serve(model: ModelSection, frontend: FrontendSection, addrs: Addresses, facts: ModelFacts) -> None:
    context_len = facts.context_len
    tokenizer = TextTokenizer.from_model_dir(model.tokenizer_dir)
    if facts.chat_template is not None and facts.chat_template != tokenizer.chat_template_source:
        # --chat-template: a Jinja file instead of the model's own (the launcher read it, for every process)
        logger.info("chat template from %s (instead of the model's)", facts.chat_template_origin)
        tokenizer = tokenizer.with_chat_template(facts.chat_template, facts.chat_template_origin)
    default_sampling = dict(facts.default_sampling)
    if default_sampling:
        logger.info(
            "sampling defaults from generation_config.json: %s",
            ", ".join(f"{k}={v}" for k, v in default_sampling.items()),
        )
    validator = RequestValidator(tokenizer, context_len, facts.vocab_size, default_sampling,
                                 is_embedding=facts.task.is_embedding,
                                 lora_names=lora_names(model.enable_lora, model.lora_modules))
    ctx = zmq.Context()
    try:
        max_frame_bytes = max(MIN_CLIENT_FRAME_BYTES, 2 * frontend.max_request_bytes)
        router, port = bind_client_port(ctx, frontend.host, frontend.zmq_port, max_frame_bytes)
        inbox = pull(ctx, addrs.frontend_inbox, FRONTEND_INBOX)
        to_scheduler = push(ctx, addrs.scheduler_inbox, SCHEDULER_INBOX)
        # kept open: a closed LINGER=0 socket drops its queue
        launcher = push(ctx, addrs.launcher_inbox, LAUNCHER_INBOX)
        launcher.send(ProcReady(name="tokenizer", pid=os.getpid(), info={"port": port}))
        logger.info("frontend listening on tcp://%s:%d", frontend.host, port)
        api_key = frontend.api_key or os.environ.get(API_KEY_ENV, "")  # the launcher passes it in the environment
        Frontend(validator, router, inbox, to_scheduler, ClientRegistry(frontend.client_timeout_s), api_key, launcher,
                 {"model_path": str(Path(model.model).resolve())}).run_forever()
    finally:
        ctx.destroy(linger=0)


def main() -> None:
    cfg, addrs, extra = child_args()
    child_setup("tokenizer", cfg.log_level)
    serve(cfg.section(ModelSection), cfg.section(FrontendSection), addrs, extra.model_facts)
