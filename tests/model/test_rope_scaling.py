"""Our RoPE cos/sin vs transformers' own rotary embedding classes, for every scaling type, at many
positions: fp32 to float rounding, bf16 as transformers rounds it. The length-dependent types
("dynamic", "longrope") are checked at sequence lengths on both sides of their threshold, with
every token of the sequence given that length (what one transformers forward does)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from zserve.common.model_config import ModelConfig
from zserve.model_proc.layers.rotary import RotaryEmbedding, apply_rotary

BASE = dict(vocab_size=64, hidden_size=128, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2)
CASES = {  # name -> (config class, config kwargs)
    "linear": ("LlamaConfig", dict(max_position_embeddings=256, rope_scaling=dict(rope_type="linear", factor=3.0))),
    "llama3": ("LlamaConfig", dict(max_position_embeddings=1024, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64, rope_theta=500000.0))),
    "yarn": ("LlamaConfig", dict(max_position_embeddings=512, rope_scaling=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=128))),
    "yarn_mscale": ("LlamaConfig", dict(max_position_embeddings=512, rope_scaling=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=128, mscale=0.707, mscale_all_dim=1.0,
        beta_fast=16, beta_slow=2, truncate=False))),
    "yarn_attention_factor": ("LlamaConfig", dict(max_position_embeddings=512, rope_scaling=dict(
        rope_type="yarn", factor=2.0, original_max_position_embeddings=256, attention_factor=0.9))),
    "dynamic": ("LlamaConfig", dict(max_position_embeddings=100, rope_scaling=dict(rope_type="dynamic", factor=2.0))),
    "longrope": ("Phi3Config", dict(max_position_embeddings=1024, original_max_position_embeddings=100, rope_scaling=dict(
        rope_type="longrope", short_factor=[1.0 + 0.1 * i for i in range(16)],
        long_factor=[1.0 + 0.9 * i for i in range(16)]))),
    "longrope_partial": ("Phi3Config", dict(max_position_embeddings=1024, original_max_position_embeddings=100,
                                            partial_rotary_factor=0.5, rope_scaling=dict(
        rope_type="longrope", short_factor=[1.0 + 0.2 * i for i in range(8)],
        long_factor=[1.0 + 1.5 * i for i in range(8)]))),
    "partial_default": ("Phi3Config", dict(max_position_embeddings=256, partial_rotary_factor=0.75)),
}
SEQ_LENS = (1, 37, 99, 100, 101, 150, 400)  # around the thresholds of dynamic (100) and longrope (100)


def _pair(tmp_path, name: str):
    """(transformers' rotary embedding, ours), from one config.json."""
    config_name, kwargs = CASES[name]
    config = getattr(transformers, config_name)(**BASE, **kwargs)
    config.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["architectures"] = ["Phi3ForCausalLM" if config_name == "Phi3Config" else "LlamaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_model_dir(tmp_path)
    module = transformers.models.phi3.modeling_phi3 if config_name == "Phi3Config" else transformers.models.llama.modeling_llama
    theirs = getattr(module, config_name.replace("Config", "RotaryEmbedding"))(config)
    return theirs, RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.rotary_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_cos_sin_match_transformers(tmp_path, name, dtype):
    theirs, ours = _pair(tmp_path, name)
    for seq_len in SEQ_LENS:
        positions = torch.arange(seq_len)
        cos_ref, sin_ref = theirs(torch.zeros(1, dtype=dtype), positions[None])  # [1, T, rotary_dim]
        cos, sin_signed = ours(positions, dtype, torch.full((seq_len,), seq_len))
        half = cos.shape[-1] // 2
        sin = torch.cat((-sin_signed[..., :half], sin_signed[..., half:]), dim=-1)
        assert cos.shape[-1] == cos_ref.shape[-1] == ours.rotary_dim
        torch.testing.assert_close(cos[:, 0], cos_ref[0], rtol=0, atol=0 if dtype == torch.bfloat16 else 2e-7)
        torch.testing.assert_close(sin[:, 0], sin_ref[0], rtol=0, atol=0 if dtype == torch.bfloat16 else 2e-7)


def test_rows_of_one_batch_take_their_own_regime(tmp_path):
    """longrope: a short request and a long one in one step, each rotated as transformers would alone."""
    theirs, ours = _pair(tmp_path, "longrope")
    positions = torch.tensor([5, 6, 7, 149])
    cos, _ = ours(positions, torch.float32, torch.tensor([8, 8, 8, 150]))
    short, _ = theirs(torch.zeros(1), torch.arange(8)[None])
    long, _ = theirs(torch.zeros(1), torch.arange(150)[None])
    torch.testing.assert_close(cos[:3, 0], short[0, 5:8], rtol=0, atol=2e-7)
    torch.testing.assert_close(cos[3, 0], long[0, 149], rtol=0, atol=2e-7)
    assert not torch.allclose(short[0, 5:8], long[0, 5:8])  # the regimes differ at these positions


def test_partial_rotary_passes_the_rest_through():
    x = torch.randn(3, 2, 16)
    rotary = RotaryEmbedding(16, 10000.0, None, rotary_dim=12)
    cos, sin = rotary(torch.tensor([0, 4, 9]), torch.float32)
    out = apply_rotary(x, cos, sin)
    assert torch.equal(out[..., 12:], x[..., 12:])
    q_embed, _ = transformers.models.phi3.modeling_phi3.apply_rotary_pos_emb(
        x.transpose(0, 1), x.transpose(0, 1), cos[:, 0], torch.cat((-sin[:, 0, :6], sin[:, 0, 6:]), -1), unsqueeze_dim=0
    )
    torch.testing.assert_close(out, q_embed.transpose(0, 1), rtol=0, atol=0)
