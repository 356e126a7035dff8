"""`--model X.gguf`: a small model directory made once from a GGUF file's metadata.

    X.gguf (or a directory holding one .gguf and no safetensors)
      -> <cache root>/gguf/<name>-<key of path, size, mtime>/   (common/cache_root.py)
           config.json, generation_config.json       from the GGUF metadata, as the architecture's
                                                     spec says (common/architectures/: GgufSpec)
           tokenizer.json, tokenizer_config.json     from the GGUF vocabulary (transformers)
           gguf_source.json                          the .gguf's path; the model worker reads
                                                     its tensors from there (model_proc/checkpoints/gguf_checkpoint.py)

The directory is built under a temporary name and renamed in one step (launcher/model_cache.py),
so one that exists is complete; a changed file (size or mtime) gets a new key. --tokenizer, when given, supplies the
tokenizer instead and none is built. Only the launcher imports transformers here, once per file.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from zserve.common.architectures import GGUF_ARCHITECTURES, spec_for_gguf
from zserve.common.architectures.arch_spec import GgufSpec
from zserve.common.architectures.gguf_metadata import GgufMetadata
from zserve.common.cache_root import cache_root
from zserve.common.gguf_file_check import check_gguf_file
from zserve.common.gguf_source import GGUF_SOURCE_FILE, write_gguf_source
from zserve.launcher.model_cache import build_dir, ensure_chat_template, split_digits

logger = logging.getLogger("launcher")

def gguf_file_of(model: str, gguf_file: str = "") -> Path | None:
    """The GGUF file `--model` names: the file itself, a directory's file `gguf_file` (--gguf-file), or a
    directory's only .gguf when it has no safetensors; None for anything else (a safetensors directory)."""
    path = Path(model)
    if gguf_file:
        if not (path / gguf_file).is_file():
            raise ValueError(f"--gguf-file {gguf_file}: no such file in {path}")
        return (path / gguf_file).resolve()
    if path.is_file() and path.suffix == ".gguf":
        return path.resolve()
    if not path.is_dir() or any(path.glob("*.safetensors")) or (path / GGUF_SOURCE_FILE).is_file():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ValueError(
            f"{path} holds {len(found)} .gguf files ({', '.join(p.name for p in found)}): name one (--gguf-file)"
        )
    return found[0].resolve() if found else None


def gguf_model_dir(gguf_file: Path, with_tokenizer: bool) -> Path:
    """The directory for `gguf_file`, built first if absent."""
    stat = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file}\0{stat.st_size}\0{stat.st_mtime_ns}\0{with_tokenizer}".encode()).hexdigest()[:16]
    target = cache_root() / "gguf" / f"{gguf_file.stem}-{key}"
    if _is_complete(target):
        return target
    logger.info("reading the metadata of %s into %s (once)", gguf_file, target)
    return build_dir(target, lambda staging: _build(gguf_file, staging, with_tokenizer), _is_complete, logger.info)


def _is_complete(model_dir: Path) -> bool:
    return (model_dir / GGUF_SOURCE_FILE).is_file()  # written last


def _build(gguf_file: Path, out_dir: Path, with_tokenizer: bool) -> None:
    check_gguf_file(gguf_file)  # a truncated or lying header: one line naming the file and the tensor
    _write_config(gguf_file, out_dir)
    if with_tokenizer:
        _write_tokenizer(gguf_file, out_dir)
    write_gguf_source(out_dir, gguf_file)


def _write_config(gguf_file: Path, out_dir: Path) -> None:
    meta = _read_metadata(gguf_file)
    spec = spec_for_gguf(meta.architecture)
    if spec is None or spec.gguf is None:
        raise ValueError(
            f"{gguf_file.name}: GGUF architecture {meta.architecture!r} is not supported; "
            f"supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    if spec.gguf.config is not None:  # e.g. Gemma: transformers' GGUF config drops softcaps, windows, local RoPE
        config = spec.gguf.config(meta)
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    else:
        _write_transformers_config(gguf_file, meta, spec.hf_architectures[0], spec.gguf, out_dir)
    generation = {k: int(meta.fields[f"tokenizer.ggml.{k}"]) for k in ("bos_token_id", "eos_token_id")
                  if f"tokenizer.ggml.{k}" in meta.fields}
    if generation:
        (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")


def _read_metadata(gguf_file: Path) -> GgufMetadata:
    """The file's metadata, tensor shapes and rope factor tensors, read once."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_file))
    fields = {}
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer.ggml.") or name.endswith("_token_id"):  # skip the vocabulary
            fields[name] = field.contents()
    return GgufMetadata(
        architecture=str(fields["general.architecture"]),
        fields=fields,
        tensor_shapes={t.name: tuple(int(d) for d in t.shape) for t in reader.tensors},
        rope_factors={t.name: [float(x) for x in t.data] for t in reader.tensors if t.name.startswith("rope_factors_")},
        where=gguf_file.name,
    )


def _write_transformers_config(gguf_file: Path, meta: GgufMetadata, hf_architecture: str, spec: GgufSpec,
                               out_dir: Path) -> None:
    """transformers' GGUF config reader, then what it leaves out or gets wrong, then the spec's `patch`."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    config.architectures = [hf_architecture]
    if meta.get("attention.key_length") is not None:  # transformers leaves Qwen3's head_dim at its default (128)
        config.head_dim = int(meta.get("attention.key_length"))
    # transformers' GGUF config reader leaves the tie to the default; the file says: no output.weight, tied
    config.tie_word_embeddings = not meta.has_output
    if spec.patch is not None:
        for key, value in spec.patch(meta, config.to_dict()).items():
            setattr(config, key, value)
    config.to_json_file(str(out_dir / "config.json"))
    if meta.int_field("expert_count"):
        if spec.moe_keys is None:
            raise ValueError(f"{gguf_file.name}: GGUF architecture {meta.architecture!r} with experts is not supported")
        raw = {**json.loads((out_dir / "config.json").read_text(encoding="utf-8")), **spec.moe_keys(meta)}
        (out_dir / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_tokenizer(gguf_file: Path, out_dir: Path) -> None:
    import gguf
    from transformers import AutoTokenizer

    fields = gguf.GGUFReader(str(gguf_file)).fields
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    if "tokenizer.ggml.pre" in fields and str(fields["tokenizer.ggml.pre"].contents()) == "smollm":
        split_digits(tokenizer)
    tokenizer.save_pretrained(str(out_dir))
    if "tokenizer.chat_template" in fields:
        ensure_chat_template(out_dir, str(fields["tokenizer.chat_template"].contents()))
