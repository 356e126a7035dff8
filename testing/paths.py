"""Where the repository is, for tests that run scripts or start processes from its root."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
