"""A tiny random model directory with a real tokenizer, for end-to-end tests, and its oracle."""

from __future__ import annotations

from pathlib import Path

import torch

from testing.tokenizer_fixtures import build_byte_level_bpe

VOCAB_SIZE = 600
EOS_ID = 2  # <|im_end|> in the byte-level fixture


def build_tiny_llama_dir(target_dir: Path, context_len: int = 512) -> Path:
    """A 2-layer Llama with GQA, random weights (fixed seed), and the byte-level BPE tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=context_len, eos_token_id=EOS_ID, bos_token_id=1,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper logits than the default init, so greedy near-ties are unlikely
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.save_pretrained(target_dir, safe_serialization=True)
    build_byte_level_bpe(target_dir, vocab_size=VOCAB_SIZE)
    return target_dir


class GreedyOracle:
    """transformers on the same weights: greedy continuation by full recompute (tiny model, so cheap)."""

    def __init__(self, model_dir: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text)["input_ids"]

    def chat_ids(self, messages: list[dict]) -> list[int]:
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))

    @torch.no_grad()
    def greedy(self, input_ids: list[int], max_tokens: int, stop_at_eos: bool = True) -> list[int]:
        ids = list(input_ids)
        out: list[int] = []
        for _ in range(max_tokens):
            logits = self.model(torch.tensor([ids])).logits[0, -1]
            nxt = int(logits.argmax())
            out.append(nxt)
            ids.append(nxt)
            if stop_at_eos and nxt == EOS_ID:
                break
        return out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
