"""4-bit AWQ and GPTQ safetensors checkpoints (a `quantization_config` with `quant_method` awq or
gptq, 4-bit, groups a multiple of 32): each linear layer's packed `qweight`, `qzeros` and `scales`
become an `Int4Weight` (weights/int4_weights.py): codes C, scales S and offsets O = -S z per group of
G input rows and output column, so W = C S + O = S (C - z), which is exact in float32 (S is fp16, C
and z 4-bit). The int8 x int8 kernel's 4-bit path runs it as it came (--quantization auto on a CPU
in bf16/fp16; `none` dequantizes it to the dtype).

    GPTQ ("gptq" / "gptq_v2" checkpoint_format; desc_act off)
      qweight  int32 [K / 8, N]   8 codes along the input dimension: row 8i + j in bits 4j..4j+3
      qzeros   int32 [K / G, N / 8]  8 zeros along the output dimension, likewise; "gptq" (v1)
                                  stores z - 1 (AutoGPTQ's convention), "gptq_v2" z itself
      scales   fp16  [K / G, N]
      g_idx    int32 [K]          must be i // G (act-order checkpoints are refused)
    AWQ ("gemm" version, zero_point on)
      qweight  int32 [K, N / 8]   8 codes along the output dimension, in AutoAWQ's interleaved order:
                                  column 8m + c in bits 4 AWQ_SHIFT_OF[c]
      qzeros   int32 [K / G, N / 8]  likewise
      scales   fp16  [K / G, N]

Which settings are loaded is common/checkpoint_quantization.py's rule (the rest is refused at start).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from zserve.model_proc.weights.int4_weights import Int4Weight

NIBBLES_PER_WORD = 8
AWQ_SHIFT_OF = (0, 4, 1, 5, 2, 6, 3, 7)  # column c of 8 sits in nibble AWQ_SHIFT_OF[c] (AutoAWQ packs 0 2 4 6 1 3 5 7)


def _nibbles(words: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 words -> uint8 codes, 8 per word, along `dim` (nibble j of each word at position 8i + j)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    expanded = (words.unsqueeze(-1) >> shifts) & 0xF  # [..., 8] on a new last dim
    expanded = expanded.movedim(-1, dim + 1) if dim < words.dim() - 1 else expanded
    shape = list(words.shape)
    shape[dim] *= NIBBLES_PER_WORD
    return expanded.reshape(shape).to(torch.uint8)


@dataclass(frozen=True)
class PackedInt4Scheme:
    method: str  # "awq" or "gptq"
    group_size: int
    zeros_minus_one: bool  # GPTQ v1: qzeros hold z - 1

    @staticmethod
    def from_config(raw: dict[str, Any]) -> PackedInt4Scheme | None:
        """The scheme of a config.json (None without an AWQ / GPTQ quantization_config; the loadable
        settings were checked by common/checkpoint_quantization.py)."""
        quant = raw.get("quantization_config")
        if not isinstance(quant, dict) or quant.get("quant_method") not in ("awq", "gptq"):
            return None
        method = quant["quant_method"]
        zeros_minus_one = method == "gptq" and quant.get("checkpoint_format", "gptq") == "gptq"
        return PackedInt4Scheme(method, int(quant["group_size"]), zeros_minus_one)

    def unpack(self, tensor: Callable[[str], torch.Tensor], in_features: int, out_features: int) -> Int4Weight:
        """The [in, out] Int4Weight of one linear layer, `tensor(suffix)` reading its qweight, qzeros,
        scales (and g_idx)."""
        scales = tensor("scales").float()
        if self.method == "gptq":
            codes = _nibbles(tensor("qweight"), dim=0)  # [K, N]
            zeros = _nibbles(tensor("qzeros"), dim=1).float()  # [K / G, N]
            if self.zeros_minus_one:
                zeros = zeros + 1
        else:
            order = torch.tensor(AWQ_SHIFT_OF)
            codes = _nibbles(tensor("qweight"), dim=1).view(in_features, -1, NIBBLES_PER_WORD)[..., order]
            codes = codes.reshape(in_features, out_features)
            zeros = _nibbles(tensor("qzeros"), dim=1).view(scales.shape[0], -1, NIBBLES_PER_WORD)[..., order]
            zeros = zeros.reshape(scales.shape).float()
        if codes.shape != (in_features, out_features) or scales.shape != (in_features // self.group_size, out_features):
            raise ValueError(
                f"{self.method} tensors of shape {list(codes.shape)} (codes) and {list(scales.shape)} (scales) do not "
                f"fit a [{in_features}, {out_features}] layer in groups of {self.group_size}"
            )
        return Int4Weight(codes.contiguous(), scales.contiguous(), (-(scales * zeros)).contiguous(), self.group_size)

    @staticmethod
    def check_g_idx(g_idx: torch.Tensor, group_size: int) -> None:
        if not torch.equal(g_idx.long(), torch.arange(g_idx.numel()) // group_size):
            raise ValueError("a GPTQ layer with act-order (g_idx not i // group_size) is not loaded")
