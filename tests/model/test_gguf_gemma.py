"""Gemma 2 / Gemma 3 GGUF files (common/architectures/gemma_gguf.py) laid out as llama.cpp's converter lays them
out (testing/gguf_fixtures.py: norms stored as 1 + w, Gemma's norm names, the softcaps, window and
global-layer RoPE scaling in the metadata; no query_pre_attn_scalar, layer types or local RoPE base),
fp32 on CPU:

  * F32: greedy tokens identical to transformers on the source safetensors (transformers' own GGUF
    reader drops Gemma's softcaps, windows and local RoPE, so it is no oracle here);
  * Q8_0: identical to transformers on the source with every matrix replaced by its Q8_0
    round trip (gguf's quantize then dequantize: what the file holds), dequantized
    (--quantization none), kept as int8 (--quantization int8) and as stored blocks
    (--quantization gguf, exact torch GEMM).

The fixtures keep what llama.cpp derives (query_pre_attn_scalar = head_dim), so the metadata alone
rebuilds them; their 4 layers alternate sliding (8 tokens, shorter than the prompts) and global,
which for Gemma 3 (default: every 6th layer global) the file states in
attention.sliding_window_pattern.
"""

from __future__ import annotations

import pytest
import torch

from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import write_gguf
from testing.model_fixtures import GreedyDriver, HfReference, make_runner, make_tiny_checkpoint, random_prompt
from zserve.common.architectures.gemma_gguf import gemma_config
from zserve.common.architectures.gguf_metadata import GgufMetadata
from zserve.common.architectures.specs.gemma2 import GEMMA2
from zserve.common.architectures.specs.gemma3 import GEMMA3
from zserve.launcher.gguf_model_dir import gguf_model_dir
from zserve.model_proc.checkpoints.gguf_checkpoint import hf_name

NEW_TOKENS = 16
PROMPT_LENS = (1, 7, 23)
LLAMA_CPP_LAYOUT = {  # what llama.cpp derives from a Gemma GGUF, so the source is what the file describes
    "gemma2": dict(query_pre_attn_scalar=24),
    "gemma3": dict(query_pre_attn_scalar=24),
}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "cache")))


def zserve_greedy(model_dir, prompts, **overrides) -> list[list[int]]:
    runner = make_runner(model_dir, page_size=4, kv_cache_tokens=512, device="cpu", dtype="float32", **overrides)
    driver = GreedyDriver(runner)
    return driver.generate([driver.add(p, NEW_TOKENS) for p in prompts])


def q8_0_round_trip(reference: HfReference) -> None:
    """Every matrix of transformers' model as the Q8_0 file holds it."""
    import gguf

    q8_0 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for p in reference.model.parameters():
            if p.dim() == 2:
                blocks = gguf.quants.quantize(p.detach().numpy().astype("float32"), q8_0)
                p.copy_(torch.from_numpy(gguf.quants.dequantize(blocks, q8_0)).reshape(p.shape))


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_f32_gguf_matches_transformers_on_the_source(tmp_path, kind):
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", kind, **LLAMA_CPP_LAYOUT[kind])
    model_dir = gguf_model_dir(write_gguf(hf_dir, tmp_path / f"{kind}.gguf", "F32"), with_tokenizer=False)
    prompts = [random_prompt(n, seed=n) for n in PROMPT_LENS]
    reference = HfReference(hf_dir)
    for prompt, ours in zip(prompts, zserve_greedy(model_dir, prompts), strict=True):
        assert ours == reference.generate(prompt, NEW_TOKENS), f"{kind}: prompt of {len(prompt)} tokens"


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
@pytest.mark.parametrize("quantization", ["none", "int8", "gguf"])
def test_q8_0_gguf_matches_the_dequantized_source(tmp_path, kind, quantization):
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", kind, **LLAMA_CPP_LAYOUT[kind])
    model_dir = gguf_model_dir(write_gguf(hf_dir, tmp_path / f"{kind}.gguf", "Q8_0"), with_tokenizer=False)
    prompts = [random_prompt(n, seed=n) for n in PROMPT_LENS]
    ours = zserve_greedy(model_dir, prompts, quantization=quantization,
                         **({"gemm_backend": "torch"} if quantization == "gguf" else {}))
    reference = HfReference(hf_dir)
    q8_0_round_trip(reference)
    for prompt, out in zip(prompts, ours, strict=True):
        assert out == reference.generate(prompt, NEW_TOKENS), f"{kind} {quantization}: prompt of {len(prompt)} tokens"


def test_gemma_tensor_names():
    gemma = {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
             "post_ffw_norm": "post_feedforward_layernorm"}
    from zserve.common.architectures.gemma_gguf import GEMMA_GGUF_TO_HF as names

    for gguf_key, module in gemma.items():
        assert hf_name(f"blk.2.{gguf_key}.weight", names) == f"model.layers.2.{module}.weight"
    assert hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"  # Llama's meaning


