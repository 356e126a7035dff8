"""A model's shape as a GGUF file lays it out (benchmarks/make_shaped_gguf.py): the named shapes,
or one read from a transformers config.json (Llama, Qwen2, Qwen3, Qwen3-MoE).

    tensor (numpy order: outermost first)      when
    token_embd.weight      [vocab, hidden]
    blk.N.attn_norm.weight [hidden]             norms F32, 1.0
    blk.N.attn_q.weight    [heads * head_dim, hidden]     attn_k / attn_v: [kv_heads * head_dim, hidden]
    blk.N.attn_q.bias      [heads * head_dim]   qwen2 (q, k, v biases)
    blk.N.attn_q_norm.weight [head_dim]         qwen3, qwen3moe (q and k)
    blk.N.attn_output.weight [hidden, heads * head_dim]
    blk.N.ffn_gate/up.weight [mlp, hidden], ffn_down [hidden, mlp]              a dense layer
    blk.N.ffn_gate_inp.weight [experts, hidden] (the router, F32)               a MoE layer
    blk.N.ffn_gate/up_exps.weight [experts, expert_mlp, hidden], ffn_down_exps [experts, hidden, expert_mlp]
    output_norm.weight [hidden]; output.weight [vocab, hidden] unless tied
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

ARCH_OF_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe"}


@dataclass(frozen=True)
class ModelShape:
    arch: str  # llama.cpp's architecture name
    hidden_size: int
    intermediate_size: int  # a dense layer's MLP width
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    rope_theta: float
    rms_norm_eps: float = 1e-5
    context_len: int = 8192
    num_experts: int = 0
    num_experts_used: int = 0
    expert_intermediate_size: int = 0
    dense_layer_ids: tuple[int, ...] = ()  # MoE models: layers with a dense MLP instead of experts
    vocab_size: int = 0  # set from the tokenizer

    @property
    def qk_norm(self) -> bool:
        return self.arch in ("qwen3", "qwen3moe")

    @property
    def qkv_bias(self) -> bool:
        return self.arch == "qwen2"

    def is_sparse(self, layer_idx: int) -> bool:
        return self.num_experts > 0 and layer_idx not in self.dense_layer_ids

    def tensors(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """(GGUF name, numpy shape) of every tensor, in llama.cpp's converter order."""
        h, q_dim, kv_dim = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        yield "token_embd.weight", (self.vocab_size, h)
        for i in range(self.num_layers):
            b = f"blk.{i}"
            yield f"{b}.attn_norm.weight", (h,)
            for proj, rows in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
                yield f"{b}.{proj}.weight", (rows, h)
                if self.qkv_bias:
                    yield f"{b}.{proj}.bias", (rows,)
            if self.qk_norm:
                yield f"{b}.attn_q_norm.weight", (self.head_dim,)
                yield f"{b}.attn_k_norm.weight", (self.head_dim,)
            yield f"{b}.attn_output.weight", (h, q_dim)
            yield f"{b}.ffn_norm.weight", (h,)
            if self.is_sparse(i):
                e, m = self.num_experts, self.expert_intermediate_size
                yield f"{b}.ffn_gate_inp.weight", (e, h)
                yield f"{b}.ffn_gate_exps.weight", (e, m, h)
                yield f"{b}.ffn_up_exps.weight", (e, m, h)
                yield f"{b}.ffn_down_exps.weight", (e, h, m)
            else:
                yield f"{b}.ffn_gate.weight", (self.intermediate_size, h)
                yield f"{b}.ffn_up.weight", (self.intermediate_size, h)
                yield f"{b}.ffn_down.weight", (h, self.intermediate_size)
        yield "output_norm.weight", (h,)
        if not self.tie_word_embeddings:
            yield "output.weight", (self.vocab_size, h)

    def with_vocab(self, vocab_size: int) -> ModelShape:
        return replace(self, vocab_size=vocab_size)


SHAPES = {
    "llama-3.2-1b": ModelShape("llama", 2048, 8192, 16, 32, 8, 64, True, 500000.0),
    "llama-3.1-8b": ModelShape("llama", 4096, 14336, 32, 32, 8, 128, False, 500000.0),
    "qwen3-30b-a3b": ModelShape("qwen3moe", 2048, 6144, 48, 32, 4, 128, False, 1e6, rms_norm_eps=1e-6,
                                context_len=40960, num_experts=128, num_experts_used=8, expert_intermediate_size=768),
}


def shape_from_config(config_path: Path) -> ModelShape:
    """The shape a transformers config.json describes (model_type llama, qwen2, qwen3 or qwen3_moe)."""
    config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    model_type = config.get("model_type")
    if model_type not in ARCH_OF_MODEL_TYPE:
        raise ValueError(f"{config_path}: model_type {model_type!r} is not one of {', '.join(ARCH_OF_MODEL_TYPE)}")
    num_heads = int(config["num_attention_heads"])
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    num_layers = int(config["num_hidden_layers"])
    num_experts = int(config.get("num_experts") or 0)
    step = int(config.get("decoder_sparse_step") or 1)
    dense = {int(i) for i in config.get("mlp_only_layers") or []}
    dense |= {i for i in range(num_layers) if num_experts and (i + 1) % step}  # transformers' Qwen3-MoE rule
    return ModelShape(
        arch=ARCH_OF_MODEL_TYPE[model_type],
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // num_heads),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        rope_theta=float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        context_len=int(config.get("max_position_embeddings", 8192)),
        num_experts=num_experts,
        num_experts_used=int(config.get("num_experts_per_tok") or 0),
        expert_intermediate_size=int(config.get("moe_intermediate_size") or 0),
        dense_layer_ids=tuple(sorted(dense)),
    )
