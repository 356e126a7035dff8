"""Mixture-of-experts GGUF files (llama.cpp's `qwen3moe`, and Mixtral as `llama` with experts):
the experts stacked [n_expert, out, in] per projection, read one expert slice at a time, fp32 on CPU.

  * F32: greedy tokens identical to transformers on the source safetensors;
  * Q8_0 / Q4_0 / Q4_K: identical to transformers on the weights the file holds, dequantized by gguf
    itself (testing/gguf_fixtures.py `dequantized_hf_dir`): dequantized to float32 (--quantization
    none), Q8_0 kept as int8 (--quantization int8), and every type kept as stored (--quantization
    gguf, --gemm-backend torch: the stored codes dequantized exactly).

The qwen3_moe fixture's layer 1 is dense (mlp_only_layers): the config rebuilt from the metadata
finds it by its missing ffn_gate_exps. Its hidden and expert widths are equal (64), so an expert read
in the wrong orientation fails on values, not on shape. Q4_K rows are 256 values: that variant is 256 wide.

The stacked path (layers/stacked_experts.py, kernels/moe_experts.cpp: --quantization gguf on the
int8-dot kernel, each projection of a layer's experts packed in one call, one op per layer): its
output equal bit for bit to fused_experts.py's loop over the same file's experts (float32 and
bfloat16, 1 to 37 tokens), for Q4_K and Q4_K_M (down experts Q6_K: 8-bit codes, groups of 16);
the served model's greedy tokens equal to the loop's (that kernel quantizes activations to int8,
so transformers is the oracle of the exact paths only); nothing per expert left.
"""

from __future__ import annotations

import json

import pytest
import torch

from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import dequantized_hf_dir, write_gguf
from testing.model_fixtures import GreedyDriver, HfReference, make_runner, make_tiny_checkpoint, random_prompt
from zserve.launcher.gguf_model_dir import gguf_model_dir
from zserve.model_proc.layers import fused_experts
from zserve.model_proc.layers.fused_experts import ExpertMLP, FusedExperts
from zserve.model_proc.layers.stacked_experts import StackedExperts
from zserve.model_proc.resident_memory import resident_bytes_by_form

NEW_TOKENS = 12
WIDE = {"hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 256, "head_dim": 64}
VARIANTS = {  # name -> (tiny kind, GGUF weight type, --quantization, make_tiny_checkpoint overrides)
    "qwen3_moe_f32": ("qwen3_moe", "F32", "none", {}),
    "mixtral_f32": ("mixtral", "F32", "none", {}),
    "qwen3_moe_q8_0": ("qwen3_moe", "Q8_0", "none", {}),
    "qwen3_moe_q8_0_int8": ("qwen3_moe", "Q8_0", "int8", {}),
    "mixtral_q8_0_int8": ("mixtral", "Q8_0", "int8", {}),
    "qwen3_moe_q4_0_gguf": ("qwen3_moe", "Q4_0", "gguf", {}),
    "qwen3_moe_q4_k_gguf": ("qwen3_moe", "Q4_K", "gguf", WIDE),
}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "cache")))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_moe_gguf_greedy_matches_transformers(tmp_path, name):
    kind, weight_type, quantization, overrides = VARIANTS[name]
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", kind, **overrides)
    gguf_file = write_gguf(hf_dir, tmp_path / f"{name}.gguf", weight_type)
    model_dir = gguf_model_dir(gguf_file, with_tokenizer=False)
    runner = make_runner(model_dir, page_size=4, kv_cache_tokens=512, device="cpu", dtype="float32",
                         quantization=quantization, gemm_backend="torch" if quantization == "gguf" else "auto")
    experts = [m for m in runner.model.modules() if isinstance(m, ExpertMLP)]
    assert len(experts) == 16, len(experts)  # 2 sparse layers x 8 experts
    if quantization != "none":  # every expert matrix packed from the file's own blocks (groups of 32)
        packed = [m.gate_up_proj.packed for m in experts] + [m.down_proj.packed for m in experts]
        assert all(p.scales is not None and p.group_size == 32 for p in packed), {(p.group_size, p.bits) for p in packed}
    oracle = hf_dir if weight_type == "F32" else dequantized_hf_dir(hf_dir, gguf_file, tmp_path / "dequantized")
    reference = HfReference(oracle)
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    driver = GreedyDriver(runner)
    ours = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts])
    for prompt, out in zip(prompts, ours, strict=True):
        assert out == reference.generate(prompt, NEW_TOKENS), f"{name}: prompt of {len(prompt)} tokens"


