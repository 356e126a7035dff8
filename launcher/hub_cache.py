"""The Hugging Face hub cache as huggingface_hub lays it out, and whether the hub may be reached.

    <cache dir>/models--<org>--<name>/
        blobs/<hash>                      each file's bytes, once
        refs/<branch or tag>              the commit hash it points at
        snapshots/<commit>/<file>         a symlink into blobs/, per file fetched at that commit

The cache directory is --download-dir, else $HF_HUB_CACHE ($HUGGINGFACE_HUB_CACHE, its old name), else
$HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; offline is $HF_HUB_OFFLINE (or
$TRANSFORMERS_OFFLINE) set to 1 / on / yes / true: huggingface_hub's own rules. They are read here on every call,
from the environment given, rather than from huggingface_hub.constants, which froze them when it was first imported
(a test, or an Engine in a process that imported transformers earlier, sets them later).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HF_HUB_OFFLINE_ENV = "HF_HUB_OFFLINE"
COMMIT_HASH = re.compile(r"[0-9a-f]{40}")
TRUE_VALUES = ("1", "ON", "YES", "TRUE")  # huggingface_hub.constants.ENV_VARS_TRUE_VALUES


@dataclass(frozen=True)
class HubCache:
    cache_dir: Path
    offline: bool  # no network call at all: only what the cache holds

    @staticmethod
    def from_env(download_dir: str = "", environ: Mapping[str, str] = os.environ) -> HubCache:
        offline_value = environ.get(HF_HUB_OFFLINE_ENV) or environ.get("TRANSFORMERS_OFFLINE") or ""
        return HubCache(Path(download_dir or default_cache_dir(environ)).expanduser(),
                        offline_value.upper() in TRUE_VALUES)

    def repo_dir(self, repo_id: str) -> Path:
        return self.cache_dir / ("models--" + repo_id.replace("/", "--"))

    def snapshot_dir(self, repo_id: str, revision: str) -> Path | None:
        """The cached snapshot of `repo_id` at `revision` (a commit hash, or a branch or tag its refs/ file names);
        None when the cache has none."""
        repo_dir = self.repo_dir(repo_id)
        commit = revision if COMMIT_HASH.fullmatch(revision) else None
        ref = repo_dir / "refs" / revision
        if commit is None and ref.is_file():
            commit = ref.read_text(encoding="utf-8").strip()
        if commit is None or not (repo_dir / "snapshots" / commit).is_dir():
            return None
        return repo_dir / "snapshots" / commit

    def cached_files(self, repo_id: str, revision: str) -> list[str] | None:
        """The files of the cached snapshot (paths relative to it, sorted), None when there is none."""
        snapshot = self.snapshot_dir(repo_id, revision)
        if snapshot is None:
            return None
        return sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())


def default_cache_dir(environ: Mapping[str, str]) -> str:
    explicit = environ.get("HF_HUB_CACHE") or environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return os.path.expandvars(explicit)
    cache_home = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    home = environ.get("HF_HOME") or os.path.join(cache_home, "huggingface")
    return os.path.join(os.path.expandvars(home), "hub")
