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
from testing.model_fixtures import (
    GreedyDriver,
    HfReference,
    first_divergence,
    make_runner,
    make_tiny_checkpoint,
    random_prompt,
)
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


@pytest.mark.parametrize("kind", ["gemma2", "gemma3", "phi3", "qwen2_window"])
def test_int8_covers_the_newer_architectures(tmp_path, kind):
    """Gemma's GeGLU and tied head, Phi-3's fused qkv / gate_up, a sliding window: every linear layer
    through the int8 weight kernel `auto` picks, greedy tokens equal to the dequantized oracle."""
    model_dir = make_tiny_checkpoint(tmp_path / "model", kind)
    oracle = HfReference(dequantized_copy(model_dir, tmp_path / "dequantized"))
    runner = make_runner(model_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=512, quantization="int8")
    driver = GreedyDriver(runner)
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    ours = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts])
    for prompt, out in zip(prompts, ours, strict=True):
        assert out == oracle.generate(prompt, NEW_TOKENS), f"{kind}: prompt of {len(prompt)} tokens"


def test_int8_differs_from_the_float_model(tmp_path):
    """The oracle is not vacuous: the quantized weights change the logits."""
    model_dir = make_tiny_checkpoint(tmp_path / "model", "llama")
    prompt = random_prompt(9, seed=9)
    exact = HfReference(model_dir).last_logits(prompt)
    dequantized = HfReference(dequantized_copy(model_dir, tmp_path / "dequantized")).last_logits(prompt)
    assert 1e-4 < float((exact - dequantized).abs().max()) < 0.5


@pytest.mark.skipif(load_gemm_int8_dot() is None, reason="the int8 x int8 GEMM needs the avx2 feature and a built extension")
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


@pytest.mark.parametrize("gemm", ["torch", "zserve_dot"])  # int8_torch (exact); the int8 x int8 kernel's 4-bit path
@pytest.mark.parametrize("kind", KINDS)
def test_int4_greedy_equals_transformers_on_the_dequantized_weights(tmp_path, kind, gemm):
    """--quantization int4 (weights/int4_weights.py: asymmetric, groups of 32): every linear layer
    and the LM head packed as 4-bit codes; the oracle runs the same codes dequantized (and, for the
    int8 x int8 kernel, the linear inputs quantized as it quantizes them)."""
    if gemm == "zserve_dot" and load_gemm_int8_dot() is None:
        pytest.skip("the int8 x int8 GEMM needs the avx2 feature and a built extension")
    from zserve.model_proc.layers.gemm import GemmWeight

    model_dir = make_tiny_checkpoint(tmp_path / "model", kind)
    oracle = HfReference(dequantized_copy(model_dir, tmp_path / "dequantized", bits=4))
    if gemm == "zserve_dot":
        quantize_linear_inputs(oracle.model)
    runner = make_runner(model_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=512, quantization="int4", gemm_backend=gemm)
    layers = [m for m in runner.model.modules() if isinstance(m, GemmWeight)]
    expected_bits = 4 if gemm == "zserve_dot" else 8  # int8_torch holds the 4-bit codes as int8
    assert layers and all(m.packed.bits == expected_bits and m.packed.offsets is not None for m in layers)
    driver = GreedyDriver(runner)
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    ours = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts])
    exact = 0
    for prompt, out in zip(prompts, ours, strict=True):
        theirs, logits = oracle.generate_with_logits(prompt, NEW_TOKENS)
        exact += first_divergence(out, theirs, logits, near_tie_ulps=2.0) is None  # zserve_dot: see test_gguf_stored.py
    assert exact == 3 if gemm == "torch" else exact >= 2, f"{kind}: {exact} of 3 prompts identical"
