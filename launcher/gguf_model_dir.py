"""`--model X.gguf`: a small model directory made once from a GGUF file's metadata.

    X.gguf (or a directory holding one .gguf and no safetensors)
      -> <cache root>/gguf/<name>-<key of path, size, mtime>/   (common/cache_root.py)
           config.json, generation_config.json       from the GGUF metadata (transformers)
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

from zserve.common.cache_root import cache_root
from zserve.common.gguf_file_check import check_gguf_file
from zserve.common.gguf_gemma import GEMMA_GGUF_ARCHITECTURES, gemma_config
from zserve.common.gguf_source import GGUF_SOURCE_FILE, write_gguf_source
from zserve.launcher.model_cache import build_dir, ensure_chat_template, split_digits

logger = logging.getLogger("launcher")

ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
}


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
    import gguf

    fields = gguf.GGUFReader(str(gguf_file)).fields
    arch = str(fields["general.architecture"].contents())
    if arch in GEMMA_GGUF_ARCHITECTURES:  # transformers' GGUF config drops Gemma's softcaps, windows, local RoPE
        _write_gemma_config(gguf_file, arch, out_dir)
    elif arch not in ARCHITECTURES:
        raise ValueError(
            f"{gguf_file.name}: GGUF architecture {arch!r} is not supported; "
            f"supported: {', '.join([*ARCHITECTURES, *GEMMA_GGUF_ARCHITECTURES])}"
        )
    else:
        _write_transformers_config(gguf_file, arch, out_dir)
    generation = {k: int(fields[f"tokenizer.ggml.{k}"].contents()) for k in ("bos_token_id", "eos_token_id")
                  if f"tokenizer.ggml.{k}" in fields}
    if generation:
        (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")


def _write_gemma_config(gguf_file: Path, arch: str, out_dir: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(str(gguf_file))
    fields = {name: field.contents() for name, field in reader.fields.items() if name.startswith(f"{arch}.")}
    embedding = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embedding is None:
        raise ValueError(f"{gguf_file.name}: no token_embd.weight tensor")
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    config = gemma_config(arch, fields, has_output, int(embedding.shape[-1]), gguf_file.name)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _write_transformers_config(gguf_file: Path, arch: str, out_dir: Path) -> None:
    import gguf
    from transformers import AutoConfig

    fields = gguf.GGUFReader(str(gguf_file)).fields
    config = AutoConfig.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    config.architectures = [ARCHITECTURES[arch]]
    if f"{arch}.attention.key_length" in fields:  # transformers leaves Qwen3's head_dim at its default (128)
        config.head_dim = int(fields[f"{arch}.attention.key_length"].contents())
    # transformers' GGUF config reader leaves the tie to the default; the file says: no output.weight, tied
    has_output = any(t.name == "output.weight" for t in gguf.GGUFReader(str(gguf_file)).tensors)
    config.tie_word_embeddings = not has_output
    if arch == "phi3":
        _set_phi3_rope(gguf.GGUFReader(str(gguf_file)), config)
    config.to_json_file(str(out_dir / "config.json"))
    if _int_field(fields, f"{arch}.expert_count"):
        raw = {**json.loads((out_dir / "config.json").read_text(encoding="utf-8")), **_moe_keys(gguf_file, arch)}
        (out_dir / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _set_phi3_rope(reader, config) -> None:
    """What transformers' GGUF config reader leaves out for phi3: the partial rotary (from
    rope.dimension_count), the original context and the longrope factors (stored as tensors)."""
    fields = reader.fields
    head_dim = config.hidden_size // config.num_attention_heads
    if "phi3.rope.dimension_count" in fields:
        config.partial_rotary_factor = int(fields["phi3.rope.dimension_count"].contents()) / head_dim
    factors = {t.name: [float(x) for x in t.data] for t in reader.tensors if t.name.startswith("rope_factors_")}
    original = fields.get("phi3.rope.scaling.original_context_length")
    config.original_max_position_embeddings = int(original.contents()) if original else config.max_position_embeddings
    theta = config.rope_parameters.get("rope_theta", 10000.0) if config.rope_parameters else 10000.0
    rope = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": config.partial_rotary_factor}
    if factors:
        rope.update(rope_type="longrope", original_max_position_embeddings=config.original_max_position_embeddings,
                    long_factor=factors["rope_factors_long.weight"], short_factor=factors["rope_factors_short.weight"])
    config.rope_parameters = rope


def _int_field(fields, key: str) -> int:
    return int(fields[key].contents()) if key in fields else 0


def _moe_keys(gguf_file: Path, arch: str) -> dict:
    """config.json's MoE keys from the metadata: Qwen3-MoE (expert width `expert_feed_forward_length`;
    llama.cpp renormalises the top-k; layers without stacked experts are dense) or Mixtral (llama
    with experts: every layer sparse, the experts as wide as feed_forward_length, no sliding window, as
    Mixtral's own config.json says: transformers reads a llama file named "mistral" as MistralConfig,
    whose default window is 4096)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_file))
    fields = reader.fields
    num_experts, top_k = _int_field(fields, f"{arch}.expert_count"), _int_field(fields, f"{arch}.expert_used_count")
    if arch == "llama":
        width = _int_field(fields, f"{arch}.expert_feed_forward_length") or _int_field(
            fields, f"{arch}.feed_forward_length"
        )
        return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": num_experts,
                "num_experts_per_tok": top_k, "intermediate_size": width, "sliding_window": None}
    sparse = {int(t.name.split(".")[1]) for t in reader.tensors if ".ffn_gate_exps." in t.name}
    dense = sorted(set(range(_int_field(fields, f"{arch}.block_count"))) - sparse)
    return {"num_experts": num_experts, "num_experts_per_tok": top_k, "norm_topk_prob": True,
            "moe_intermediate_size": _int_field(fields, f"{arch}.expert_feed_forward_length"),
            "decoder_sparse_step": 1, "mlp_only_layers": dense}


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
