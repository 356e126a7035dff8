"""The Gemma metadata convert_hf_to_gguf.py writes (Gemma2Model / Gemma3Model.set_gguf_parameters),
for testing/gguf_fixtures.py's `write_gguf`; `omit` leaves keys out, to test llama.cpp's fallbacks.

    gemma2: attn_logit_softcapping, final_logit_softcapping, attention.sliding_window
    gemma3: final_logit_softcapping (when set), attention.sliding_window, rope.scaling.type +
            rope.scaling.factor (the global layers' linear scaling); rope.freq_base is the global base

Neither stores query_pre_attn_scalar, layer types or the local RoPE base: llama.cpp derives them.
Layer types off the family's default pattern go in as attention.sliding_window_pattern (a key newer
llama.cpp reads for Gemma 2 and others), so a fixture need not follow Gemma 3's pattern of 6.
"""

from __future__ import annotations

from typing import Any


def add_gemma_metadata(writer, arch: str, config: dict[str, Any], omit: tuple[str, ...] = ()) -> None:
    def add(key: str, method: str, value: Any) -> None:
        if key not in omit and value is not None:
            getattr(writer, method)(value)

    add("sliding_window", "add_sliding_window", config.get("sliding_window"))
    add("sliding_window_pattern", "add_sliding_window_pattern", _pattern(arch, config))
    add("final_logit_softcapping", "add_final_logit_softcapping", config.get("final_logit_softcapping"))
    if arch == "gemma2":
        add("attn_logit_softcapping", "add_attn_logit_softcapping", config.get("attn_logit_softcapping"))
        return
    full = (config.get("rope_parameters") or {}).get("full_attention") or {}
    if full.get("rope_type") == "linear":
        add("rope.scaling.type", "add_rope_scaling_type", _linear())
        add("rope.scaling.factor", "add_rope_scaling_factor", float(full["factor"]))


def _pattern(arch: str, config: dict[str, Any]) -> int | list[bool] | None:
    """Layer types off the family's default (gemma2: every 2nd layer global, gemma3: every 6th) as
    attention.sliding_window_pattern: a period where they have one, else a bool per layer."""
    sliding = [t == "sliding_attention" for t in config.get("layer_types") or []]
    for period in range(1, len(sliding) + 1):
        if sliding == [bool((i + 1) % period) for i in range(len(sliding))]:
            return None if period == {"gemma2": 2, "gemma3": 6}[arch] else period
    return sliding or None


def _linear():
    import gguf

    return gguf.RopeScalingType.LINEAR