def metadata(arch: str, **keys) -> dict:
    base = {"embedding_length": 2304, "attention.head_count": 8, "attention.head_count_kv": 4, "block_count": 26,
            "attention.key_length": 256, "attention.value_length": 256, "feed_forward_length": 9216,
            "attention.layer_norm_rms_epsilon": 1e-6, "context_length": 8192, **keys}
    return {f"{arch}.{k}": v for k, v in base.items() if v is not None}


RULES = {"gemma2": GEMMA2, "gemma3": GEMMA3}


def gemma_config_of(arch: str, fields: dict, has_output: bool, vocab_size: int, where: str) -> dict:
    """config.json from metadata `fields` of a file whose tensors are the embedding (and the output)."""
    shapes = {"token_embd.weight": (64, vocab_size), **({"output.weight": (64, vocab_size)} if has_output else {})}
    return gemma_config(RULES[arch], GgufMetadata(arch, fields, shapes, {}, where))


def test_missing_metadata_falls_back_as_llama_cpp_does():
    gemma2 = gemma_config_of("gemma2", metadata("gemma2"), has_output=False, vocab_size=600, where="m.gguf")
    assert (gemma2["sliding_window"], gemma2["attn_logit_softcapping"], gemma2["final_logit_softcapping"]) == \
        (4096, 50.0, 30.0)
    assert gemma2["layer_types"][:3] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert gemma2["query_pre_attn_scalar"] == 256 and gemma2["tie_word_embeddings"]
    assert gemma2["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    gemma3 = gemma_config_of("gemma3", metadata("gemma3"), has_output=True, vocab_size=600, where="m.gguf")
    assert gemma3["sliding_window"] is None and set(gemma3["layer_types"]) == {"full_attention"}
    assert gemma3["final_logit_softcapping"] is None and not gemma3["tie_word_embeddings"]
    assert gemma3["rope_parameters"]["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}
    windowed = gemma_config_of("gemma3", metadata("gemma3", **{"attention.sliding_window": 512}), False, 600, "m.gguf")
    assert [i for i, t in enumerate(windowed["layer_types"]) if t == "full_attention"] == [5, 11, 17, 23]
    # the 27B models (46 layers of Gemma 2, 62 of Gemma 3): hidden / heads, as llama.cpp
    big = gemma_config_of("gemma2", metadata("gemma2", block_count=46, embedding_length=4608,
                                          **{"attention.head_count": 32, "attention.key_length": 128,
                                             "attention.value_length": 128}), False, 600, "m.gguf")
    assert big["query_pre_attn_scalar"] == 144
    per_layer = metadata("gemma3", block_count=2, **{"attention.sliding_window": 4,
                                                    "attention.sliding_window_pattern": [True, False]})
    assert gemma_config_of("gemma3", per_layer, False, 600, "m.gguf")["layer_types"] == \
        ["sliding_attention", "full_attention"]


@pytest.mark.parametrize("arch, keys, message", [
    ("gemma3", {"rope.scaling.type": "yarn", "rope.scaling.factor": 8.0}, "rope.scaling.type 'yarn' is not supported"),
    ("gemma2", {"attention.value_length": 128}, "value_length=128 differs from the head size 256"),
    ("gemma2", {"rope.freq_base_swa": 1e6}, "local RoPE base"),
    ("gemma3", {"attention.head_count_kv": [4, 8] * 13}, "per-layer gemma3.attention.head_count_kv"),
    ("gemma2", {"context_length": None}, "lacks gemma2.context_length"),
])
def test_features_we_cannot_run_are_refused_in_one_line(arch, keys, message):
    with pytest.raises(ValueError, match=message) as refused:
        gemma_config_of(arch, metadata(arch, **keys), has_output=False, vocab_size=600, where="m.gguf")
    assert "\n" not in str(refused.value) and "m.gguf" in str(refused.value)


def test_a_refused_gemma_gguf_stops_before_any_model_dir(tmp_path, monkeypatch):
    import gguf

    from testing import gguf_gemma_fixtures

    original = gguf_gemma_fixtures.add_gemma_metadata

    def with_yarn(writer, arch, config, omit=()):
        original(writer, arch, config, omit=("rope.scaling.type",))
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)

    monkeypatch.setattr(gguf_gemma_fixtures, "add_gemma_metadata", with_yarn)
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", "gemma3", **LLAMA_CPP_LAYOUT["gemma3"])
    gguf_file = write_gguf(hf_dir, tmp_path / "yarn.gguf", "F32")
    with pytest.raises(ValueError, match="yarn.gguf: gemma3.rope.scaling.type 'yarn' is not supported for Gemma"):
        gguf_model_dir(gguf_file, with_tokenizer=False)
