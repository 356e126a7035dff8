"""Which type each tensor gets under a llama-quantize file type (benchmarks/make_shaped_gguf.py),
following llama.cpp's src/llama-quant.cpp (llama_tensor_get_type) for the mixes written here:

  * 1-D tensors (norms, biases) and the MoE router (ffn_gate_inp) stay F32: never quantized.
  * f16 / bf16: every other tensor in that type.
  * output.weight, and token_embd.weight when tied (no output.weight): Q8_0 under q8_0, else Q6_K.
  * q4_k_m, otherwise Q4_K, except Q6_K for attn_v and ffn_down (ffn_down_exps too) of the layers
    where use_more_bits(i, n) holds: i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2 (integer division;
    i the layer, n the number of layers), i.e. the first and last eighth and every third between.
  * q8_0 / q4_0: every other matrix in that type.
  * A row (the innermost dimension) that is not whole 256-value blocks falls back as llama.cpp's
    tensor_type_fallback does: Q4_K -> Q5_0, Q6_K -> Q8_0; and to F16 if not whole 32-value blocks.

Not reproduced: the 8-expert (Mixtral) special cases (attn_k / attn_v Q8_0, attn_output Q5_K)
and the 70B attn_v bump; a --config with exactly 8 experts gets the plain rule.
"""

from __future__ import annotations

from benchmarks.gguf_random_blocks import BLOCK_VALUES

FILE_TYPES = {"f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2, "q4_k_m": 15}  # general.file_type (llama_ftype)
BASE_TYPE = {"f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k_m": "Q4_K"}
FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}
MORE_BITS = ("attn_v", "ffn_down", "ffn_down_exps")  # q4_k_m: Q6_K where use_more_bits holds


def use_more_bits(layer_idx: int, num_layers: int) -> bool:
    return layer_idx < num_layers // 8 or layer_idx >= 7 * num_layers // 8 or (layer_idx - num_layers // 8) % 3 == 2


def tensor_type(mix: str, name: str, shape: tuple[int, ...], num_layers: int, tied: bool) -> str:
    """The type of tensor `name` (numpy `shape`) under file type `mix` (a FILE_TYPES key)."""
    if len(shape) < 2 or ".ffn_gate_inp." in name:
        return "F32"
    base = BASE_TYPE[mix]
    if base in ("F16", "BF16"):
        return base
    chosen = base
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        chosen = "Q8_0" if base == "Q8_0" else "Q6_K"
    elif mix == "q4_k_m" and name.startswith("blk."):
        _, layer, kind, _ = name.split(".")
        if kind in MORE_BITS and use_more_bits(int(layer), num_layers):
            chosen = "Q6_K"
    num_cols = shape[-1]
    if num_cols % BLOCK_VALUES[chosen]:
        chosen = FALLBACK.get(chosen, chosen)
    return chosen if num_cols % BLOCK_VALUES[chosen] == 0 else "F16"
