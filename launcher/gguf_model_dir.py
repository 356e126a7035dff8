"""`--model X.gguf`: a small model directory made once from a GGUF file's metadata.

    X.gguf (or a directory holding one .gguf and no safetensors)
      -> $ZSERVE_CACHE_DIR/gguf/<name>-<key of path, size, mtime>/
           config.json, generation_config.json       from the GGUF metadata (transformers)
           tokenizer.json, tokenizer_config.json     from the GGUF vocabulary (transformers)
           gguf_source.json                          the .gguf's path; the model worker reads
                                                     its tensors from there (model_proc/gguf_checkpoint.py)

The directory is built under a temporary name and renamed in one step, so one that exists is
complete; a changed file (size or mtime) gets a new key. --tokenizer, when given, supplies the
tokenizer instead and none is built. Only the launcher imports transformers here, once per file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from zserve.common.gguf_source import GGUF_SOURCE_FILE, write_gguf_source
from zserve.launcher.demo_model import CACHE_DIR_ENV

logger = logging.getLogger("launcher")

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def gguf_file_of(model: str) -> Path | None:
    """The GGUF file `--model` names: the file itself, or a directory's only .gguf when it has
    no safetensors; None for anything else (a safetensors directory)."""
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        return path.resolve()
    if not path.is_dir() or any(path.glob("*.safetensors")) or (path / GGUF_SOURCE_FILE).is_file():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ValueError(f"{path} holds {len(found)} .gguf files ({', '.join(p.name for p in found)}): name one")
    return found[0].resolve() if found else None


def gguf_model_dir(gguf_file: Path, with_tokenizer: bool) -> Path:
    """The directory for `gguf_file`, built first if absent."""
    stat = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file}\0{stat.st_size}\0{stat.st_mtime_ns}\0{with_tokenizer}".encode()).hexdigest()[:16]
    cache_root = Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "zserve").expanduser()
    target = cache_root / "gguf" / f"{gguf_file.stem}-{key}"
    if (target / GGUF_SOURCE_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        logger.info("reading the metadata of %s into %s (once)", gguf_file, target)
        _write_config(gguf_file, staging)
        if with_tokenizer:
            _write_tokenizer(gguf_file, staging)
        write_gguf_source(staging, gguf_file)
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / GGUF_SOURCE_FILE).is_file():
                raise  # not another run's finished copy
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_config(gguf_file: Path, out_dir: Path) -> None:
    import gguf
    from transformers import AutoConfig

    fields = gguf.GGUFReader(str(gguf_file)).fields
    arch = str(fields["general.architecture"].contents())
    if arch not in ARCHITECTURES:
        raise ValueError(f"{gguf_file.name}: GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
    config = AutoConfig.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    config.architectures = [ARCHITECTURES[arch]]
    if f"{arch}.attention.key_length" in fields:  # transformers leaves Qwen3's head_dim at its default (128)
        config.head_dim = int(fields[f"{arch}.attention.key_length"].contents())
    # transformers' GGUF config reader leaves the tie to the default; the file says: no output.weight, tied
    has_output = any(t.name == "output.weight" for t in gguf.GGUFReader(str(gguf_file)).tensors)
    config.tie_word_embeddings = not has_output
    config.to_json_file(str(out_dir / "config.json"))
    generation = {k: int(fields[f"tokenizer.ggml.{k}"].contents()) for k in ("bos_token_id", "eos_token_id")
                  if f"tokenizer.ggml.{k}" in fields}
    if generation:
        (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")


def _write_tokenizer(gguf_file: Path, out_dir: Path) -> None:
    import gguf
    from transformers import AutoTokenizer

    from zserve.launcher.demo_model import ensure_chat_template, split_digits

    fields = gguf.GGUFReader(str(gguf_file)).fields
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    if "tokenizer.ggml.pre" in fields and str(fields["tokenizer.ggml.pre"].contents()) == "smollm":
        split_digits(tokenizer)
    tokenizer.save_pretrained(str(out_dir))
    if "tokenizer.chat_template" in fields:
        ensure_chat_template(out_dir, str(fields["tokenizer.chat_template"].contents()))
