"""The Gemma metadata convert_hf_to_gguf.py writes (Gemma2Model / Gemma3Model.set_gguf_parameters),
for testing/gguf_fixtures.py's `write_gguf`; `omit` leaves keys out, to test llama.cpp's fallbacks.

    gemma2: attn_logit_softcapping, final_logit_softcapping, attention.sliding_window
    gemma3: final_logit_softcapping (when set), attention.sliding_window, rope.scaling.type +
            rope.scaling.factor (the global layers' linear scaling); rope.freq_base is the global base

Neither stores query_pre_attn_scalar, layer types or the local RoPE base: llama.cpp derives them.
"""

from __future__ import annotations

from typing import Any


def add_gemma_metadata(writer, arch: str, config: dict[str, Any], omit: tuple[str, ...] = ()) -> None:
    def add(key: str, method: str, value: Any) -> None:
        if key not in omit and value is not None:
            getattr(writer, method)(value)

    add("sliding_window", "add_sliding_window", config.get("sliding_window"))
    add("final_logit_softcapping", "add_final_logit_softcapping", config.get("final_logit_softcapping"))
    if arch == "gemma2":
        add("attn_logit_softcapping", "add_attn_logit_softcapping", config.get("attn_logit_softcapping"))
        return
    full = (config.get("rope_parameters") or {}).get("full_attention") or {}
    if full.get("rope_type") == "linear":
        add("rope.scaling.type", "add_rope_scaling_type", _linear())
        add("rope.scaling.factor", "add_rope_scaling_factor", float(full["factor"]))


def _linear():
    import gguf

    return gguf.RopeScalingType.LINEAR
