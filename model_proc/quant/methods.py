"""Every quantization method by name (vLLM's QUANTIZATION_METHODS and get_quant_method), which
one a checkpoint stores its weights in, and what `--quantization auto` serves it with.

    method  stored in                     auto serves it as   kernels (registry.py)       a stored matrix
    none    (a 16-bit checkpoint)         none                float kernels               float rows
    int8    never (quantized at load)     -                   int8 kernels                GGUF Q8_0 as stored
    int4    never (quantized at load)     -                   int8 kernels, 4-bit codes   float rows
    gguf    a GGUF file                   gguf                int8 kernels                every STORED_TYPES type
    awq     quantization_config awq       int8                (those of int8)             Int4Weight always
    gptq    quantization_config gptq      int8                (those of int8)             Int4Weight always
"""

from __future__ import annotations

from pathlib import Path

from zserve.common.weight_formats import QUANTIZATION_CHOICES
from zserve.model_proc.quant.awq import AwqMethod
from zserve.model_proc.quant.gguf import GgufMethod
from zserve.model_proc.quant.gptq import GptqMethod
from zserve.model_proc.quant.int4 import Int4Method
from zserve.model_proc.quant.int8 import Int8Method
from zserve.model_proc.quant.none import NoneMethod
from zserve.model_proc.quant.quant_method import QuantMethod, raw_config

QUANTIZATION_METHODS: dict[str, QuantMethod] = {
    method.name: method
    for method in (NoneMethod(), Int8Method(), Int4Method(), GgufMethod(), AwqMethod(), GptqMethod())
}
assert tuple(name for name, m in QUANTIZATION_METHODS.items() if m.served) == QUANTIZATION_CHOICES


def get_quant_method(quantization: str) -> QuantMethod:
    """The method a server's --quantization names."""
    method = QUANTIZATION_METHODS.get(quantization)
    if method is None or not method.served:
        raise ValueError(f"--quantization {quantization!r}: expected one of {', '.join(QUANTIZATION_CHOICES)}")
    return method


def checkpoint_method(model_dir: str | Path) -> QuantMethod:
    """The method the checkpoint in `model_dir` stores its weights in (none: 16-bit). A config a
    method refuses never gets here: common/model_config.py refused it at start."""
    model_dir, raw = Path(model_dir), raw_config(model_dir)
    stored = [m for m in QUANTIZATION_METHODS.values() if m.stored_in(model_dir, raw)]
    assert len(stored) <= 1, f"{model_dir}: stored in {[m.name for m in stored]} at once"
    return stored[0] if stored else QUANTIZATION_METHODS["none"]


def auto_quantization(stored: QuantMethod, cpu_int8_dot_runs: bool) -> str:
    """--quantization auto: the stored method's `served_as` where the int8 x int8 kernel runs
    (`cpu_int8_dot_runs`: a CPU, a 16-bit dtype, the kernel built), else none (the stored
    blocks dequantized to the dtype, as fp32 servers and the other devices get them)."""
    return stored.served_as if cpu_int8_dot_runs else "none"
