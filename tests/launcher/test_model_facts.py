"""The launcher resolves the model facts once (served context, chat template, tool-call format) and
every child reads them from its command line instead of working them out again."""

from __future__ import annotations

import pytest

from testing.model_facts import facts_of
from zserve.common.model_facts import ModelFacts
from zserve.common.proc_runtime import child_args
from zserve.common.server_config import ServerConfig
from zserve.common.transport import Addresses
from zserve.http_proc.http_process import parse_args as http_args
from zserve.tokenizer_proc.tokenizer_files import TokenizerFiles

HERMES_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}<tool_call>{% endif %}"


def test_context_is_the_models_or_the_flags(model_dir):
    assert facts_of(ServerConfig(model=str(model_dir))).context_len == 512  # the tiny model's maximum
    assert facts_of(ServerConfig(model=str(model_dir), context_length=64)).context_len == 64


def test_vocabulary_and_sampling_defaults_come_from_the_model_files(model_dir, tmp_path):
    import json
    import shutil

    facts = facts_of(ServerConfig(model=str(model_dir)))
    assert facts.vocab_size == json.loads((model_dir / "config.json").read_text())["vocab_size"]
    sampling_dir = tmp_path / "sampling-model"
    shutil.copytree(model_dir, sampling_dir)
    (sampling_dir / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.9}))
    facts = facts_of(ServerConfig(model=str(sampling_dir)))
    assert facts.default_sampling == {"temperature": 0.6, "top_p": 0.9}
    assert ModelFacts.from_json(facts.to_json()) == facts


def test_chat_template_is_the_tokenizers_unless_the_flag_names_a_file(model_dir, tmp_path):
    facts = facts_of(ServerConfig(model=str(model_dir)))
    source, _ = TokenizerFiles.read(model_dir).chat_templates.get("default", (None, ""))
    assert facts.chat_template == source
    path = tmp_path / "tools.jinja"
    path.write_text(HERMES_TEMPLATE)
    facts = facts_of(ServerConfig(model=str(model_dir), chat_template=str(path)))
    assert (facts.chat_template, facts.chat_template_origin, facts.tool_call_format) == (HERMES_TEMPLATE, str(path), "hermes")


def test_tool_call_parser_flag_wins_over_the_templates_format(model_dir, tmp_path):
    path = tmp_path / "tools.jinja"
    path.write_text(HERMES_TEMPLATE)
    cfg = ServerConfig(model=str(model_dir), chat_template=str(path), tool_call_parser="qwen3_coder")
    assert facts_of(cfg).tool_call_format == "qwen3_coder"
    assert facts_of(ServerConfig(model=str(model_dir), tool_call_parser="mistral")).tool_call_format == "mistral"


def test_a_reasoning_parser_gets_think_end_as_the_tokenizers_ids(model_dir):
    from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

    assert facts_of(ServerConfig(model=str(model_dir))).think_end_ids == ()  # no parser: none asked for
    ids = facts_of(ServerConfig(model=str(model_dir), reasoning_parser="qwen3")).think_end_ids
    tokenizer = TextTokenizer.from_model_dir(model_dir)
    assert ids and tokenizer.decode(ids) == "</think>" and list(ids) == tokenizer.encode("</think>", False)


def test_children_read_the_facts_from_their_command_line():
    facts = ModelFacts(context_len=300, chat_template="{{ x }}\n<|python_tag|>", chat_template_origin="t.jinja",
                       tool_call_format="llama3_json", think_end_ids=(5, 6))
    base = ["--config", ServerConfig(model="m", http_port=8000).to_json(), "--addresses", Addresses.in_dir("/tmp/x", "tcp://h:1").to_json()]
    _, _, extra = child_args([*base, "--model-facts", facts.to_json()])
    assert extra.model_facts == facts
    _, _, http_facts, port = http_args([*base, "--model-facts", facts.to_json(), "--client-port", "5"])
    assert http_facts == facts and port == 5
    with pytest.raises(SystemExit):  # a child started without them refuses to start
        child_args(base)


def test_facts_refuse_what_no_child_could_use():
    with pytest.raises(ValueError, match="tool_call_format"):
        ModelFacts(context_len=300, tool_call_format="xml")
    with pytest.raises(ValueError, match="context_len"):
        ModelFacts(context_len=1)
