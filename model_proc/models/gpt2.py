"""GPT-2: learned absolute positions, LayerNorm, fused c_attn, gelu MLP, LM head tied to wte.

Checkpoint weights are Conv1D ([in, out]); they are transposed to [out, in] as they are read.

    x = wte(ids) + wpe(positions)
    for each block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
    logits = ln_f(x) @ wte.T
"""

from __future__ import annotations

import torch
from torch import nn

from zserve.common.model_config import ModelConfig
from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.layers.activation import get_activation
from zserve.model_proc.layers.attention import PagedAttention
from zserve.model_proc.layers.attention_metadata import AttentionMetadata
from zserve.model_proc.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from zserve.model_proc.layers.linear import ColumnParallelLinear, RowParallelLinear
from zserve.model_proc.layers.norm import LayerNorm
from zserve.model_proc.models.llama import heads_per_rank


class GPT2Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp_rank: int, tp_size: int):
        super().__init__()
        self.num_heads, _ = heads_per_rank(cfg, tp_size)
        self.head_dim = cfg.head_dim
        hidden = cfg.hidden_size
        self.c_attn = ColumnParallelLinear(hidden, [hidden, hidden, hidden], True, tp_rank, tp_size)
        self.c_proj = RowParallelLinear(hidden, hidden, True, tp_rank, tp_size)
        scale = cfg.attn_scale / (layer_idx + 1) if cfg.attn_scale_by_layer else cfg.attn_scale
        self.attn = PagedAttention(self.num_heads, self.num_heads, cfg.head_dim, scale, layer_idx)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.c_attn(x).view(x.shape[0], 3, self.num_heads, self.head_dim)  # [T, q|k|v, h, d]
        return self.c_proj(self.attn(qkv[:, 0], qkv[:, 1], qkv[:, 2], meta))

    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        self.c_attn.load(ckpt, [f"{prefix}.c_attn"], transpose=True)
        self.c_proj.load(ckpt, f"{prefix}.c_proj", transpose=True)


class GPT2MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp_rank: int, tp_size: int):
        super().__init__()
        self.c_fc = ColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size], True, tp_rank, tp_size)
        self.c_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, True, tp_rank, tp_size)
        self.act = get_activation(cfg.hidden_act, gated=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))

    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        self.c_fc.load(ckpt, [f"{prefix}.c_fc"], transpose=True)
        self.c_proj.load(ckpt, f"{prefix}.c_proj", transpose=True)


class GPT2Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp_rank: int, tp_size: int):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.hidden_size, cfg.norm_eps)
        self.attn = GPT2Attention(cfg, layer_idx, tp_rank, tp_size)
        self.ln_2 = LayerNorm(cfg.hidden_size, cfg.norm_eps)
        self.mlp = GPT2MLP(cfg, tp_rank, tp_size)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), meta)
        return x + self.mlp(self.ln_2(x))

    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        self.ln_1.load(ckpt, f"{prefix}.ln_1")
        self.attn.load(ckpt, f"{prefix}.attn")
        self.ln_2.load(ckpt, f"{prefix}.ln_2")
        self.mlp.load(ckpt, f"{prefix}.mlp")


class GPT2LMHeadModel(nn.Module):
    family = "gpt2"
    def __init__(self, cfg: ModelConfig, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.wte = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp_rank, tp_size, transposed=True)  # tied
        self.wpe = VocabParallelEmbedding(cfg.context_len, cfg.hidden_size)  # small: replicated on every rank
        self.h = nn.ModuleList(GPT2Block(cfg, i, tp_rank, tp_size) for i in range(cfg.num_layers))
        self.ln_f = LayerNorm(cfg.hidden_size, cfg.norm_eps)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp_rank, tp_size, tied_to=self.wte)

    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids int64[T] -> hidden states [T, hidden] (before ln_f)"""
        x = self.wte(input_ids) + self.wpe(meta.positions)
        for block in self.h:
            x = block(x, meta)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(hidden))  # [n, hidden] -> float32[n, vocab]

    def load(self, ckpt: Checkpoint) -> None:
        # transformers saves "transformer.h.0..."; the original OpenAI conversion has no prefix
        prefix = "transformer." if ckpt.has("transformer.wte.weight") else ""
        self.wte.load(ckpt, f"{prefix}wte.weight")
        self.wpe.load(ckpt, f"{prefix}wpe.weight")
        for i, block in enumerate(self.h):
            block.load(ckpt, f"{prefix}h.{i}")
        self.ln_f.load(ckpt, f"{prefix}ln_f")
