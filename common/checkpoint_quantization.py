"""A Hugging Face checkpoint whose config.json has a `quantization_config`: its weights are stored in
a quantized scheme (FP8, bitsandbytes, compressed-tensors, AWQ, GPTQ, ...) whose values mean nothing
without that scheme's scales and packing. zserve loads 4-bit AWQ ("gemm" packing, zero points) and
4-bit GPTQ (no act-order) in groups of a multiple of 32 (model_proc/checkpoints/packed_int4_checkpoint.py); every
other scheme or setting is refused at start, naming its `quant_method`, instead of reading the stored
values as if they were the weights (which starts a server that answers garbage). A GGUF file's own
quantized types are another matter: gguf_checkpoint.py reads them; `--quantization int8` / `int4`
quantize 16-bit weights at load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# quant_method values transformers writes (HfQuantizer names), for the refusal's wording only:
# a method not listed here is refused just the same
KNOWN_METHODS = (
    "fp8", "bitsandbytes", "compressed-tensors", "awq", "gptq", "aqlm", "quanto", "eetq", "hqq", "fbgemm_fp8",
    "torchao", "bitnet", "higgs", "vptq", "spqr", "quark", "mxfp4", "auto-round",
)


def packed_int4_problem(quant: dict[str, Any]) -> str | None:
    """Why an AWQ / GPTQ quantization_config is not one zserve loads, or None when it is."""
    method = quant["quant_method"]
    bits = quant.get("bits", quant.get("w_bit"))
    group = quant.get("group_size", quant.get("q_group_size"))
    if bits != 4:
        return f"{bits}-bit weights (only 4-bit are loaded)"
    if not isinstance(group, int) or group <= 0 or group % 32:
        return f"group_size {group} (a positive multiple of 32 is loaded)"
    if method == "awq":
        if str(quant.get("version", "gemm")).lower() != "gemm":
            return f"AWQ version {quant.get('version')!r} (the 'gemm' packing is loaded)"
        if not quant.get("zero_point", True):
            return "AWQ without zero points"
    elif quant.get("desc_act"):
        return "GPTQ with act-order (desc_act)"
    elif quant.get("checkpoint_format", "gptq") not in ("gptq", "gptq_v2"):
        return f"GPTQ checkpoint_format {quant.get('checkpoint_format')!r}"
    return None


def quantization_refusal(raw: dict[str, Any], path: Path) -> str | None:
    """The refusal of a config.json with a `quantization_config` zserve does not load, or None."""
    if "quantization_config" not in raw:
        return None
    quant = raw["quantization_config"]
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method in ("awq", "gptq"):
        problem = packed_int4_problem(quant)
        if problem is None:
            return None
        return (
            f"{path}: the checkpoint's weights are quantized (quant_method {method!r}) with {problem}: zserve loads "
            "4-bit AWQ ('gemm', zero points) and GPTQ (no act-order) in groups of a multiple of 32; use the 16-bit "
            "checkpoint (add --quantization int8 or int4) or a GGUF file"
        )
    if not isinstance(method, str) or not method:
        method_text = "a quantization_config without a quant_method"
    else:
        bits = ""
        if isinstance(quant.get("bits"), int):
            bits = f", {quant['bits']}-bit"
        elif quant.get("load_in_4bit") or quant.get("load_in_8bit"):
            bits = ", 4-bit" if quant.get("load_in_4bit") else ", 8-bit"
        known = "" if method.lower() in KNOWN_METHODS else " (a method unknown to zserve)"
        method_text = f"quant_method {method!r}{bits}{known}"
    return (
        f"{path}: the checkpoint's weights are quantized ({method_text}); zserve does not load that scheme and "
        "would read the stored values without their scales: use the 16-bit checkpoint (add --quantization int8 "
        "for 8-bit weights) or a GGUF file"
    )
