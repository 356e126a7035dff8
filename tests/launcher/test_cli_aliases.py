"""SGLang's and vLLM's spellings of our flags parse to the same config as ours; renamed flags keep
their old spelling with a warning; bad values are refused in one line with exit code 2."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest

from testing.paths import REPO_ROOT
from zserve.common.server_config import ServerConfig
from zserve.common.server_flags import FLAG_SPECS, flag_of
from zserve.launcher.cli import parse_config

ALIASES = [
    (["--model-path", "/m"], ["--model", "/m"]),
    (["/m"], ["--model", "/m"]),  # a positional model, as in `vllm serve MODEL`
    (["--tensor-parallel-size", "2"], ["--tp-size", "2"]),
    (["--tp", "2"], ["--tp-size", "2"]),
    (["--max-model-len", "1024"], ["--context-length", "1024"]),
    (["--random-seed", "7"], ["--seed", "7"]),  # SGLang's name
    (["--gpu-memory-utilization", "0.5"], ["--mem-fraction-static", "0.5"]),
    (["--http-port", "8123"], ["--port", "8123"]),
    (["--tokenizer-path", "/t"], ["--tokenizer", "/t"]),
    (["--enable-prefix-caching"], []),
    (["--no-enable-prefix-caching"], ["--disable-radix-cache"]),
    (["--disable-log-stats"], ["--log-stats-interval-s", "0"]),
    (["--block-size", "32"], ["--page-size", "32"]),
    (["--max-num-seqs", "7"], ["--max-running-requests", "7"]),
    (["--max-total-tokens", "4096"], ["--kv-cache-tokens", "4096"]),
    (["--max-num-batched-tokens", "256"], ["--chunked-prefill-size", "256"]),
    (["--dtype", "half"], ["--dtype", "float16"]),
    (["--dtype", "float"], ["--dtype", "float32"]),
    (["--guided-decoding-backend", "none"], ["--grammar-backend", "none"]),
    (["--tool-call-parser", "qwen25"], ["--tool-call-parser", "hermes"]),  # SGLang's names for vLLM's formats
    (["--tool-call-parser", "llama3"], ["--tool-call-parser", "llama3_json"]),
]
DEPRECATED = [
    (["--max-prefill-tokens", "256"], ["--chunked-prefill-size", "256"], "--max-prefill-tokens is deprecated, use --chunked-prefill-size"),
    (["--schedule-policy", "decode-first"], ["--step-policy", "decode-first"], "--schedule-policy is deprecated, use --step-policy"),
]
REFUSED = [
    (["--dtype", "foo"], "argument --dtype: invalid choice: 'foo'"),
    (["--tp", "0"], "argument --tp: must be >= 1, got 0"),
    (["--max-model-len", "-5"], "must be >= 0, got -5"),
    (["--schedule-policy", "fcfs"], "argument --schedule-policy (now --step-policy): invalid choice 'fcfs'"),
    (["--chunked-prefill-size", "0"], "must be >= 1, got 0"),
    (["/a", "--model", "/b"], "the model is given twice"),
    (["--served-model-name"], "expected one argument"),
    (["--grammar-backend", "outlines"], "argument --grammar-backend: invalid choice: 'outlines'"),
    (["--tool-call-parser", "xml"],
     "invalid choice: 'xml' (choose from 'auto', 'hermes', 'llama3_json', 'mistral', 'pythonic', 'qwen3_coder'"),
]


@pytest.mark.parametrize(("alias", "native"), ALIASES, ids=[" ".join(a) for a, _ in ALIASES])
def test_alias_parses_to_the_same_config(alias, native):
    assert parse_config(alias) == parse_config(native)


@pytest.mark.parametrize(("old", "new", "warning"), DEPRECATED, ids=[o[0] for o, _, _ in DEPRECATED])
def test_renamed_flag_keeps_its_old_spelling_with_a_warning(old, new, warning, capsys):
    assert parse_config(old) == parse_config(new)
    assert warning in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "needle"), REFUSED, ids=[" ".join(f) for f, _ in REFUSED])
def test_bad_value_is_refused_in_one_line_with_exit_2(flags, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "zserve.launcher", *flags], capture_output=True, text=True, timeout=30, cwd=REPO_ROOT,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "warning:" not in line]
    assert len(lines) == 1 and lines[0].startswith("launch_server: error: ") and needle in lines[0], proc.stderr
    assert "ready" not in proc.stdout


def test_defaults_are_fixed_documented_ports():
    cfg = parse_config([])
    assert (cfg.http_port, cfg.zmq_port) == (8000, 30001)
    assert parse_config(["--port", "0"]).http_port == 0  # HTTP off


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--model-path", "/m", "--port", "30000"], "http_port", 30000),  # SGLang's habit: HTTP on 30000
        (["/m", "--port", "8001"], "http_port", 8001),  # vLLM's habit
        (["--zmq-port", "5557"], "zmq_port", 5557),
        (["--trust-remote-code"], "trust_remote_code", True),
        (["--enable-auto-tool-choice", "--tool-call-parser", "pythonic"], "tool_call_parser", "pythonic"),
        (["--tokenizer", "/tok"], "tokenizer_dir", "/tok"),
        (["--model", "/m"], "tokenizer_dir", "/m"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_peer_command_lines_set_what_they_mean(argv, field, value):
    assert getattr(parse_config(argv), field) == value


def sample_value(f) -> tuple[str | None, object]:
    """A command-line value for field `f` other than its default, and the value it should set."""
    spec = FLAG_SPECS[f.name]
    if f.type in ("bool", bool):
        return None, not f.default
    if spec.choices:
        text = next(c for c in spec.choices if c != f.default)
        return text, parse_config([flag_of(f.name), text]).__getattribute__(f.name)
    if f.type in ("str", str):
        return "/some/path", "/some/path"
    low = next((bound for bound in (spec.min, spec.above) if bound is not None), 0)
    if f.type in ("float", float):
        below = 2 if spec.below is None else spec.below
        value = 0.5 if below > 0.5 and low < 0.5 and f.default != 0.5 else low + 1.5
        return repr(value), value
    value = max(int(low) + 3, 3)
    return str(value), value


ALL_SPELLINGS = [
    (f.name, spelling)
    for f in fields(ServerConfig)
    for spelling in (*FLAG_SPECS[f.name].aliases, flag_of(f.name))
]


@pytest.mark.parametrize(("name", "spelling"), ALL_SPELLINGS, ids=[s for _, s in ALL_SPELLINGS])
def test_every_spelling_in_the_flag_table_sets_its_field(name, spelling):
    """Each flag and alias the README's table lists sets the value it is given (not only parses)."""
    f = next(f for f in fields(ServerConfig) if f.name == name)
    text, value = sample_value(f)
    cfg = parse_config([spelling] if text is None else [spelling, text])
    assert getattr(cfg, name) == value and value != f.default


SWITCHES = [(name, switch, value) for name, spec in FLAG_SPECS.items() for switch, value in spec.switches.items()]


@pytest.mark.parametrize(("name", "switch", "value"), SWITCHES, ids=[s for _, s, _ in SWITCHES])
def test_every_switch_sets_its_value(name, switch, value):
    first = FLAG_SPECS[name].choices[0] if FLAG_SPECS[name].choices else "3"  # a value the switch then overrides
    start = [] if isinstance(value, bool) else [flag_of(name), first]
    assert getattr(parse_config([*start, switch]), name) == value


def test_the_readme_flag_table_is_the_generated_one():
    from zserve.launcher.flags_table import flags_table

    assert flags_table() in (REPO_ROOT / "README.md").read_text(), "regenerate it: .venv/bin/python -m zserve.launcher.flags_table"
