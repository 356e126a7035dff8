"""A 4-bit GPTQ safetensors checkpoint (quant_method "gptq", checkpoint_format gptq or gptq_v2,
no act-order, groups a multiple of 32): read and served as AWQ's (quant/awq.py); only the
packing differs (checkpoints/packed_int4_checkpoint.py)."""

from __future__ import annotations

from dataclasses import dataclass

from zserve.model_proc.quant.awq import AwqMethod


@dataclass(frozen=True)
class GptqMethod(AwqMethod):
    name = "gptq"
