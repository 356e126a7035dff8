"""The launcher's one reading of the model facts every child needs (common/model_facts.py)."""

from __future__ import annotations

from pathlib import Path

from zserve.common.context_limit import served_context_len
from zserve.common.model_config import ModelConfig
from zserve.common.model_facts import ModelFacts
from zserve.common.server_config import ServerConfig
from zserve.common.task import Task
from zserve.common.think_markers import THINK_CLOSE
from zserve.common.tool_call_format import template_tool_call_format
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer
from zserve.tokenizer_proc.tokenizer_files import TokenizerFiles


def resolve_model_facts(cfg: ServerConfig, model_config: ModelConfig) -> ModelFacts:
    """The served context (the model's maximum, or --context-length), the default chat template
    (--chat-template's file, else the tokenizer's) and its tool-call format (--tool-call-parser's,
    else the template's), the vocabulary size, generation_config.json's sampling defaults, the task
    (common/task.py: --task embed's pooling) and, with --reasoning-parser, its `</think>` as token ids.
    The flags were checked before (launcher/config_check.py), which parsed `model_config` (config.json)."""
    context_len = served_context_len(model_config.context_len, cfg.context_length)
    if cfg.chat_template:
        source, origin = Path(cfg.chat_template).read_text(encoding="utf-8"), cfg.chat_template
    else:
        source, origin = TokenizerFiles.read(cfg.tokenizer_dir).chat_templates.get("default", (None, ""))
    tool_format = template_tool_call_format(source) if cfg.tool_call_parser == "auto" else cfg.tool_call_parser
    try:
        task = Task.resolve(cfg.task, cfg.model, cfg.pooler_config, model_config.hidden_size)
    except (ValueError, OSError) as exc:
        raise ValueError(f"--task {cfg.task}: {exc}") from None
    think_end_ids = ()
    if cfg.reasoning_parser not in ("", "none"):  # one token in Qwen3's and DeepSeek-R1's vocabularies
        tokenizer = TextTokenizer.from_model_dir(cfg.tokenizer_dir)
        think_end_ids = tuple(tokenizer.encode(THINK_CLOSE, add_special_tokens=False))
    return ModelFacts(context_len, source, origin, tool_format,
                      vocab_size=model_config.vocab_size, default_sampling=dict(model_config.default_sampling),
                      task=task, think_end_ids=think_end_ids)
