"""SGLang's and vLLM's spellings of our flags parse to the same config as ours; renamed flags keep
their old spelling with a warning; bad values are refused in one line with exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testing.paths import REPO_ROOT
from zserve.launcher.cli import parse_config

ALIASES = [
    (["--model-path", "/m"], ["--model", "/m"]),
    (["/m"], ["--model", "/m"]),  # a positional model, as in `vllm serve MODEL`
    (["--tensor-parallel-size", "2"], ["--tp-size", "2"]),
    (["--tp", "2"], ["--tp-size", "2"]),
    (["--max-model-len", "1024"], ["--context-length", "1024"]),
    (["--mem-fraction-static", "0.5"], ["--kv-memory-fraction", "0.5"]),
    (["--max-num-batched-tokens", "256"], ["--chunked-prefill-size", "256"]),
    (["--dtype", "half"], ["--dtype", "float16"]),
    (["--dtype", "float"], ["--dtype", "float32"]),
    (["--guided-decoding-backend", "none"], ["--grammar-backend", "none"]),
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
    assert (cfg.port, cfg.http_port) == (30000, 8000)
    assert parse_config(["--http-port", "0"]).http_port == 0  # HTTP off


def test_the_readme_flag_table_is_the_generated_one():
    from zserve.launcher.flags_table import flags_table

    assert flags_table() in (REPO_ROOT / "README.md").read_text(), "regenerate it: .venv/bin/python -m zserve.launcher.flags_table"
