"""A Hugging Face hub cache written by a test, laid out as huggingface_hub lays out what it downloads, so the
launcher's hub ids (launcher/hub_model.py) are tested with HF_HUB_OFFLINE=1 and no network:

    <cache>/models--org--name/
        blobs/<sha256 for LFS files (safetensors, gguf, bin), git blob sha1 for the rest>
        refs/main                           the commit hash, no newline
        snapshots/<commit>/<file>           a relative symlink: ../../blobs/<hash>
        trees/<commit>.json                 the repo's listing at that commit (huggingface_hub 1.x+ reads it to
                                            tell a complete snapshot from a partial one)

`listed_only`: files the repo has (in the listing) that were never fetched, as a server fetches only some.

    snapshot = write_hub_snapshot(tmp_path / "hub", "org/tiny", files_of(model_dir), listed_only={"pytorch_model.bin": 9})
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pth")


def commit_of(repo_id: str, tag: str = "main") -> str:
    return hashlib.sha1(f"{repo_id}@{tag}".encode()).hexdigest()


def files_of(directory: Path) -> dict[str, Path]:
    """Every file under `directory`, by its path relative to it."""
    return {str(p.relative_to(directory)): p for p in sorted(directory.rglob("*")) if p.is_file()}


def write_hub_snapshot(
    cache_dir: Path, repo_id: str, files: Mapping[str, Path], *, commit: str = "", refs: Iterable[str] = ("main",),
    listed_only: Mapping[str, int] | None = None,
) -> Path:
    """The snapshot directory of `repo_id` at `commit` (default: commit_of(repo_id)) holding `files` (name -> the
    file to copy), each ref in `refs` pointing at it."""
    commit = commit or commit_of(repo_id)
    repo_dir = cache_dir / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    listing: dict[str, dict] = {}
    for name, source in files.items():
        data = source.read_bytes()
        git_sha1 = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        entry: dict = {"size": len(data), "blob_id": git_sha1}
        blob_name = git_sha1
        if name.endswith(LFS_SUFFIXES):
            blob_name = hashlib.sha256(data).hexdigest()
            entry.update(lfs_sha256=blob_name, lfs_size=len(data))
        listing[name] = entry
        blob = repo_dir / "blobs" / blob_name
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for name, size in (listed_only or {}).items():
        listing[name] = {"size": size, "blob_id": hashlib.sha1(name.encode()).hexdigest()}
    for ref in refs:
        (repo_dir / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / ref).write_text(commit, encoding="utf-8")
    (repo_dir / "trees").mkdir(parents=True, exist_ok=True)
    (repo_dir / "trees" / f"{commit}.json").write_text(
        json.dumps({"format_version": 1, "files": dict(sorted(listing.items()))}, indent=1), encoding="utf-8",
    )
    return snapshot
