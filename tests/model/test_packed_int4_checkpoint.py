"""4-bit AWQ and GPTQ checkpoints (model_proc/checkpoints/packed_int4_checkpoint.py): each layer's unpacked
weight equals the fixture's own dequantization (testing/packed_int4_fixtures.py, written
independently) exactly, and zserve on the packed checkpoint generates transformers' greedy tokens
on the dequantized one: fp32 with the exact int8_torch reference, and `--quantization auto` in
bf16 keeps the 4-bit codes (the int8 x int8 kernel's 4-bit path) where that kernel runs."""

from __future__ import annotations

import pytest
import torch

from testing.model_fixtures import GreedyDriver, HfReference, make_runner, make_tiny_checkpoint, random_prompt
from testing.packed_int4_fixtures import dequantized_checkpoint, write_packed_checkpoint
from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot
from zserve.model_proc.layers.gemm import GemmWeight
from zserve.model_proc.quant.methods import checkpoint_method, get_quant_method
from zserve.model_proc.weights.int4_weights import Int4Weight

SCHEMES = {  # name -> (method, checkpoint_format)
    "awq": ("awq", "gptq"),
    "gptq_v1": ("gptq", "gptq"),
    "gptq_v2": ("gptq", "gptq_v2"),
}
NEW_TOKENS = 12


def stored_reader(model_dir) -> Checkpoint:
    """The reader the worker opens for an AWQ / GPTQ checkpoint (quant/awq.py, quant/gptq.py), at --quantization none."""
    method = checkpoint_method(model_dir)
    assert method.name in ("awq", "gptq"), method
    return method.open_checkpoint(model_dir, get_quant_method("none"), show_progress=False)


def packed(tmp_path, scheme: str, kind: str = "llama", **kw):
    method, checkpoint_format = SCHEMES[scheme]
    float_dir = make_tiny_checkpoint(tmp_path / "float", kind)
    return float_dir, *write_packed_checkpoint(float_dir, tmp_path / scheme, method, checkpoint_format=checkpoint_format, **kw)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_unpacked_layers_equal_the_independent_dequantization(tmp_path, scheme):
    _, model_dir, standing_for = packed(tmp_path, scheme)
    with stored_reader(model_dir) as ckpt:
        for prefix, expected in standing_for.items():
            out_features, in_features = expected.shape[1], expected.shape[0]
            weight = ckpt.read_weight(f"{prefix}.weight", (out_features, in_features))
            assert isinstance(weight, Int4Weight) and weight.group_size == 32
            assert torch.equal(weight.dequantize().double(), torch.from_numpy(expected)), prefix
            shard = ckpt.read_weight(f"{prefix}.weight", (out_features, in_features), rows=(8, 24), cols=(32, 64))
            assert torch.equal(shard.dequantize().double(), torch.from_numpy(expected[32:64, 8:24])), prefix
        with pytest.raises(ValueError, match="cuts a group of 32"):
            ckpt.read_weight(f"{prefix}.weight", (out_features, in_features), cols=(0, 48))


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_equals_transformers_on_the_dequantized_weights(tmp_path, scheme, kind):
    float_dir, model_dir, standing_for = packed(tmp_path, scheme, kind)
    oracle = HfReference(dequantized_checkpoint(float_dir, standing_for, tmp_path / "dequantized"))
    runner = make_runner(model_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=512, gemm_backend="torch")
    assert runner.quantization == "none"  # fp32: the stored codes dequantized exactly into the float layers
    driver = GreedyDriver(runner)
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    ours = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts])
    for prompt, out in zip(prompts, ours, strict=True):
        assert out == oracle.generate(prompt, NEW_TOKENS), f"{scheme} {kind}: prompt of {len(prompt)} tokens"


@pytest.mark.skipif(load_gemm_int8_dot() is None, reason="the int8 x int8 GEMM needs the avx2 level and a built extension")
def test_auto_keeps_the_4_bit_codes_in_bf16(tmp_path):
    _, model_dir, _ = packed(tmp_path, "awq")
    runner = make_runner(model_dir, device="cpu", dtype="bfloat16", page_size=4, kv_cache_tokens=512)
    assert runner.quantization == "int8"  # the stored 4-bit layers as they came, the float LM head in int8
    bits = sorted(m.packed.bits for m in runner.model.modules() if isinstance(m, GemmWeight))
    assert bits == [4] * (2 * 4) + [8]  # q/k/v fused, o, gate/up fused, down per layer; the LM head
    driver = GreedyDriver(runner)
    assert len(driver.generate([driver.add(random_prompt(9, seed=9), 4)])[0]) == 4


def test_act_order_is_refused_at_load(tmp_path):
    _, model_dir, _ = packed(tmp_path, "gptq_v1", act_order=True)
    with stored_reader(model_dir) as ckpt, pytest.raises(ValueError, match="act-order"):
        ckpt.read_weight("model.layers.0.self_attn.q_proj.weight", (64, 64))
