"""Gemma 2 / 3 config.json as zserve reads it, checked against transformers' own config classes
on configs shaped like the hub's (sparse multimodal text_config, old and new RoPE spellings),
and the Gemma features zserve refuses."""

from __future__ import annotations

import json

import pytest
import transformers

from testing.model_fixtures import make_tiny_checkpoint
from zserve.common.model_config import ModelConfig, RopeScaling

# google/gemma-2-2b's config.json (transformers 4.42)
GEMMA2_2B = {
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attn_logit_softcapping": 50.0,
    "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 107], "final_logit_softcapping": 30.0,
    "head_dim": 256, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
    "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
    "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
    "vocab_size": 256000,
}
# google/gemma-3-4b-it's config.json (transformers 4.50): the text_config leaves most keys to the defaults
GEMMA3_4B_IT = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304, "model_type": "siglip_vision_model",
                      "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14},
}


def read(tmp_path, config: dict) -> ModelConfig:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return ModelConfig.from_model_dir(tmp_path)


def transformers_text_config(config: dict):
    """What transformers builds from the same dict (the text config of a multimodal one)."""
    model_type = config["model_type"]
    built = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"})
    return built.text_config if model_type == "gemma3" else built


def rope_of(params: dict) -> tuple[float, RopeScaling | None]:
    theta = params["rope_theta"]
    if params["rope_type"] == "default":
        return theta, None
    return theta, params["factor"]


@pytest.mark.parametrize("config", [GEMMA2_2B, GEMMA3_4B_IT], ids=["gemma-2-2b", "gemma-3-4b-it"])
def test_hub_configs_read_as_transformers_reads_them(tmp_path, config):
    cfg, theirs = read(tmp_path, config), transformers_text_config(config)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        theirs.hidden_size, theirs.intermediate_size, theirs.num_hidden_layers, theirs.num_attention_heads,
        theirs.num_key_value_heads, theirs.head_dim,
    )
    assert (cfg.vocab_size, cfg.context_len, cfg.norm_eps, cfg.hidden_act) == (
        theirs.vocab_size, theirs.max_position_embeddings, theirs.rms_norm_eps, theirs.hidden_activation
    )
    assert cfg.attn_scale == theirs.query_pre_attn_scalar**-0.5 and cfg.tie_word_embeddings
    assert cfg.final_logit_softcap == (theirs.final_logit_softcapping or 0.0)
    assert cfg.local_layers == tuple(t == "sliding_attention" for t in theirs.layer_types)
    assert cfg.layer_windows == tuple(theirs.sliding_window if local else 0 for local in cfg.local_layers)
    if cfg.family == "gemma3":
        full, local = theirs.rope_parameters["full_attention"], theirs.rope_parameters["sliding_attention"]
        assert (cfg.rope_theta, cfg.rope_scaling.factor) == rope_of(full)
        assert (cfg.rope_local_theta, None) == rope_of(local)
        assert cfg.qk_norm and cfg.attn_logit_softcap == 0.0  # transformers' Gemma 3 never soft-caps attention
    else:
        assert (cfg.rope_theta, cfg.rope_scaling) == rope_of(theirs.rope_parameters)
        assert not cfg.qk_norm and cfg.attn_logit_softcap == theirs.attn_logit_softcapping


def test_gemma3_4b_details(tmp_path):
    cfg = read(tmp_path, GEMMA3_4B_IT)
    assert (cfg.architecture, cfg.family, cfg.eos_token_ids, cfg.stored_dtype) == (
        "Gemma3ForConditionalGeneration", "gemma3", (1, 106), "bfloat16"
    )
    assert [i for i, local in enumerate(cfg.local_layers) if not local] == [5, 11, 17, 23, 29]  # pattern 6
    assert cfg.rope_scaling == RopeScaling(
        "linear", 8.0, original_max_position_embeddings=131072, max_position_embeddings=131072
    )


def test_fixture_checkpoints(tmp_path):
    for kind in ("gemma2", "gemma3", "gemma3_mm"):
        cfg = ModelConfig.from_model_dir(make_tiny_checkpoint(tmp_path / kind, kind))
        assert (cfg.num_layers, cfg.head_dim, cfg.layer_windows) == (4, 24, (8, 0, 8, 0)), kind
        assert cfg.attn_scale == 20**-0.5, kind
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_scaling.factor) == (50000.0, 10000.0, 2.0)
    gemma2 = ModelConfig.from_model_dir(tmp_path / "gemma2")
    assert (gemma2.final_logit_softcap, gemma2.attn_logit_softcap) == (8.0, 2.0)


GEMMA3 = {**GEMMA3_4B_IT["text_config"], "architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 2}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
         "sliding-window layers with rope type 'linear' are not supported"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "must be keyed by 'full_attention'"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"query_pre_attn_scalar": 0}, "'query_pre_attn_scalar' must be a positive number"),
        ({"final_logit_softcapping": -1.0}, "'final_logit_softcapping' must be a positive number"),
        ({"layer_types": ["sliding_attention"]}, "'layer_types' must list one type per layer"),
        ({"rope_parameters": {"full_attention": {"rope_type": "not_a_rope", "factor": 2.0}}}, "rope type .not_a_rope. is not supported"),
    ],
)
def test_refused_in_one_line(tmp_path, change, message):
    with pytest.raises(ValueError, match=message) as err:
        read(tmp_path, {**GEMMA3, **change})
    assert "\n" not in str(err.value)


def test_multimodal_flag_inside_text_config_is_refused(tmp_path):
    config = {**GEMMA3_4B_IT, "text_config": {**GEMMA3_4B_IT["text_config"], "use_bidirectional_attention": True}}
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        read(tmp_path, config)