def _routes(num_tokens: int, num_experts: int, top_k: int, dtype: torch.dtype, seed: int):
    """x, distinct expert ids per token and their weights, random."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, WIDE["hidden_size"], generator=gen).to(dtype)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)])
    weights = torch.rand(num_tokens, top_k, generator=gen).softmax(dim=1).to(dtype)
    return x, ids, weights


@pytest.mark.parametrize("weight_type", ["Q4_K", "Q4_K_M"])
def test_stacked_experts_match_the_loop(tmp_path, monkeypatch, weight_type):
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", "qwen3_moe", **WIDE)
    gguf_file = write_gguf(hf_dir, tmp_path / "m.gguf", weight_type)
    model_dir = gguf_model_dir(gguf_file, with_tokenizer=False)
    options = {"page_size": 4, "kv_cache_tokens": 512, "device": "cpu", "dtype": "float32", "quantization": "gguf",
               "gemm_backend": "zserve_dot"}
    runner = make_runner(model_dir, **options)
    if runner.gemm_backend != "zserve_int8_dot":
        pytest.skip(f"the stacked experts run on the zserve_int8_dot kernel (here: {runner.gemm_backend})")
    stacked = [m for m in runner.model.modules() if isinstance(m, FusedExperts)]
    assert len(stacked) == 2 and all(m.stacked is not None and len(m.experts) == 0 for m in stacked)
    assert not [m for m in runner.model.modules() if isinstance(m, ExpertMLP)]
    down_bits = {m.stacked.down.bits for m in stacked}
    assert down_bits == ({4} if weight_type == "Q4_K" else {6}), down_bits  # the mix: Q6_K down experts, 6-bit codes
    # the memory line counts the stacked codes and scales once each
    forms, _ = resident_bytes_by_form(runner.model, torch.float32)
    stacked_codes = sum(p.values.numel() for m in stacked for p in m.stacked.packed_weights())
    assert forms["4-bit codes"] + forms.get("6-bit codes", 0) + forms.get("int8 codes", 0) >= stacked_codes
    assert "uint8 embeddings and norms" not in forms or forms["uint8 embeddings and norms"] < stacked_codes

    monkeypatch.setattr(fused_experts, "load_moe_experts", lambda: None)  # the same file through the loop
    loop_runner = make_runner(model_dir, **options)
    loops = [m for m in loop_runner.model.modules() if isinstance(m, FusedExperts)]
    assert all(m.stacked is None and len(m.experts) == 8 for m in loops)
    for dtype in (torch.float32, torch.bfloat16):
        for num_tokens in (1, 5, 37):
            x, ids, weights = _routes(num_tokens, 8, 2, dtype, seed=num_tokens)
            for ours, loop in zip(stacked, loops, strict=True):
                got, want = ours(x, ids, weights), loop(x, ids, weights)
                assert got.dtype == dtype and torch.equal(got, want), (dtype, num_tokens)

    # served end to end: the same greedy tokens as the loop (the int8-dot kernel quantizes activations, so
    # transformers is the oracle of the exact paths above, not of this one)
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    outputs = []
    for served in (runner, loop_runner):
        driver = GreedyDriver(served)
        outputs.append(driver.generate([driver.add(p, NEW_TOKENS) for p in prompts]))
    assert outputs[0] == outputs[1]


def test_stacked_experts_refuse_partial_blocks():
    from zserve.model_proc.weights.compact_scales import CompactScales
    from zserve.model_proc.weights.packed_blocks_weight import PackedBlocks

    codes = torch.zeros(3, 32, 16, 4, dtype=torch.uint8)  # 3 blocks: not 2 experts of whole blocks
    compact = CompactScales(torch.zeros(3, 1, 16, dtype=torch.float16), torch.zeros(3, 8, 16, dtype=torch.int8), None, None)
    blocks = PackedBlocks(codes, compact, 4, 32, 256, 48)
    with pytest.raises(ValueError, match="not 2 experts"):
        StackedExperts(2, blocks, blocks)


def test_moe_config_from_the_metadata(tmp_path):
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", "qwen3_moe")
    config = json.loads((gguf_model_dir(write_gguf(hf_dir, tmp_path / "m.gguf", "F32"), False) / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (config["num_experts"], config["num_experts_per_tok"], config["moe_intermediate_size"]) == (8, 2, 64)
    assert config["mlp_only_layers"] == [1] and config["norm_topk_prob"] is True
    hf_dir = make_tiny_checkpoint(tmp_path / "mixtral", "mixtral")
    config = json.loads((gguf_model_dir(write_gguf(hf_dir, tmp_path / "x.gguf", "F32"), False) / "config.json").read_text())
    assert config["architectures"] == ["MixtralForCausalLM"]
    assert (config["num_local_experts"], config["num_experts_per_tok"], config["intermediate_size"]) == (8, 2, 96)
    assert config.get("sliding_window") is None


def test_an_unsupported_moe_gguf_arch_is_refused_in_one_line(tmp_path):
    """qwen2moe (a shared expert per layer, ffn_*_shexp) has no GGUF reader here: refused before any weight is read."""
    import gguf
    import numpy as np

    path = tmp_path / "q2moe.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2moe")
    writer.add_block_count(1)
    writer.add_expert_count(8)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"GGUF architecture 'qwen2moe' is not supported; supported: .*qwen3moe") as err:
        gguf_model_dir(path, with_tokenizer=False)
    assert "\n" not in str(err.value)
