"""The exact oracle of --quantization int8: a model directory whose linear weights and LM head are
replaced by what the int8 path multiplies by (quantized [in, out] as the int8 weight kernels do, then
dequantized, Q * S), for transformers to run. Used by tests/model/test_int8_parity.py (CPU) and
tests/model/test_model_gpu.py (CUDA)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from zserve.model_proc.layers.int8_weights import DEFAULT_GROUP_SIZE, dequantize_int8, quantize_int8

LINEAR_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight")


def dequantized_copy(model_dir: Path, target: Path, group_size: int = DEFAULT_GROUP_SIZE) -> Path:
    """`model_dir` with every linear weight and the LM head replaced by what the int8 path
    multiplies by (quantized [in, out] as the int8 weight kernels do, then dequantized)."""
    target.mkdir(parents=True)
    config = json.loads((model_dir / "config.json").read_text())
    tensors = load_file(str(model_dir / "model.safetensors"))

    def through_int8(weight_out_in: torch.Tensor) -> torch.Tensor:
        w = weight_out_in.float().t()  # [in, out], as the layers hold it
        g = min(group_size, w.shape[0])
        return dequantize_int8(*quantize_int8(w, g), g).t().contiguous()

    out = {name: through_int8(t) if name.endswith(LINEAR_SUFFIXES) or name == "lm_head.weight" else t for name, t in tensors.items()}
    if config.get("tie_word_embeddings"):
        out["lm_head.weight"] = through_int8(tensors["model.embed_tokens.weight"])
        config["tie_word_embeddings"] = False
    save_file(out, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps(config))
    for extra in ("generation_config.json",):
        if (model_dir / extra).is_file():
            (target / extra).write_text((model_dir / extra).read_text())
    return target
