"""The exact oracle of --quantization int8: a model directory whose linear weights and LM head are
replaced by what the int8 path multiplies by (quantized [in, out] as the int8 weight kernels do, then
dequantized, Q * S), for transformers to run. Used by tests/model/test_int8_parity.py (CPU) and
tests/model/test_model_gpu.py (CUDA). With `quantize_linear_inputs`, the inputs of every linear
layer and the LM head are quantized as the int8 x int8 GEMM quantizes its activations
(layers/int8_activations.py): the oracle of zserve_int8_dot."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from zserve.model_proc.layers.int8_activations import fake_quantize
from zserve.model_proc.weights.int4_weights import Int4Weight
from zserve.model_proc.weights.int8_weights import DEFAULT_GROUP_SIZE, dequantize_int8, quantize_int8

LINEAR_SUFFIXES = (
    "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight",
    "qkv_proj.weight", "gate_up_proj.weight",  # Phi-3 stores them fused
)


def dequantized_copy(model_dir: Path, target: Path, group_size: int = DEFAULT_GROUP_SIZE, bits: int = 8) -> Path:
    """`model_dir` with every linear weight and the LM head replaced by what the int8 path
    multiplies by (quantized [in, out] as the int8 weight kernels do, then dequantized); `bits` 4:
    as --quantization int4 quantizes (weights/int4_weights.py)."""
    target.mkdir(parents=True)
    config = json.loads((model_dir / "config.json").read_text())
    tensors = load_file(str(model_dir / "model.safetensors"))

    def through_int8(weight_out_in: torch.Tensor) -> torch.Tensor:
        w = weight_out_in.float().t()  # [in, out], as the layers hold it
        if bits == 4:
            return Int4Weight.quantize(w).dequantize().t().contiguous()
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


def quantize_linear_inputs(model: nn.Module) -> int:
    """Make every nn.Linear of a transformers model (the LM head included) see its input as the
    int8 x int8 GEMM does: each row quantized to int8 in blocks of 32 and dequantized
    (`fake_quantize`). Returns how many layers were hooked."""

    def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        x = args[0]
        return (fake_quantize(x.reshape(-1, x.shape[-1])).reshape(x.shape).to(x.dtype), *args[1:])

    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for module in linears:
        module.register_forward_pre_hook(hook)
    return len(linears)
