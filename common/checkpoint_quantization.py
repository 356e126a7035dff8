"""A Hugging Face checkpoint whose config.json has a `quantization_config`: its weights are stored in
a quantized scheme (FP8, bitsandbytes, compressed-tensors, AWQ, GPTQ, ...) whose values mean nothing
without that scheme's scales and packing. zserve loads none of these schemes yet, so each is refused
at start, naming its `quant_method`, instead of reading the stored values as if they were the weights
(which starts a server that answers garbage). A GGUF file's own quantized types are another matter:
gguf_checkpoint.py reads them; `--quantization int8` quantizes 16-bit weights at load.
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


def quantization_refusal(raw: dict[str, Any], path: Path) -> str | None:
    """The refusal of a config.json with a `quantization_config`, or None when it has none."""
    if "quantization_config" not in raw:
        return None
    quant = raw["quantization_config"]
    method = quant.get("quant_method") if isinstance(quant, dict) else None
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
