"""Gemma 3 (text): Gemma 2's layout plus a GemmaRMSNorm over head_dim on every q and k head
(before RoPE), and two RoPEs: the sliding-window ("local") layers use `rope_local_theta`
unscaled, the global layers `rope_theta` with the config's scaling. Also the text model of a
Gemma3ForConditionalGeneration checkpoint (gemma2.TEXT_PREFIXES)."""

from __future__ import annotations

import torch

from zserve.common.model_config import ModelConfig
from zserve.model_proc.layers.attention_metadata import AttentionMetadata
from zserve.model_proc.layers.norm import GemmaRMSNorm
from zserve.model_proc.layers.rotary import RotaryEmbedding
from zserve.model_proc.models.gemma2 import Gemma2ForCausalLM
from zserve.model_proc.models.qwen3 import Qwen3Attention


class Gemma3Attention(Qwen3Attention):
    qk_norm_cls = GemmaRMSNorm


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    family = "gemma3"
    attention_cls = Gemma3Attention

    def __init__(self, cfg: ModelConfig, tp_rank: int = 0, tp_size: int = 1):
        super().__init__(cfg, tp_rank, tp_size)
        assert len(cfg.local_layers) == cfg.num_layers and cfg.rope_local_theta is not None, cfg
        self.local_layers = cfg.local_layers
        self.local_rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_local_theta, None)

    def rotaries(self, meta: AttentionMetadata, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
        global_rope = self.rotary(meta.positions, dtype, meta.seq_lens_by_token)
        local_rope = self.local_rotary(meta.positions, dtype)
        return [local_rope if local else global_rope for local in self.local_layers]
