"""The README's first command on the real demo model: the server answers the France question."""

from __future__ import annotations

import os
import subprocess

import pytest

from launcher.demo_model import demo_model_dir, missing_files
from testing.paths import REPO_ROOT

REPO = REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.mark.skipif(bool(missing_files(demo_model_dir())), reason="demo model not fetched (scripts/test.sh fetches it)")
def test_readme_demo_command_answers_paris():
    env = dict(os.environ, ZSERVE_DEMO_ONESHOT="1")
    proc = subprocess.run(
        ["bash", "scripts/demo.sh", "--kv-cache-tokens", "8192"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "zserve ready" in out
    answer = next(line for line in out.splitlines() if line.startswith("A: "))
    assert "Paris" in answer, out
    assert "finish=stop" in out  # it ended on EOS, not the token limit
