"""--quantization int4: each float matrix quantized at load to 4-bit codes with an fp32 scale and
offset per 32 input rows (weights/int4_weights.py; int8 where K is not a multiple of 32), run by
the int8 kernels' 4-bit path."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from zserve.model_proc.quant.quant_method import QuantMethod


@dataclass(frozen=True)
class Int4Method(QuantMethod):
    name = "int4"
    needs_4bit_and_offsets = True

    def set_up(self, kernel: Any) -> Any:
        return replace(kernel, weight_bits=4)  # the int8 kernels quantize a float weight to 4 bits at load
