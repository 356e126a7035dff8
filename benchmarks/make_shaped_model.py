"""A checkpoint of a real model's shape with random weights, for benchmarks (nothing is downloaded):
transformers builds it from its config and `save_pretrained`s it in bf16, with the demo model's
tokenizer files (so the vocabulary is SmolLM2's 49152 tokens, not the original's).

    .venv/bin/python benchmarks/make_shaped_model.py --shape llama-3.2-1b --out ~/.cache/zserve/llama-1b-shaped

Shapes: llama-3.2-1b (hidden 2048, MLP 8192, 16 layers, 32 heads, 8 KV heads, tied embeddings:
1.07 B parameters with this vocabulary, Llama-3.2-1B's 1.24 B with its 128256). The weights are
normal with std 0.02 (transformers' init), so the model's answers mean nothing: benchmarks check
that every server returns tokens, and compare speed only. llama.cpp gets the same weights through
its own converter (`convert_hf_to_gguf.py`) and `llama-quantize`.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

SHAPES = {
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, tie_word_embeddings=True, rope_theta=500000.0,
                         max_position_embeddings=8192, rms_norm_eps=1e-5),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPES), default="llama-3.2-1b")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

    from zserve.launcher.demo_model import demo_model_dir

    demo = demo_model_dir()
    demo_config = AutoConfig.from_pretrained(demo)
    config = LlamaConfig(vocab_size=demo_config.vocab_size, bos_token_id=demo_config.bos_token_id,
                         eos_token_id=demo_config.eos_token_id, **SHAPES[args.shape])
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    for name in TOKENIZER_FILES:
        if (demo / name).is_file():
            shutil.copy(demo / name, args.out / name)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.shape}: {params / 1e9:.2f} B parameters (vocabulary {config.vocab_size}) in {args.out}")


if __name__ == "__main__":
    main()
