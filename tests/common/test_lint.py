"""The project's lint rules (pyproject.toml [tool.ruff]) hold on the whole tree: among them the
120-character line length of product code, so a long line fails here and not only in an editor."""

from __future__ import annotations

import subprocess
import sys

from testing.paths import REPO_ROOT


def test_ruff_finds_nothing():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, f"ruff check found problems:\n{done.stdout}{done.stderr}"


def test_the_line_length_rule_covers_product_code(tmp_path):
    """The rule is on: a product file with a 121-character line fails (so the check above can fail)."""
    product = tmp_path / "common"
    product.mkdir()
    (product / "long_line.py").write_text("x = '" + "a" * 115 + "'\n")
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(REPO_ROOT / "pyproject.toml"), "."],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 1 and "E501" in done.stdout, done.stdout + done.stderr
