"""The model cache: the directories the launcher makes once (the demo model, a GGUF file's metadata),
under the cache root of common/cache_root.py, and how each is made.

    build_dir(target, build, is_complete)
        <root>/.NAME.partial-XXXX   <- build(staging) writes every file
        <root>/.NAME.partial-XXXX   --- os.rename --->   <root>/NAME

A directory is built under a temporary name next to its final place and renamed in one step, so an
interrupted run never leaves a half directory where the target is: one that is there is complete,
and a second run does nothing. Two runs at once both build; the first rename wins and the other
keeps it. A killed run's partial directory is deleted by a later run once it is an hour old.

Also here: what transformers' GGUF tokenizer reader leaves out, put back (`split_digits`,
`ensure_chat_template`), for every tokenizer the launcher writes from a GGUF file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

STALE_PARTIAL_S = 3600  # a partial directory untouched this long was left by a killed run


def partial_prefix(name: str) -> str:
    return f".{name}.partial-"


def build_dir(target: Path, build: Callable[[Path], None], is_complete: Callable[[Path], bool],
              say: Callable[[str], None]) -> Path:
    """`target`, made by `build(staging)` in a fresh staging directory and renamed into place
    (`build` raises when it cannot make a complete directory)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(target.parent, target.name)
    staging = Path(tempfile.mkdtemp(prefix=partial_prefix(target.name), dir=target.parent))
    try:
        build(staging)
        make_readable(staging)
        install(staging, target, is_complete, say)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def remove_stale_partials(parent: Path, name: str) -> None:
    """Delete `name`'s partial directories left by runs that were killed (a live run's is recent)."""
    now = time.time()
    for path in parent.glob(f"{partial_prefix(name)}*"):
        if now - path.stat().st_mtime > STALE_PARTIAL_S:
            shutil.rmtree(path, ignore_errors=True)


def make_readable(model_dir: Path) -> None:
    """mkdtemp makes the directory (and safetensors some files) private to us; a shared cache
    should read like any directory made under the user's umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(model_dir, 0o777 & ~umask)
    for path in model_dir.iterdir():
        os.chmod(path, 0o666 & ~umask)


def install(staging: Path, target: Path, is_complete: Callable[[Path], bool], say: Callable[[str], None]) -> None:
    """Move the finished `staging` directory to `target` in one rename."""
    if target.exists() and is_complete(target):
        say(f"another run installed {target} meanwhile; keeping it")
        return
    if target.exists():
        # An incomplete directory we did not make (we only ever rename complete ones into
        # place): move it aside, then replace it.
        say(f"replacing incomplete directory {target}")
        stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=target.parent))
        os.rename(target, stale / "old")
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(staging, target)
    except OSError:
        if not is_complete(target):
            raise
        say(f"another run installed {target} first; keeping it")


def split_digits(tokenizer) -> None:
    """Split every digit into its own pre-token, as a GGUF's "smollm" pre-tokenizer says.

    llama.cpp's "smollm" pre-tokenizer splits `\\p{N}` before the byte-level regex, but
    transformers' GGUF converter keeps only the byte-level step. SmolLM2's merges hold no digits,
    so ASCII numbers come out the same either way; this keeps the rest (other numeric
    characters) faithful too.
    """
    from tokenizers import pre_tokenizers

    backend = tokenizer.backend_tokenizer
    if isinstance(backend.pre_tokenizer, pre_tokenizers.ByteLevel):
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer]
        )


def ensure_chat_template(model_dir: Path, chat_template: str) -> None:
    """Make tokenizer_config.json carry the chat template.

    transformers may save the template as a separate chat_template.jinja file; tools that read
    tokenizer_config.json directly (and older transformers) look for it there, so put it in both
    places, the same text.
    """
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("chat_template") != chat_template:
        config["chat_template"] = chat_template
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    jinja_path = model_dir / "chat_template.jinja"
    if jinja_path.exists() and jinja_path.read_text(encoding="utf-8") != chat_template:
        jinja_path.write_text(chat_template, encoding="utf-8")
