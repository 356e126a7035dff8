"""Tiny AWQ and GPTQ checkpoints, written here from a float checkpoint (testing/model_fixtures.py),
with this module's own packer and its own dequantization, independent of
model_proc/checkpoints/packed_int4_checkpoint.py:

  * each linear weight W [out, in] is quantized per group of G input rows and output column,
    asymmetric: scale s = fp16((max - min) / 15), zero z = clamp(round(-min / s), 0, 15),
    code q = clamp(round(W / s) + z, 0, 15); the weight it stands for is (q - z) * s;
  * GPTQ: qweight int32 [in / 8, out], code of input row 8i + j in bits 4j; qzeros int32
    [in / G, out / 8], zero of column 8m + j in bits 4j, stored as z - 1 ("gptq", v1) or z
    ("gptq_v2"); scales fp16 [in / G, out]; g_idx int32 [in] = i // G;
  * AWQ ("gemm"): qweight int32 [in, out / 8] and qzeros [in / G, out / 8], column 8m + c in nibble
    AWQ_PACK_ORDER.index(c) (AutoAWQ packs the columns 0 2 4 6 1 3 5 7 into nibbles 0..7).

`dequantized_checkpoint` writes the same model with every linear weight replaced by (q - z) * s
(float64 arithmetic, stored fp32): the oracle transformers runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

LINEAR_SUFFIXES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble p of a word holds column AWQ_PACK_ORDER[p] of its 8


def quantize_groups(w_out_in: np.ndarray, group: int, min_zero: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes [in, out] int64, zeros [in / G, out] int64 in [min_zero, 15], scales [in / G, out] fp16)."""
    w = w_out_in.T.astype(np.float64)  # [in, out]
    grouped = w.reshape(w.shape[0] // group, group, w.shape[1])
    low, high = grouped.min(axis=1), grouped.max(axis=1)
    scales = np.ascontiguousarray(((high - low) / 15).astype(np.float16))
    scales[scales == 0] = np.float16(1e-3)
    s = scales.astype(np.float64)
    zeros = np.clip(np.round(-low / s), min_zero, 15).astype(np.int64)
    codes = np.clip(np.round(grouped / s[:, None]) + zeros[:, None], 0, 15).astype(np.int64)
    return codes.reshape(w.shape), zeros, scales


def dequantize_groups(codes: np.ndarray, zeros: np.ndarray, scales: np.ndarray, group: int) -> np.ndarray:
    """[in, out] float64: (q - z) * s, each group's z and s repeated over its rows."""
    return (codes - np.repeat(zeros, group, axis=0)) * np.repeat(scales.astype(np.float64), group, axis=0)


def _pack_rows(values: np.ndarray) -> np.ndarray:
    """[R, C] 4-bit -> int32 [R / 8, C]: row 8i + j in bits 4j."""
    r, c = values.shape
    words = np.zeros((r // 8, c), dtype=np.int64)
    for j in range(8):
        words |= values[j::8] << (4 * j)
    return words.astype(np.uint32).view(np.int32)


def _pack_cols(values: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
    """[R, C] 4-bit -> int32 [R, C / 8]: nibble p of word m holds column 8m + order[p]."""
    r, c = values.shape
    words = np.zeros((r, c // 8), dtype=np.int64)
    for p, col in enumerate(order):
        words |= values[:, col::8] << (4 * p)
    return words.astype(np.uint32).view(np.int32)


def write_packed_checkpoint(model_dir: Path, target: Path, method: str, group: int = 32, checkpoint_format: str = "gptq",
                            act_order: bool = False) -> tuple[Path, dict[str, np.ndarray]]:
    """`model_dir` as an AWQ or GPTQ checkpoint in `target`; returns it and, per linear layer prefix,
    the [in, out] weight it stands for (float64)."""
    target.mkdir(parents=True)
    config = json.loads((model_dir / "config.json").read_text())
    tensors = load_file(str(model_dir / "model.safetensors"))
    out, standing_for = {}, {}
    for name, tensor in tensors.items():
        prefix = name.removesuffix(".weight")
        if not (name.endswith(".weight") and prefix.rsplit(".", 1)[-1] in LINEAR_SUFFIXES):
            out[name] = tensor
            continue
        v1 = method == "gptq" and checkpoint_format == "gptq"  # z - 1 stored in 4 bits: z >= 1 (AutoGPTQ's)
        codes, zeros, scales = quantize_groups(tensor.float().numpy(), group, min_zero=1 if v1 else 0)
        standing_for[prefix] = dequantize_groups(codes, zeros, scales, group)
        if method == "gptq":
            out[f"{prefix}.qweight"] = torch.from_numpy(_pack_rows(codes))
            stored_zeros = zeros - 1 if v1 else zeros
            out[f"{prefix}.qzeros"] = torch.from_numpy(_pack_cols(stored_zeros, tuple(range(8))))
            g_idx = np.arange(codes.shape[0]) // group
            if act_order:
                g_idx = g_idx[::-1].copy()
            out[f"{prefix}.g_idx"] = torch.from_numpy(g_idx.astype(np.int32))
        else:
            out[f"{prefix}.qweight"] = torch.from_numpy(_pack_cols(codes, AWQ_PACK_ORDER))
            out[f"{prefix}.qzeros"] = torch.from_numpy(_pack_cols(zeros, AWQ_PACK_ORDER))
        out[f"{prefix}.scales"] = torch.from_numpy(np.ascontiguousarray(scales))
    quant = ({"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm", "zero_point": True} if method == "awq"
             else {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order, "sym": False,
                   "checkpoint_format": checkpoint_format})
    save_file(out, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps(config | {"quantization_config": quant}))
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (model_dir / extra).is_file():
            shutil.copy(model_dir / extra, target / extra)
    return target, standing_for


def dequantized_checkpoint(model_dir: Path, standing_for: dict[str, np.ndarray], target: Path) -> Path:
    """`model_dir` (the float original) with each linear weight replaced by what the packed one stands for."""
    target.mkdir(parents=True)
    tensors = load_file(str(model_dir / "model.safetensors"))
    for prefix, w_in_out in standing_for.items():
        tensors[f"{prefix}.weight"] = torch.from_numpy(w_in_out.T.astype(np.float32).copy())
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(model_dir / "config.json", target / "config.json")
    if (model_dir / "generation_config.json").is_file():
        shutil.copy(model_dir / "generation_config.json", target / "generation_config.json")
    return target
