"""--quantization int8: each float matrix quantized at load to int8 codes with an fp32 scale per
group of input rows (weights/int8_weights.py); a GGUF file's Q8_0 matrices kept as stored (int8
values and a scale per 32 input rows: the same format), its other types read as floats."""

from __future__ import annotations

from dataclasses import dataclass

from zserve.model_proc.quant.quant_method import QuantMethod


@dataclass(frozen=True)
class Int8Method(QuantMethod):
    name = "int8"
    gguf_types_kept = frozenset({"Q8_0"})
