"""--quantization int8 end to end: zserve with int8 weights against transformers on the SAME model
with its weights replaced by their dequantized values (Q * S, int8_weights.dequantize_int8): the
exact oracle for the int8 path. fp32 compute on both sides, so greedy tokens are identical.

Every linear layer and the LM head are quantized; the embedding, norms and biases are not. A tied
LM head quantizes its own copy while the lookup keeps the float embedding, so the oracle of a
tied model is written untied (lm_head = the dequantized embedding, embed_tokens = the original).
"""

from __future__ import annotations

import pytest

from testing.int8_oracle import dequantized_copy, quantize_linear_inputs
from testing.model_fixtures import GreedyDriver, HfReference, make_runner, make_tiny_checkpoint, random_prompt
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot

KINDS = ("llama", "qwen2", "llama_tied")  # GQA; qkv biases; tied embeddings
NEW_TOKENS = 16
@pytest.mark.parametrize("gemm", ["auto", "torch"])  # zserve_int8 where the kernel runs; int8_torch (the reference)
@pytest.mark.parametrize("kind", KINDS)
def test_int8_greedy_equals_transformers_on_the_dequantized_weights(tmp_path, kind, gemm):
    model_dir = make_tiny_checkpoint(tmp_path / "model", kind)
    oracle = HfReference(dequantized_copy(model_dir, tmp_path / "dequantized"))
    runner = make_runner(model_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=512, quantization="int8", gemm_backend=gemm)
    assert runner.gemm_backend == ("int8_torch" if gemm == "torch" else runner.gemm_backend)
    assert runner.gemm_backend in ("zserve_int8", "int8_torch")
    driver = GreedyDriver(runner)
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    ours = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts])  # a batch: the 23-token prefill takes the tiled path
    for prompt, out in zip(prompts, ours, strict=True):
        assert out == oracle.generate(prompt, NEW_TOKENS), f"{kind}: prompt of {len(prompt)} tokens"


def test_int8_differs_from_the_float_model(tmp_path):
    """The oracle is not vacuous: the quantized weights change the logits."""
    model_dir = make_tiny_checkpoint(tmp_path / "model", "llama")
    prompt = random_prompt(9, seed=9)
    exact = HfReference(model_dir).last_logits(prompt)
    dequantized = HfReference(dequantized_copy(model_dir, tmp_path / "dequantized")).last_logits(prompt)
    assert 1e-4 < float((exact - dequantized).abs().max()) < 0.5


@pytest.mark.skipif(load_gemm_int8_dot() is None, reason="the int8 x int8 GEMM needs the avx2 level and a built extension")
@pytest.mark.parametrize("kind", KINDS)
def test_int8_dot_greedy_equals_transformers_with_quantized_activations(tmp_path, kind):
    """zserve_int8_dot (--gemm-backend zserve_dot, here in fp32) against its exact oracle: the
    dequantized weights, and every linear layer's input quantized per row in blocks of 32 as the
    kernel quantizes it (testing/int8_oracle.py `quantize_linear_inputs`)."""
    model_dir = make_tiny_checkpoint(tmp_path / "model", kind)
    oracle = HfReference(dequantized_copy(model_dir, tmp_path / "dequantized"))
    assert quantize_linear_inputs(oracle.model) == 2 * 7 + 1  # q k v o gate up down per layer, the LM head
    runner = make_runner(model_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=512, quantization="int8", gemm_backend="zserve_dot")
    assert runner.gemm_backend == "zserve_int8_dot"
    driver = GreedyDriver(runner)
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    ours = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts])
    for prompt, out in zip(prompts, ours, strict=True):
        assert out == oracle.generate(prompt, NEW_TOKENS), f"{kind}: prompt of {len(prompt)} tokens"
    plain = HfReference(dequantized_copy(model_dir, tmp_path / "plain")).last_logits(prompts[2])
    assert float((plain - oracle.last_logits(prompts[2])).abs().max()) > 1e-3  # the oracle's rounding is not vacuous
