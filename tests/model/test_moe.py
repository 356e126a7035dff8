"""Mixture of experts: the grouped expert GEMMs against a per-token loop, the routers' rules, the
config's MoE fields and parameter counts against transformers', refusals, and --quantization
int8 / int4 over the experts against the exact oracle (testing/int8_oracle.py).

Greedy parity of the MoE kinds against transformers (fp32, bf16, fp16; chunked prefill, prefix
hits, mixed batches, both attention paths) is in the parametrized parity tests; TP=2 in test_model_tp.py."""

from __future__ import annotations

import json

import pytest
import torch

from testing.int8_oracle import dequantized_copy
from testing.model_fixtures import GreedyDriver, HfReference, make_runner, make_tiny_checkpoint, random_prompt
from zserve.common.model_config import ModelConfig
from zserve.common.moe_config import MoeConfig
from zserve.model_proc.layers.fused_experts import FusedExperts
from zserve.model_proc.layers.gemm import GemmWeight, prepack_weights
from zserve.model_proc.layers.router import TopKRouter
from zserve.model_proc.layers.weight_kernels.float_kernels import TorchKernel

HIDDEN, INTERMEDIATE, NUM_EXPERTS = 16, 12, 6


def random_experts(seed: int) -> FusedExperts:
    torch.manual_seed(seed)
    experts = FusedExperts(NUM_EXPERTS, HIDDEN, INTERMEDIATE, "silu", 0, 1)
    for m in experts.modules():
        if isinstance(m, GemmWeight):
            m.weight.normal_(0, 0.3)
    prepack_weights(experts, TorchKernel())
    return experts


def per_token(experts: FusedExperts, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The definition: each token's sum over its k experts of weight * expert(token)."""
    rows = []
    for t in range(x.shape[0]):
        rows.append(sum(float(w) * experts.experts[int(e)](x[t : t + 1])[0] for e, w in zip(ids[t], weights[t], strict=True)))
    return torch.stack(rows)


@pytest.mark.parametrize("num_tokens", [1, 2, 9])
def test_grouped_experts_equal_a_loop_over_tokens(num_tokens):
    experts = random_experts(num_tokens)
    x = torch.randn(num_tokens, HIDDEN)
    ids = torch.stack([torch.randperm(NUM_EXPERTS)[:2] for _ in range(num_tokens)])  # experts 4, 5 mostly unhit
    ids = ids % 4 if num_tokens > 2 else ids
    weights = torch.rand(num_tokens, 2)
    ours = experts(x, ids, weights)
    torch.testing.assert_close(ours, per_token(experts, x, ids, weights), atol=1e-5, rtol=1e-5)
    swapped = experts(x, ids.flip(0), weights)  # the check can fail: other routing, other output
    assert num_tokens == 1 or not torch.allclose(swapped, ours, atol=1e-3)


def test_router_top_k_and_renormalisation():
    router = TopKRouter(HIDDEN, NUM_EXPERTS, 2, norm_topk_prob=True, round_weights=True)
    router.weight.copy_(torch.randn(NUM_EXPERTS, HIDDEN))
    x = torch.randn(5, HIDDEN)
    probs = torch.softmax(x @ router.weight.T, dim=-1)
    ids, weights = router(x)
    assert torch.equal(ids, probs.topk(2).indices)
    torch.testing.assert_close(weights, probs.topk(2).values / probs.topk(2).values.sum(-1, keepdim=True))
    router.norm_topk_prob = False
    torch.testing.assert_close(router(x)[1], probs.topk(2).values)
    router = router.to(torch.bfloat16)
    assert router(x.bfloat16())[1].dtype == torch.bfloat16  # Qwen rounds the weights; Mixtral keeps fp32
    router.round_weights = False
    assert router(x.bfloat16())[1].dtype == torch.float32


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe", "mixtral"])
def test_config_and_parameter_counts_match_transformers(tmp_path, kind):
    import transformers

    model_dir = make_tiny_checkpoint(tmp_path, kind)
    cfg = ModelConfig.from_model_dir(model_dir)
    assert cfg.moe is not None and (cfg.moe.num_experts, cfg.moe.num_experts_per_tok) == (8, 2)
    sparse = [cfg.moe.is_sparse_layer(i) for i in range(cfg.num_layers)]
    assert sparse == ([True, False, True] if kind == "qwen3_moe" else [True, True])
    assert cfg.moe.norm_topk_prob == (kind != "qwen2_moe") and cfg.moe.has_shared_expert == (kind == "qwen2_moe")
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    assert cfg.num_params == sum(p.numel() for p in hf.parameters() if p.dim() >= 2)  # every expert, no norms/biases
    expert = 3 * cfg.hidden_size * cfg.moe.expert_intermediate_size
    assert cfg.num_params - cfg.num_active_params == sum(sparse) * (8 - 2) * expert


def write_config(tmp_path, **changes) -> ModelConfig:
    model_dir = make_tiny_checkpoint(tmp_path / "m", "qwen3_moe")
    raw = json.loads((model_dir / "config.json").read_text())
    raw.update(changes)
    (model_dir / "config.json").write_text(json.dumps(raw))
    return ModelConfig.from_model_dir(model_dir)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_experts_per_tok": 9}, "num_experts_per_tok=9 is more than num_experts=8"),
        ({"moe_intermediate_size": None}, "missing 'moe_intermediate_size'"),
        ({"decoder_sparse_step": 0}, "'decoder_sparse_step' must be an integer >= 1"),
        ({"mlp_only_layers": "1"}, "'mlp_only_layers' must be a list"),
    ],
)
def test_bad_moe_settings_are_refused_in_one_line(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message) as info:
        write_config(tmp_path, **changes)
    assert "\n" not in str(info.value)


def test_real_qwen3_moe_spelling_of_the_expert_count(tmp_path):
    """Qwen3-30B-A3B's config.json says num_experts (transformers 5 writes num_local_experts)."""
    cfg = write_config(tmp_path, num_experts=16, num_local_experts=None, decoder_sparse_step=2, mlp_only_layers=[])
    assert cfg.moe == MoeConfig(16, 2, 64, True, 0, 2, ())
    assert [cfg.moe.is_sparse_layer(i) for i in range(3)] == [False, True, False]


@pytest.mark.parametrize(("quantization", "gemm"), [("int8", "torch"), ("int8", "auto"), ("int4", "torch")])
def test_quantization_covers_the_experts(tmp_path, quantization, gemm):
    """Every expert (and the shared expert) is a GemmWeight, quantized like any linear: greedy tokens
    equal transformers' on the dequantized weights (the router stays in the compute dtype, as in the oracle)."""
    model_dir = make_tiny_checkpoint(tmp_path / "model", "qwen2_moe")
    bits = 4 if quantization == "int4" else 8
    oracle = HfReference(dequantized_copy(model_dir, tmp_path / "dequantized", bits=bits))
    runner = make_runner(model_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=512,
                         quantization=quantization, gemm_backend=gemm)
    layers = [m for m in runner.model.modules() if isinstance(m, GemmWeight)]
    assert len(layers) == 2 * (2 + 2 * 9) + 1 and all(m.packed.scales is not None for m in layers)
    driver = GreedyDriver(runner)
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    ours = driver.generate([driver.add(p, 16) for p in prompts])
    for prompt, out in zip(prompts, ours, strict=True):
        assert out == oracle.generate(prompt, 16), f"prompt of {len(prompt)} tokens"
