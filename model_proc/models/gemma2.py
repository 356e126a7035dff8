"""Gemma 2: the Llama layout with a norm after each sublayer as well as before it.

    x = embed(ids) * sqrt(hidden)          (the scale rounded to the compute dtype first)
    for each layer:  x = x + post_attn_norm(attn(input_norm(x)))
                     x = x + post_ff_norm(geglu_mlp(pre_ff_norm(x)))
    logits = softcap(lm_head(norm(x)))     softcap(l) = cap * tanh(l / cap)

Every norm is GemmaRMSNorm (x / rms(x) * (1 + w) in fp32); the softmax scale is
query_pre_attn_scalar ** -0.5 (ModelConfig.attn_scale); the embedding is tied.
"""

from __future__ import annotations

import torch
from torch import nn

from zserve.common.model_config import ModelConfig
from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.layers.attention_metadata import AttentionMetadata
from zserve.model_proc.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from zserve.model_proc.layers.norm import GemmaRMSNorm
from zserve.model_proc.layers.rotary import RotaryEmbedding
from zserve.model_proc.models.llama import LlamaAttention, LlamaMLP

# where the decoder's weights live: a Gemma*ForCausalLM checkpoint, then a Gemma 3 multimodal
# one as transformers 5 saves it and as transformers 4 did (the hub's gemma-3-*-it)
TEXT_PREFIXES = ("model.", "model.language_model.", "language_model.model.")


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: nn.Module, tp_rank: int, tp_size: int):
        super().__init__()
        dim, eps = cfg.hidden_size, cfg.norm_eps
        self.input_layernorm = GemmaRMSNorm(dim, eps)
        self.self_attn = attention
        self.post_attention_layernorm = GemmaRMSNorm(dim, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(dim, eps)
        self.mlp = LlamaMLP(cfg, tp_rank, tp_size)  # gate/up/down with the gated gelu_tanh
        self.post_feedforward_layernorm = GemmaRMSNorm(dim, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> None:
        """x: the residual stream [T, hidden], updated in place."""
        x.add_(self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, meta)))
        x.add_(self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x))))

    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            getattr(self, name).load(ckpt, f"{prefix}.{name}.weight")
        self.self_attn.load(ckpt, f"{prefix}.self_attn")
        self.mlp.load(ckpt, f"{prefix}.mlp")


class Gemma2ForCausalLM(nn.Module):
    family = "gemma2"
    attention_cls: type[LlamaAttention] = LlamaAttention

    def __init__(self, cfg: ModelConfig, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        assert cfg.rope_theta is not None, "Gemma uses rotary positions"
        self.hidden_size, self.final_logit_softcap = cfg.hidden_size, cfg.final_logit_softcap
        self.tie_word_embeddings = cfg.tie_word_embeddings
        self.embed_tokens = VocabParallelEmbedding(
            cfg.vocab_size, cfg.hidden_size, tp_rank, tp_size, transposed=cfg.tie_word_embeddings
        )
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(cfg, self.attention_cls(cfg, i, tp_rank, tp_size), tp_rank, tp_size)
            for i in range(cfg.num_layers)
        )
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.norm_eps)
        tied_to = self.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp_rank, tp_size, tied_to=tied_to)

    def rotaries(self, meta: AttentionMetadata, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) for each layer; Gemma 2 has one RoPE for all."""
        return [self.rotary(meta.positions, dtype, meta.seq_lens_by_token)] * len(self.layers)

    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids int64[T] -> hidden states [T, hidden] (before the final norm)"""
        embedded = self.embed_tokens(input_ids)
        # transformers keeps sqrt(hidden) as an fp32 tensor and casts it to the weights' dtype
        x = embedded * torch.tensor(self.hidden_size**0.5, dtype=torch.float32).to(embedded.dtype)
        for layer, (cos, sin) in zip(self.layers, self.rotaries(meta, x.dtype), strict=True):
            layer(x, cos, sin, meta)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(hidden))  # [n, hidden] -> float32[n, vocab]
        if not self.final_logit_softcap:
            return logits
        # in the compute dtype, as transformers caps its bf16 logits (the head rounded them to it already)
        cap, rounded = self.final_logit_softcap, logits.to(hidden.dtype)
        return (torch.tanh(rounded / cap) * cap).float()

    def load(self, ckpt: Checkpoint) -> None:
        prefix = next((p for p in TEXT_PREFIXES if ckpt.has(f"{p}embed_tokens.weight")), None)
        if prefix is None:
            names = " or ".join(f"{p}embed_tokens.weight" for p in TEXT_PREFIXES)
            raise ValueError(f"no token embedding in the checkpoint: expected {names}")
        self.embed_tokens.load(ckpt, f"{prefix}embed_tokens.weight")
        for i, layer in enumerate(self.layers):
            layer.load(ckpt, f"{prefix}layers.{i}")
        self.norm.load(ckpt, f"{prefix}norm.weight")
        head = "language_model.lm_head.weight" if prefix == "language_model.model." else "lm_head.weight"
        self.lm_head.load(ckpt, head)
