"""Llama family: Llama 2/3, SmolLM2, Mistral (dense) and Qwen2 (the same with q/k/v bias).

    x = embed(ids)
    for each layer:  x = x + attn(rms_norm(x));  x = x + mlp(rms_norm(x))
                     (each add done by the norm after it: RMSNorm.add_norm)
    logits = lm_head(rms_norm(x))          (only at the rows the runner asks for)
"""

from __future__ import annotations

import torch
from torch import nn

from zserve.common.model_config import ModelConfig
from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.layers.activation import FUSED_GATED_ACTIVATIONS, get_activation
from zserve.model_proc.layers.attention import PagedAttention
from zserve.model_proc.layers.attention_metadata import AttentionMetadata
from zserve.model_proc.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from zserve.model_proc.layers.linear import ColumnParallelLinear, RowParallelLinear
from zserve.model_proc.layers.norm import RMSNorm
from zserve.model_proc.layers.rotary import RotaryEmbedding


def heads_per_rank(cfg: ModelConfig, tp_size: int) -> tuple[int, int]:
    if cfg.num_heads % tp_size or cfg.num_kv_heads % tp_size:
        raise ValueError(
            f"{cfg.num_heads} attention heads / {cfg.num_kv_heads} KV heads do not split across "
            f"{tp_size} tensor-parallel ranks"
        )
    return cfg.num_heads // tp_size, cfg.num_kv_heads // tp_size


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp_rank: int, tp_size: int):
        super().__init__()
        self.num_heads, self.num_kv_heads = heads_per_rank(cfg, tp_size)
        self.head_dim = cfg.head_dim
        qkv_sizes = [cfg.q_size, cfg.kv_size, cfg.kv_size]
        self.qkv_proj = ColumnParallelLinear(cfg.hidden_size, qkv_sizes, cfg.qkv_bias, tp_rank, tp_size)
        self.o_proj = RowParallelLinear(cfg.q_size, cfg.hidden_size, cfg.o_bias, tp_rank, tp_size)
        self.attn = PagedAttention(
            self.num_heads, self.num_kv_heads, cfg.head_dim, cfg.attn_scale, layer_idx,
            sliding_window=cfg.layer_windows[layer_idx], logit_softcap=cfg.attn_logit_softcap,
        )  # fmt: skip
        # LoRA adapters' updates of the projections (model_proc/lora/); None: no adapter targets them
        self.qkv_lora: nn.Module | None = None
        self.o_lora: nn.Module | None = None

    def norm_qk(self, qk: torch.Tensor) -> torch.Tensor:
        return qk  # Qwen3 normalises q and k here

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        T, h, kvh = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x)
        if self.qkv_lora is not None:
            qkv = self.qkv_lora(qkv, x)
        qkv = qkv.view(T, h + 2 * kvh, self.head_dim)  # heads: [q x h | k x kvh | v x kvh]
        out = self.attn.forward_rotary(self.norm_qk(qkv[:, : h + kvh]), qkv[:, h + kvh :], cos, sin, meta)  # [T, h * d]
        return self.o_proj(out) if self.o_lora is None else self.o_lora(self.o_proj(out), out)

    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        self.qkv_proj.load(ckpt, [f"{prefix}.q_proj", f"{prefix}.k_proj", f"{prefix}.v_proj"])
        self.o_proj.load(ckpt, f"{prefix}.o_proj")


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp_rank: int, tp_size: int):
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [size, size], cfg.mlp_bias, tp_rank, tp_size)
        self.down_proj = RowParallelLinear(size, cfg.hidden_size, cfg.mlp_bias, tp_rank, tp_size)
        self.hidden_act = cfg.hidden_act
        self.act = get_activation(cfg.hidden_act, gated=True)
        self.gate_up_lora: nn.Module | None = None  # LoRA adapters' updates (model_proc/lora/); None: none
        self.down_lora: nn.Module | None = None

    def use_cpu_kernels(self) -> None:
        self.act = FUSED_GATED_ACTIVATIONS.get(self.hidden_act, self.act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_lora is None and self.down_lora is None:
            return self.down_proj(self.act(self.gate_up_proj(x)))  # [T, hidden] -> [T, 2I / tp] -> [T, hidden]
        gate_up = self.gate_up_proj(x)
        hidden = self.act(gate_up if self.gate_up_lora is None else self.gate_up_lora(gate_up, x))
        return self.down_proj(hidden) if self.down_lora is None else self.down_lora(self.down_proj(hidden), hidden)

    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        self.gate_up_proj.load(ckpt, [f"{prefix}.gate_proj", f"{prefix}.up_proj"])
        self.down_proj.load(ckpt, f"{prefix}.down_proj")


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, attention: nn.Module, tp_rank: int, tp_size: int, mlp: nn.Module | None = None
    ):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.self_attn = attention
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.mlp = mlp if mlp is not None else LlamaMLP(cfg, tp_rank, tp_size)  # a MoE layer passes its own

    def forward(
        self, x: torch.Tensor, delta: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """x: the residual stream, updated in place; delta: the previous layer's MLP output, not
        yet added (None at the first layer), so each add fuses into the norm after it.
        Returns this layer's MLP output (the next delta)."""
        attn_out = self.self_attn(self.input_layernorm.add_norm(delta, x), cos, sin, meta)
        return self.mlp(self.post_attention_layernorm.add_norm(attn_out, x))

    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        self.input_layernorm.load(ckpt, f"{prefix}.input_layernorm.weight")
        self.self_attn.load(ckpt, f"{prefix}.self_attn")
        self.post_attention_layernorm.load(ckpt, f"{prefix}.post_attention_layernorm.weight")
        self.mlp.load(ckpt, f"{prefix}.mlp")


class LlamaForCausalLM(nn.Module):
    family = "llama"  # the ArchSpec.model this class runs (common/architectures/; registry.py collects it)
    attention_cls: type[LlamaAttention] = LlamaAttention

    def __init__(self, cfg: ModelConfig, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        assert cfg.rope_theta is not None, "the Llama family uses rotary positions"
        self.embed_tokens = VocabParallelEmbedding(
            cfg.vocab_size, cfg.hidden_size, tp_rank, tp_size, transposed=cfg.tie_word_embeddings
        )
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.rotary_dim)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(
                cfg, self.attention_cls(cfg, i, tp_rank, tp_size), tp_rank, tp_size,
                mlp=self.make_mlp(cfg, i, tp_rank, tp_size),
            )
            for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        tied_to = self.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp_rank, tp_size, tied_to=tied_to)

    def make_mlp(self, cfg: ModelConfig, layer_idx: int, tp_rank: int, tp_size: int) -> nn.Module | None:
        """Layer `layer_idx`'s MLP, or None for the dense LlamaMLP (the MoE families override this)."""
        return None

    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids int64[T] -> hidden states [T, hidden] (before the final norm)"""
        x = self.embed_tokens(input_ids)  # a fresh tensor: the layers add to it in place
        cos, sin = self.rotary(meta.positions, x.dtype, meta.seq_lens_by_token)
        delta = None
        for layer in self.layers:
            delta = layer(x, delta, cos, sin, meta)
        return x.add_(delta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))  # [n, hidden] -> float32[n, vocab]

    def load(self, ckpt: Checkpoint) -> None:
        self.embed_tokens.load(ckpt, "model.embed_tokens.weight")
        for i, layer in enumerate(self.layers):
            layer.load(ckpt, f"model.layers.{i}")
        self.norm.load(ckpt, "model.norm.weight")
        self.lm_head.load(ckpt, "lm_head.weight")
