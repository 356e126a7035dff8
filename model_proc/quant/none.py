"""--quantization none: every matrix in --dtype, run by the float kernels (a stored quantized
matrix, a GGUF block or an AWQ / GPTQ layer, dequantized into it)."""

from __future__ import annotations

from dataclasses import dataclass

from zserve.model_proc.quant.quant_method import QuantMethod


@dataclass(frozen=True)
class NoneMethod(QuantMethod):
    name = "none"
    kernel_family = "none"
    quantized = False
