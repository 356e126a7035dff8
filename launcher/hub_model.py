"""`--model org/name`: a Hugging Face hub id, resolved once by the launcher (config_resolver.resolve_model) into a
local path in the hub cache (launcher/hub_cache.py); every process after it sees only that path.

    --model org/name                      snapshot_download(allow_patterns=SERVER_FILES)
                                            -> <cache>/models--org--name/snapshots/<commit>/
    --model org/repo:Q4_K_M               the repo's one .gguf whose name holds the tag Q4_K_M (any case, as a
                                          word: not Q4_K_M inside IQ4_K_MX) -> hf_hub_download -> that file
    --model org/repo --gguf-file NAME     that file of the repo
    --model org/repo  (GGUF files only)   its .gguf when it has one; several: refused, naming them

A local path that exists always wins: `resolve_hub_model` returns None for it, and for anything that is not spelled
like a hub id. With --revision a branch, tag or commit hash is served. huggingface_hub downloads (its progress bars
on stderr); offline ($HF_HUB_OFFLINE=1) every call says local_files_only, so no call reaches the network, and a
model the cache lacks is refused in one line naming the id (ValueError, as every launcher refusal: exit code 2).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from zserve.launcher.hub_cache import HubCache

logger = logging.getLogger("launcher")

# repo names as the hub allows them: letters, digits, - _ . (one org/ part); `:TAG` is llama.cpp's quant pick
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?::(?P<quant>[A-Za-z0-9][\w.-]*))?")
# what a server reads from a repo: configs, tokenizer files, chat templates, safetensors and their index; not *.bin,
# *.pth, *.gguf, optimizer states or ONNX exports
SERVER_FILES = ("*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt", "*.jinja")
# a second copy of the weights in Mistral's or Meta's own format, beside the Hugging Face one
SKIPPED_FILES = ("consolidated*.safetensors", "original/*")
MAIN = "main"


@dataclass(frozen=True)
class HubModelId:
    repo_id: str  # org/name
    quant: str = ""  # org/repo:QUANT's tag, "" without one

    @staticmethod
    def parse(model: str) -> HubModelId | None:
        """The hub id `model` spells; None for a path that exists (it wins) or anything not spelled org/name."""
        if Path(model).exists():
            return None
        match = HUB_ID.fullmatch(model)
        if match is None:
            return None
        return HubModelId(match["repo"], match["quant"] or "")


def resolve_hub_model(model: str, gguf_file: str, revision: str, cache: HubCache) -> Path | None:
    """The local path that a hub id `model` names (a snapshot directory, or a .gguf file in one), fetched first when
    missing and allowed; None when `model` is not a hub id. ValueError naming the id when it cannot be had."""
    hub_id = HubModelId.parse(model)
    if hub_id is None:
        return None
    from huggingface_hub import errors

    revision = revision or MAIN
    where = f"--model {model}" + (f" (--revision {revision})" if revision != MAIN else "")
    try:
        if hub_id.quant or gguf_file:
            name = gguf_file or pick_quant(hub_id, gguf_names(hub_id.repo_id, revision, cache))
            return fetch_file(hub_id.repo_id, name, revision, cache)
        snapshot = fetch_snapshot(hub_id.repo_id, revision, cache)
        if (snapshot / "config.json").is_file():
            return snapshot
        name = only_gguf(hub_id, gguf_names(hub_id.repo_id, revision, cache))
        return fetch_file(hub_id.repo_id, name, revision, cache)
    except errors.GatedRepoError:
        raise ValueError(f"{where}: a gated model; accept its terms on the hub and set HF_TOKEN") from None
    except errors.RepositoryNotFoundError:
        raise ValueError(
            f"{where}: not a local path, and no such model on the Hugging Face hub (a private one needs HF_TOKEN)"
        ) from None
    except errors.RevisionNotFoundError:
        raise ValueError(f"--revision {revision}: not a branch, tag or commit of {hub_id.repo_id}") from None
    except errors.LocalEntryNotFoundError as exc:
        raise ValueError(f"{where}: {not_cached_reason(cache, hub_id.repo_id, revision, exc)}") from None
    except (errors.HfHubHTTPError, errors.EntryNotFoundError) as exc:
        raise ValueError(f"{where}: {first_line(exc)}") from None
    except ValueError as exc:  # ours (which GGUF file), or huggingface_hub's on a malformed id
        raise ValueError(f"{where}: {exc}") from None


def fetch_snapshot(repo_id: str, revision: str, cache: HubCache) -> Path:
    from huggingface_hub import snapshot_download

    if not cache.offline:
        logger.info("fetching %s (%s) into %s: configs, tokenizer and safetensors", repo_id, revision, cache.cache_dir)
    folder = snapshot_download(
        repo_id, revision=revision, cache_dir=cache.cache_dir, allow_patterns=list(SERVER_FILES),
        ignore_patterns=list(SKIPPED_FILES), local_files_only=cache.offline,
    )
    logger.info("--model %s: %s", repo_id, folder)
    return Path(folder)


def fetch_file(repo_id: str, filename: str, revision: str, cache: HubCache) -> Path:
    from huggingface_hub import hf_hub_download

    if not cache.offline:
        logger.info("fetching %s of %s (%s) into %s", filename, repo_id, revision, cache.cache_dir)
    path = Path(hf_hub_download(
        repo_id, filename, revision=revision, cache_dir=cache.cache_dir, local_files_only=cache.offline,
    ))
    logger.info("--model %s: %s", repo_id, path)
    return path


def gguf_names(repo_id: str, revision: str, cache: HubCache) -> list[str]:
    """The repo's .gguf files (a projector for images, mmproj*, left out): listed by the hub, or, offline or when
    the hub cannot be reached, those the cached snapshot holds."""
    if cache.offline:
        files = cache.cached_files(repo_id, revision)
        if files is None:
            raise ValueError(f"not a local path, and not in the hub cache {cache.cache_dir} (HF_HUB_OFFLINE=1)")
    else:
        files = listed_files(repo_id, revision, cache)
    return [f for f in files if f.endswith(".gguf") and not Path(f).name.lower().startswith("mmproj")]


def listed_files(repo_id: str, revision: str, cache: HubCache) -> list[str]:
    from huggingface_hub import HfApi, errors

    try:
        return HfApi().list_repo_files(repo_id, revision=revision)
    except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError):
        raise
    except Exception as exc:  # the HTTP client's own errors (no network, a timeout): the cache may still hold it
        cached = cache.cached_files(repo_id, revision)
        if cached is None:
            raise ValueError(
                f"the hub could not be reached ({first_line(exc)}) and the hub cache {cache.cache_dir} has no "
                f"snapshot of {repo_id}"
            ) from None
        logger.warning("the hub could not be reached (%s): the files of %s in the cache", first_line(exc), repo_id)
        return cached


def pick_quant(hub_id: HubModelId, names: list[str]) -> str:
    """The one name holding the quant tag as a word (any case); ValueError listing the names otherwise."""
    tag = re.compile(rf"(?<![A-Za-z0-9]){re.escape(hub_id.quant)}(?![A-Za-z0-9_])", re.IGNORECASE)
    found = [name for name in names if tag.search(Path(name).name)]
    if len(found) == 1:
        return found[0]
    if found:
        raise ValueError(
            f"{len(found)} .gguf files match {hub_id.quant} ({', '.join(found)}): name one with --gguf-file"
        )
    has = f"its .gguf files: {', '.join(names)}" if names else "it has no .gguf file"
    raise ValueError(f"no .gguf file of the repo matches {hub_id.quant} ({has})")


def only_gguf(hub_id: HubModelId, names: list[str]) -> str:
    """A repo without config.json: its one .gguf file; ValueError otherwise (listing them)."""
    if len(names) == 1:
        return names[0]
    if not names:
        raise ValueError("the repo has no config.json and no .gguf file")
    raise ValueError(
        f"a GGUF repo of {len(names)} files ({', '.join(names)}): pick one, {hub_id.repo_id}:QUANT "
        "(e.g. :Q4_K_M) or --gguf-file NAME"
    )


def not_cached_reason(cache: HubCache, repo_id: str, revision: str, exc: Exception) -> str:
    if cache.snapshot_dir(repo_id, revision) is not None:  # there, but without a file it needs
        return first_line(exc)
    if cache.offline:
        return f"not a local path, and not in the hub cache {cache.cache_dir} (HF_HUB_OFFLINE=1)"
    return f"the hub could not be reached, and the hub cache {cache.cache_dir} does not hold it ({first_line(exc)})"


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
