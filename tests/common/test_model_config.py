"""ModelConfig: both RoPE spellings, EOS ids, context length, clear errors for bad directories."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testing.model_fixtures import EOS_TOKEN_IDS, make_tiny_checkpoint
from zserve.common.model_config import ModelConfig, RopeScaling

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "vocab_size": 100,
}
LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def write_config(tmp_path, config: dict, generation: dict | None = None):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_saved_checkpoints_of_every_kind(tmp_path):
    cfg = ModelConfig.from_model_dir(make_tiny_checkpoint(tmp_path / "q", "qwen3"))
    assert (cfg.family, cfg.qk_norm, cfg.head_dim, cfg.context_len) == ("qwen3", True, 32, 256)
    assert cfg.eos_token_ids == EOS_TOKEN_IDS  # config's 2 first, then generation_config's 0
    cfg = ModelConfig.from_model_dir(make_tiny_checkpoint(tmp_path / "g", "gpt2"))
    assert (cfg.family, cfg.rope_theta, cfg.tie_word_embeddings, cfg.context_len, cfg.intermediate_size) == ("gpt2", None, True, 256, 256)
    cfg = ModelConfig.from_model_dir(make_tiny_checkpoint(tmp_path / "q2", "qwen2"))
    assert (cfg.qkv_bias, cfg.o_bias, cfg.num_kv_heads) == (True, False, 1)
    cfg = ModelConfig.from_model_dir(make_tiny_checkpoint(tmp_path / "l3", "llama3_rope"))  # written by transformers 5
    assert cfg.rope_theta == 500000.0
    assert cfg.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 32, max_position_embeddings=256)


def test_rope_old_spelling(tmp_path):
    cfg = ModelConfig.from_model_dir(write_config(tmp_path, {**LLAMA, "rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **LLAMA3_SCALING}}))
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192, 256)


def test_rope_new_spelling(tmp_path):
    params = {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3_SCALING}
    cfg = ModelConfig.from_model_dir(write_config(tmp_path, {**LLAMA, "rope_parameters": params}))
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192, 256)


def test_rope_defaults_and_unsupported_type(tmp_path):
    cfg = ModelConfig.from_model_dir(write_config(tmp_path, LLAMA))
    assert (cfg.rope_theta, cfg.rope_scaling, cfg.head_dim, cfg.num_kv_heads) == (10000.0, None, 16, 2)
    write_config(tmp_path, {**LLAMA, "rope_scaling": {"rope_type": "su", "factor": 4.0}})  # "su" is longrope on Phi-3 only
    with pytest.raises(ValueError, match="rope type 'su' is not supported"):
        ModelConfig.from_model_dir(tmp_path)


@pytest.mark.parametrize(
    "rope, error",
    [
        ({"rope_type": "mrope", "factor": 2.0}, "rope type 'mrope' is not supported"),
        ({"rope_type": "yarn", "factor": 4.0, "mrope_section": [2, 3, 3]}, "mrope_section"),
        ({"rope_type": "llama3", "factor": 8.0, "beta_fast": 32}, "rope type 'llama3' with beta_fast is not"),
        ({"rope_type": "longrope", "long_factor": [1.0] * 8}, "'longrope' needs 'short_factor' and 'long_factor'"),
        ({"rope_type": "longrope", "short_factor": "x", "long_factor": [1.0]}, "'short_factor' must be a list"),
        ({"rope_type": "dynamic"}, "rope type 'dynamic' needs a 'factor'"),
        ({"rope_type": "default", "partial_rotary_factor": 0.2}, "rotates 3 of 16 dims; need even"),
        ({"rope_type": "default", "partial_rotary_factor": 1.5}, "partial_rotary_factor must be in"),
    ],
)
def test_rope_features_we_do_not_run_are_refused(tmp_path, rope, error):
    write_config(tmp_path, {**LLAMA, "rope_parameters": {"rope_theta": 10000.0, **rope}})
    with pytest.raises(ValueError, match=error):
        ModelConfig.from_model_dir(tmp_path)


def test_rope_scalings_and_phi3(tmp_path):
    """yarn and dynamic extend the context (as vLLM); Phi-3's top-level original maximum wins, its
    old 'su'/'yarn' names mean longrope, and longrope's factor defaults to max / original."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 1e4}
    cfg = ModelConfig.from_model_dir(write_config(tmp_path, {**LLAMA, "rope_parameters": yarn}))
    assert (cfg.context_len, cfg.rope_scaling.rope_type, cfg.rope_scaling.factor) == (512, "yarn", 4.0)
    cfg = ModelConfig.from_model_dir(write_config(tmp_path, {**LLAMA, "rope_scaling": {"type": "dynamic", "factor": 2.0}}))
    assert (cfg.context_len, cfg.rope_scaling.max_position_embeddings) == (512, 256)
    factors = {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    phi3 = {**LLAMA, "architectures": ["Phi3ForCausalLM"], "original_max_position_embeddings": 64,
            "partial_rotary_factor": 0.75, "rope_scaling": {"type": "su", "original_max_position_embeddings": 32, **factors}}
    cfg = ModelConfig.from_model_dir(write_config(tmp_path, phi3))
    scaling = cfg.rope_scaling
    assert (cfg.family, scaling.rope_type, scaling.original_max_position_embeddings, scaling.factor) == ("phi3", "longrope", 64, 4.0)
    assert (cfg.context_len, cfg.rotary_dim, scaling.long_factor) == (256, 12, (2.0,) * 8)


def test_eos_ids_union_of_lists(tmp_path):
    cfg = ModelConfig.from_model_dir(write_config(tmp_path, {**LLAMA, "eos_token_id": [128001, 128008]}, {"eos_token_id": [128001, 128009]}))
    assert cfg.eos_token_ids == (128001, 128008, 128009)


def test_sliding_windows_do_not_cap_the_context(tmp_path):
    """The window is per layer (attention applies it); the context stays config.json's maximum."""
    cfg = ModelConfig.from_model_dir(write_config(tmp_path, {**LLAMA, "architectures": ["MistralForCausalLM"], "max_position_embeddings": 32768, "sliding_window": 4096}))
    assert cfg.context_len == 32768 and cfg.layer_windows == (4096, 4096) and cfg.attn_logit_softcap == 0.0
    plain = ModelConfig.from_model_dir(write_config(tmp_path, {**LLAMA, "max_position_embeddings": 32768, "sliding_window": 4096}))
    assert plain.context_len == 32768 and plain.layer_windows == (0, 0)  # a Llama config's window is not used
    assert not hasattr(cfg, "context_note") and not hasattr(cfg, "window_capped_from")


def test_qwen2_windows_only_with_use_sliding_window(tmp_path):
    qwen2 = {**LLAMA, "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 4, "sliding_window": 8, "max_window_layers": 1}
    assert ModelConfig.from_model_dir(write_config(tmp_path, qwen2)).layer_windows == (0, 0, 0, 0)
    cfg = ModelConfig.from_model_dir(write_config(tmp_path, {**qwen2, "use_sliding_window": True}))
    assert cfg.layer_windows == (0, 8, 8, 8)  # layers from max_window_layers on slide, as in transformers


def test_unknown_layer_type_is_refused(tmp_path):
    qwen2 = {**LLAMA, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 8, "use_sliding_window": True}
    write_config(tmp_path, {**qwen2, "layer_types": ["full_attention", "chunked_attention"]})
    with pytest.raises(ValueError, match=r"config.json: layer type 'chunked_attention' is not supported"):
        ModelConfig.from_model_dir(tmp_path)


def test_logit_softcap_read_only_where_transformers_applies_it(tmp_path):
    cfg = ModelConfig.from_model_dir(write_config(tmp_path, {**LLAMA, "attn_logit_softcapping": 50.0}))
    assert cfg.attn_logit_softcap == 0.0  # transformers' Llama has no soft-capping


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    write_config(tmp_path, {**LLAMA, "architectures": ["MambaForCausalLM"]})
    with pytest.raises(ValueError, match=r"'MambaForCausalLM' is not supported; supported: .*GPT2LMHeadModel, .*LlamaForCausalLM"):
        ModelConfig.from_model_dir(tmp_path)


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ModelConfig.from_model_dir(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        ModelConfig.from_model_dir(tmp_path)


def test_malformed_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
        ModelConfig.from_model_dir(tmp_path)
    write_config(tmp_path, {k: v for k, v in LLAMA.items() if k != "hidden_size"})
    with pytest.raises(ValueError, match=r"config.json: missing 'hidden_size'"):
        ModelConfig.from_model_dir(tmp_path)
    write_config(tmp_path, {**LLAMA, "num_hidden_layers": "two"})
    with pytest.raises(ValueError, match=r"'num_hidden_layers' must be int"):
        ModelConfig.from_model_dir(tmp_path)
    write_config(tmp_path, LLAMA, generation={"eos_token_id": "x"})
    with pytest.raises(ValueError, match="eos_token_id"):
        ModelConfig.from_model_dir(tmp_path)


def test_config_reader_does_not_import_torch():
    code = "import sys, common.model_config, common.worker_env; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_phi3_sliding_window_applies_to_every_layer_like_mistral(tmp_path):
    """transformers' Phi-3 attends within config.sliding_window (Phi-3-mini-4k: 2047) with no
    use_sliding_window flag: every layer slides, over the full context."""
    phi3 = {**LLAMA, "architectures": ["Phi3ForCausalLM"], "sliding_window": 100}
    cfg = ModelConfig.from_model_dir(write_config(tmp_path, phi3))
    assert cfg.context_len == 256 and cfg.layer_windows == (100,) * cfg.num_layers


def test_refused_activation_names_agree_with_the_model_code():
    """common/feature_refusal.py names the activations without importing torch; they must be the
    model code's tables exactly, or a supported activation is refused (or an unsupported one let in)."""
    from zserve.common.feature_refusal import GATED_ACTIVATION_NAMES, PLAIN_ACTIVATION_NAMES
    from zserve.model_proc.layers.activation import ACTIVATIONS, GATED_ACTIVATIONS

    assert set(GATED_ACTIVATION_NAMES) == set(GATED_ACTIVATIONS)
    assert set(PLAIN_ACTIVATION_NAMES) == set(ACTIVATIONS)
