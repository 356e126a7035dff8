"""The spec's window rule (common/architectures/layer_windows.py) against transformers' own reading of the
same config: which layers slide, with which window, for every architecture with windows (layer_types
present or derived)."""

from __future__ import annotations

import pytest

from zserve.common.architectures import spec_for_hf
from zserve.common.architectures.layer_windows import layer_windows


def layer_windows_for(arch: str, raw: dict, num_layers: int, path: str = "config.json") -> tuple[int, ...]:
    return layer_windows(spec_for_hf(arch).windows, raw, num_layers, path)


NUM_LAYERS = 7
SIZES = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=NUM_LAYERS,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16)
CASES = {  # name -> (architecture, transformers config class, config.json fields)
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(sliding_window=8)),
    "mistral_none": ("MistralForCausalLM", "MistralConfig", dict(sliding_window=None)),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(sliding_window=8)),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(sliding_window=8)),
    "qwen2_off": ("Qwen2ForCausalLM", "Qwen2Config", dict(sliding_window=8, max_window_layers=2)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(use_sliding_window=True, sliding_window=8, max_window_layers=2)),
    "qwen2_default_layers": ("Qwen2ForCausalLM", "Qwen2Config", dict(use_sliding_window=True, sliding_window=8)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(use_sliding_window=True, sliding_window=8, max_window_layers=3)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(use_sliding_window=True, sliding_window=8)),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(sliding_window=8)),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(sliding_window=8)),
    "gemma3_pattern": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(sliding_window=8, sliding_window_pattern=3)),
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(sliding_window=8)),
}


def transformers_windows(arch: str, config) -> tuple[int, ...]:
    """What each layer of transformers' model passes as its attention's sliding_window (None -> 0)."""
    if arch == "LlamaForCausalLM":
        return (0,) * NUM_LAYERS  # LlamaAttention has no window
    window = config.sliding_window or 0
    if arch in ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM", "Qwen3MoeForCausalLM"):
        return (window,) * NUM_LAYERS  # getattr(config, "sliding_window") in every layer
    return tuple(window if t == "sliding_attention" else 0 for t in config.layer_types)


@pytest.mark.parametrize("name", list(CASES))
def test_windows_match_transformers(name):
    import transformers

    arch, config_class, fields = CASES[name]
    config = getattr(transformers, config_class)(**SIZES, **fields)
    expected = transformers_windows(arch, config)
    assert layer_windows_for(arch, {**SIZES, **fields}, NUM_LAYERS) == expected  # an older config.json: no layer_types
    written = config.to_dict()  # what save_pretrained writes (transformers 5: layer_types where the model has them)
    assert layer_windows_for(arch, written, NUM_LAYERS) == expected
    if name in ("qwen2", "gemma2", "gemma3", "mistral"):
        assert 0 < sum(w > 0 for w in expected) < NUM_LAYERS or name == "mistral"  # the case exercises a mix


def test_the_documented_rules():
    assert layer_windows_for("Gemma2ForCausalLM", {"sliding_window": 4}, 4) == (4, 0, 4, 0)
    assert layer_windows_for("Gemma3ForCausalLM", {"sliding_window": 4}, 7) == (4, 4, 4, 4, 4, 0, 4)
    assert layer_windows_for("Qwen2ForCausalLM", {"sliding_window": 4, "use_sliding_window": True, "max_window_layers": 2}, 3) == (0, 0, 4)


@pytest.mark.parametrize(
    "arch, raw, message",
    [
        ("Gemma2ForCausalLM", {"sliding_window": 4, "layer_types": ["sliding_attention", "linear_attention"]},
         "layer type 'linear_attention' is not supported"),
        ("Gemma2ForCausalLM", {"sliding_window": 4, "layer_types": ["sliding_attention"]}, "one type per layer"),
        ("Gemma3ForCausalLM", {"sliding_window": 4, "use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("MistralForCausalLM", {"sliding_window": 0}, "'sliding_window' must be a positive integer"),
        ("Gemma3ForCausalLM", {"sliding_window": 4, "sliding_window_pattern": 0}, "'sliding_window_pattern'"),
    ],
)
def test_refused_in_one_line(arch, raw, message):
    with pytest.raises(ValueError, match=message) as info:
        layer_windows_for(arch, raw, 2, "m/config.json")
    assert str(info.value).startswith("m/config.json: ") and "\n" not in str(info.value)
