"""--quantization int8 end to end: zserve with int8 weights against transformers on the SAME model
with its weights replaced by their dequantized values (Q * S, int8_weights.dequantize_int8): the
exact oracle for the int8 path. fp32 compute on both sides, so greedy tokens are identical.

Every linear layer and the LM head are quantized; the embedding, norms and biases are not. A tied
LM head quantizes its own copy while the lookup keeps the float embedding, so the oracle of a
tied model is written untied (lm_head = the dequantized embedding, embed_tokens = the original).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from testing.model_fixtures import GreedyDriver, HfReference, make_runner, make_tiny_checkpoint, random_prompt
from zserve.model_proc.layers.int8_weights import DEFAULT_GROUP_SIZE, dequantize_int8, quantize_int8

KINDS = ("llama", "qwen2", "llama_tied")  # GQA; qkv biases; tied embeddings
NEW_TOKENS = 16
LINEAR_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight")


def dequantized_copy(model_dir: Path, target: Path, group_size: int = DEFAULT_GROUP_SIZE) -> Path:
    """`model_dir` with every linear weight and the LM head replaced by what the int8 path
    multiplies by (quantized [in, out] as gemm.py does, then dequantized)."""
    target.mkdir(parents=True)
    config = json.loads((model_dir / "config.json").read_text())
    tensors = load_file(str(model_dir / "model.safetensors"))

    def through_int8(weight_out_in: torch.Tensor) -> torch.Tensor:
        w = weight_out_in.float().t()  # [in, out], as the layers hold it
        g = min(group_size, w.shape[0])
        return dequantize_int8(*quantize_int8(w, g), g).t().contiguous()

    out = {name: through_int8(t) if name.endswith(LINEAR_SUFFIXES) or name == "lm_head.weight" else t for name, t in tensors.items()}
    if config.get("tie_word_embeddings"):
        out["lm_head.weight"] = through_int8(tensors["model.embed_tokens.weight"])
        config["tie_word_embeddings"] = False
    save_file(out, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps(config))
    for extra in ("generation_config.json",):
        if (model_dir / extra).is_file():
            (target / extra).write_text((model_dir / extra).read_text())
    return target


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
