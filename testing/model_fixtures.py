"""Tiny random checkpoints of every architecture we serve, built in about a second each, plus a
greedy driver that runs ModelRunner with hand-built ForwardBatches (no scheduler needed).

Other tests import these:

    from testing.model_fixtures import TINY_KINDS, make_tiny_checkpoint, GreedyDriver
    model_dir = make_tiny_checkpoint(tmp_path / "m", "qwen3", with_tokenizer=True)

Kinds: llama (GQA), llama3_rope (Llama-3 rope scaling, short original context so it matters),
llama_tied (tied embeddings), mistral, qwen2 (qkv bias), qwen3 (q/k norm), gpt2, llama_yarn and
llama_dynamic (those RoPE scalings), phi3 (fused qkv/gate_up, longrope), phi4_partial (partial
rotary 0.75); with sliding windows of 8 tokens (shorter than most test prompts): mistral_window
(every layer) and qwen2_window (layers 1 and 2 slide, layer 0 is global); gemma2 (final and
attention logit soft-capping), gemma3 (q/k norm, local and global RoPE, linear scaling on the
global), both with layers 0 and 2 sliding over 8 tokens, and gemma3_mm (gemma3's text model in a
Gemma3ForConditionalGeneration checkpoint); mixture of experts: qwen3_moe, qwen2_moe (shared
expert) and mixtral (top-2 of 8 experts). Options:
`num_shards` > 1 writes model-0000i-of-0000n.safetensors + index; `stored_dtype="bfloat16"`
stores the weights in bf16 (transformers and zserve both load them as fp32 for parity).
Weights are drawn larger than transformers' default init, and norms and biases are random too,
so logits have clear gaps (greedy near-ties would make parity flaky) and a loading bug in any
tensor shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zserve.common.forward_batch import ForwardBatch, SamplingArrays
from zserve.common.server_config import ServerConfig
from zserve.common.server_flags import env_defaults
from zserve.common.start_phases import StartPhases
from zserve.model_proc.model_runner import ModelRunner
from zserve.model_proc.worker_sections import WorkerSections

VOCAB_SIZE = 600  # covers testing.tokenizer_fixtures' byte-level BPE of 600 tokens
EOS_TOKEN_IDS = (2, 0)  # config.json says 2, generation_config.json says [2, 0]

_LLAMA_SIZES = dict(
    vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-5,
)
# Gemma: 4 layers alternating sliding-window (8 tokens, shorter than most test prompts) / global,
# head_dim != hidden / heads, a softmax scale that is not head_dim ** -0.5
_GEMMA_SIZES = dict(
    _LLAMA_SIZES, num_hidden_layers=4, head_dim=24, query_pre_attn_scalar=20, sliding_window=8,
    layer_types=["sliding_attention", "full_attention"] * 2,
)
TINY_KINDS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", dict(_LLAMA_SIZES, rope_theta=10000.0)),
    "llama3_rope": ("LlamaConfig", dict(_LLAMA_SIZES, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=32, rope_theta=500000.0))),
    "llama_tied": ("LlamaConfig", dict(_LLAMA_SIZES, tie_word_embeddings=True, num_key_value_heads=4)),
    "mistral": ("MistralConfig", dict(_LLAMA_SIZES, head_dim=24, sliding_window=None)),
    "qwen2": ("Qwen2Config", dict(_LLAMA_SIZES, num_key_value_heads=1)),
    "qwen3": ("Qwen3Config", dict(_LLAMA_SIZES, head_dim=32)),
    "mistral_window": ("MistralConfig", dict(_LLAMA_SIZES, num_hidden_layers=3, sliding_window=8)),
    "qwen2_window": ("Qwen2Config", dict(_LLAMA_SIZES, num_hidden_layers=3, use_sliding_window=True, sliding_window=8,
                                         max_window_layers=1)),
    "gpt2": ("GPT2Config", dict(vocab_size=VOCAB_SIZE, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                bos_token_id=1, eos_token_id=2)),
    # MoE: top-2 of 8 experts; layer 1 dense (mlp_only_layers); Qwen2-MoE adds a shared expert
    "qwen3_moe": ("Qwen3MoeConfig", dict(_LLAMA_SIZES, head_dim=32, num_hidden_layers=3, num_experts=8,
                                         num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
                                         mlp_only_layers=[1])),
    "qwen2_moe": ("Qwen2MoeConfig", dict(_LLAMA_SIZES, num_experts=8, num_experts_per_tok=2,
                                         moe_intermediate_size=64, shared_expert_intermediate_size=96)),
    "mixtral": ("MixtralConfig", dict(_LLAMA_SIZES, num_local_experts=8, num_experts_per_tok=2)),
    "gemma2": ("Gemma2Config", dict(_GEMMA_SIZES, final_logit_softcapping=8.0, attn_logit_softcapping=2.0)),
    "gemma3": ("Gemma3TextConfig", dict(_GEMMA_SIZES, rope_parameters=dict(
        sliding_attention=dict(rope_type="default", rope_theta=10000.0),
        full_attention=dict(rope_type="linear", factor=2.0, rope_theta=50000.0)))),
    # RoPE scaling past a short original context, so the prompts and decodes of the tests hit it
    "llama_yarn": ("LlamaConfig", dict(_LLAMA_SIZES, max_position_embeddings=128, rope_scaling=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=32, rope_theta=10000.0))),
    "llama_dynamic": ("LlamaConfig", dict(_LLAMA_SIZES, max_position_embeddings=48, rope_scaling=dict(
        rope_type="dynamic", factor=2.0, rope_theta=10000.0))),
    # longrope: short factors up to 48 tokens (prompts of the tests), long past it (their decodes)
    "phi3": ("Phi3Config", dict(_LLAMA_SIZES, original_max_position_embeddings=48, sliding_window=None,
                                pad_token_id=0, rope_scaling=dict(rope_type="longrope", rope_theta=10000.0,
                                short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                                long_factor=[1.0, 1.5, 2.5, 4.0, 6.0, 8.5, 11.0, 14.0]))),
    # Phi-4-mini's partial rotary: 12 of 16 dims rotate (also longrope, as Phi-4-mini)
    "phi4_partial": ("Phi3Config", dict(_LLAMA_SIZES, original_max_position_embeddings=48, sliding_window=None,
                                        pad_token_id=0, partial_rotary_factor=0.75, rope_scaling=dict(
                                            rope_type="longrope", rope_theta=10000.0,
                                            short_factor=[1.0, 1.2, 1.5, 2.0, 2.6, 3.3],
                                            long_factor=[1.0, 2.0, 3.5, 5.5, 8.0, 12.0]))),
}
# Gemma 3 with a (tiny) vision tower: transformers saves the text model under language_model.model.
TINY_KINDS["gemma3_mm"] = ("Gemma3Config", dict(
    text_config=TINY_KINDS["gemma3"][1], mm_tokens_per_image=4, image_token_index=599, boi_token_index=597,
    eoi_token_index=598, vision_config=dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32,
                                            num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8),
))


def make_runner(
    model_dir: str | Path, *, tp_rank: int = 0, start_phases: StartPhases | None = None,
    early_cache_read: Any = None, **overrides: Any
) -> ModelRunner:
    """A ModelRunner with the server's defaults (`ServerConfig()`, with the kernel choices that
    $ZSERVE_GEMM, $ZSERVE_ATTENTION and $ZSERVE_FUSED_OPS set, as launch_server takes them), except
    what the test names (`page_size=4, kv_cache_tokens=512, device="cpu"`, ...); `start_phases`: the
    timeline the runner marks (common/start_phases.py); `early_cache_read`: the worker's early read of
    the packed cache (model_proc/checkpoints/early_cache_read.py)."""
    from_env = {name: value for name, (_, value) in env_defaults().items()}
    cfg = replace(ServerConfig(model=str(model_dir), **from_env), **overrides)
    return runner_of(cfg, tp_rank=tp_rank, start_phases=start_phases, early_cache_read=early_cache_read)


def runner_of(cfg: ServerConfig, *, tp_rank: int = 0, **options: Any) -> ModelRunner:
    """Rank `tp_rank`'s ModelRunner of a whole config, built from its sections as the model worker builds
    it (model_proc/worker_process.py); `options`: ModelRunner's (show_progress, start_phases, ...)."""
    sections = WorkerSections.of(cfg)
    return ModelRunner(sections.model, sections.cache, sections.kernels, sections.place(tp_rank), **options)


def make_tiny_checkpoint(
    target_dir: str | Path,
    kind: str = "llama",
    *,
    seed: int = 0,
    num_shards: int = 1,
    stored_dtype: str = "float32",
    with_tokenizer: bool = False,
    **config_overrides,
) -> Path:
    """Save a random tiny `kind` model to `target_dir` as a Hugging Face directory (safetensors)."""
    import transformers

    if kind not in TINY_KINDS:
        raise ValueError(f"unknown tiny model kind {kind!r}; have {', '.join(TINY_KINDS)}")
    config_name, kwargs = TINY_KINDS[kind]
    config = getattr(transformers, config_name)(**{**kwargs, **config_overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _sharpen(model)
    model.generation_config.eos_token_id = list(EOS_TOKEN_IDS)
    target = Path(target_dir)
    model.to(getattr(torch, stored_dtype))
    if num_shards > 1:
        num_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        model.save_pretrained(target, max_shard_size=f"{num_bytes // num_shards // 1000 + 1}KB")
    else:
        model.save_pretrained(target)
    if with_tokenizer:
        from testing.tokenizer_fixtures import build_byte_level_bpe

        text_config = getattr(config, "text_config", config)  # a multimodal config keeps the vocab there
        build_byte_level_bpe(target, vocab_size=min(VOCAB_SIZE, text_config.vocab_size))
    return target


@torch.no_grad()
def _sharpen(model: torch.nn.Module) -> None:
    # norm weights around 1 (Gemma stores w and scales by 1 + w: around 0 there), biases around 0
    unit_weight = 0.0 if model.config.model_type.startswith("gemma") else 1.0
    for name, p in model.named_parameters():
        if name.endswith(".gate.weight"):  # a MoE router: wide logits, so top-k choices have clear gaps
            p.normal_(0.0, 1.0)
        elif p.dim() >= 2:
            p.normal_(0.0, 0.1 if "wpe" not in name else 0.02)
        elif "norm" in name or ".ln_" in name or "ln_f" in name:
            p.copy_((unit_weight if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
        else:
            p.normal_(0.0, 0.1)


def random_prompt(length: int, seed: int, vocab_size: int = VOCAB_SIZE) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab_size, size=length).tolist()


@dataclass
class Seq:
    """One request as the driver tracks it."""

    prompt: list[int]
    max_new_tokens: int
    chunk_size: int | None = None  # prompt tokens per step; None = whole prompt at once
    kv_source: Seq | None = None  # prefilled with this one's K/V (same prompt, same step; ForwardBatch.kv_source)
    tokens: list[int] = field(init=False)  # prompt + generated
    cached_len: int = 0  # tokens whose K/V are in the pool
    page_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt)

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[len(self.prompt) :]

    @property
    def done(self) -> bool:
        return len(self.output_ids) >= self.max_new_tokens


class GreedyDriver:
    """Greedy generation through a ModelRunner, batches built by hand; pages come from a counter."""

    def __init__(self, runner):
        self.runner = runner
        self.page_size = runner.page_size
        self.next_page = 0
        self.step_id = 0

    def add(
        self, prompt: list[int], max_new_tokens: int, chunk_size: int | None = None, prefix_of: Seq | None = None,
        prefix_len: int = 0, kv_source: Seq | None = None,
    ) -> Seq:
        """A new request; with `prefix_of`, the first `prefix_len` tokens (rounded down to whole
        pages, and leaving at least one token to compute) reuse that earlier request's pages, as
        a prefix-cache hit would. With `kv_source`, its prompt is not computed: it must be stepped
        with that request, in the step that completes both prompts, and takes its K/V and logits."""
        seq = Seq(prompt, max_new_tokens, chunk_size, kv_source)
        if prefix_of is not None:
            assert prompt[:prefix_len] == prefix_of.tokens[:prefix_len] and prefix_len <= prefix_of.cached_len
            num_shared = min(prefix_len, len(prompt) - 1) // self.page_size
            seq.page_ids = prefix_of.page_ids[:num_shared]
            seq.cached_len = num_shared * self.page_size
        return seq

    def _new_pages(self, n: int) -> list[int]:
        ids = list(range(self.next_page, self.next_page + n))
        self.next_page += n
        if self.next_page > self.runner.num_pages_total:
            raise RuntimeError(f"the test's KV pool of {self.runner.num_pages_total} pages is too small")
        return ids

    def build_batch(self, seqs: list[Seq]) -> ForwardBatch:
        input_ids, cached, extend, page_ids, num_pages, sampled, kv_source = [], [], [], [], [], [], []
        for i, seq in enumerate(seqs):
            todo = len(seq.tokens) - seq.cached_len
            n = min(todo, seq.chunk_size) if seq.chunk_size and seq.cached_len < len(seq.prompt) else todo
            need = -(-(seq.cached_len + n) // self.page_size)
            seq.page_ids += self._new_pages(need - len(seq.page_ids))
            if seq.kv_source is not None and seq.cached_len < len(seq.prompt):
                source = next(j for j, s in enumerate(seqs) if s is seq.kv_source)
                assert (seq.cached_len, n) == (cached[source], extend[source]), "a KV-sharing row has its source's cached_len and extend_len"
                kv_source.append(source)
            else:
                kv_source.append(i)
                input_ids += seq.tokens[seq.cached_len : seq.cached_len + n]
            cached.append(seq.cached_len)
            extend.append(n)
            page_ids += seq.page_ids
            num_pages.append(len(seq.page_ids))
            sampled.append(seq.cached_len + n == len(seq.tokens))
        self.step_id += 1
        i32 = lambda xs: np.asarray(xs, np.int32)  # noqa: E731
        return ForwardBatch(
            step_id=self.step_id, input_ids=i32(input_ids), cached_lens=i32(cached), extend_lens=i32(extend),
            page_ids=i32(page_ids), num_pages=i32(num_pages), is_sampled=np.asarray(sampled, bool),
            return_logprob=np.zeros(len(seqs), bool), sampling=SamplingArrays.greedy(len(seqs)),
            kv_source=i32(kv_source) if kv_source != list(range(len(seqs))) else None,
        )

    def step(self, seqs: list[Seq]) -> ForwardBatch:
        """One forward over `seqs` (each contributes its next chunk, or its last token); the batch it ran."""
        batch = self.build_batch(seqs)
        result = self.runner.run(batch)
        for seq, n, sampled, token_id in zip(seqs, batch.extend_lens, batch.is_sampled, result.next_token_ids.tolist(), strict=True):
            seq.cached_len += int(n)
            if sampled:
                seq.tokens.append(token_id)
        return batch

    def generate(self, seqs: list[Seq]) -> list[list[int]]:
        """Step all unfinished seqs together until each has its max_new_tokens."""
        while not all(seq.done for seq in seqs):
            self.step([seq for seq in seqs if not seq.done])
        return [seq.output_ids for seq in seqs]


class HfReference:
    """transformers on the same directory, in `dtype` (fp32 unless told): the oracle for parity tests."""

    def __init__(self, model_dir: str | Path, dtype: torch.dtype = torch.float32, keep_cache: bool = True):
        from transformers import AutoModelForCausalLM, GenerationMixin

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        if keep_cache:
            # Phi-3's generate drops its KV cache and recomputes the whole sequence when it first
            # passes original_max_position_embeddings (longrope); zserve keeps the keys it wrote
            # (rope_frequencies.py), so by default the reference keeps them too
            self.model.prepare_inputs_for_generation = GenerationMixin.prepare_inputs_for_generation.__get__(self.model)
        # generate() merges the model's generation_config into ours: drop its EOS ids there too
        self.model.generation_config.eos_token_id = None

    def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """Greedy `generate` (KV cache on), EOS ignored so every run has max_new_tokens."""
        return self.generate_with_logits(prompt, max_new_tokens)[0]

    @torch.no_grad()
    def generate_with_logits(self, prompt: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
        """`generate`, plus the logits each token was chosen from: float32[max_new_tokens, vocab]."""
        from transformers import GenerationConfig

        config = GenerationConfig(
            do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=None, pad_token_id=0,
            output_logits=True, return_dict_in_generate=True,
        )
        out = self.model.generate(torch.tensor([prompt]), generation_config=config, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
        generated = out.sequences[0, len(prompt) :].tolist()
        assert len(generated) == max_new_tokens, "transformers stopped early"
        return generated, torch.stack(out.logits)[:, 0].float()

    @torch.no_grad()
    def last_logits(self, ids: list[int]) -> torch.Tensor:
        return self.model(torch.tensor([ids])).logits[0, -1].float()


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers (8 significant bits) around x."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0**-133


def first_divergence(ours: list[int], theirs: list[int], their_logits: torch.Tensor, near_tie_ulps: float) -> int | None:
    """Where our greedy tokens first leave transformers' (None: nowhere), allowed only at a
    near-tie of transformers' own logits there: our token's logit less than `near_tie_ulps` bf16
    ulps (of the top logit) below the top one, so the top two are at least that close. Past that
    token the two runs continue different texts, so the rest is not compared. Raises
    AssertionError at any other difference."""
    assert len(ours) == len(theirs) == their_logits.shape[0], (len(ours), len(theirs), their_logits.shape)
    i = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)
    if i is not None:
        top = float(their_logits[i].max())
        gap_ulps = (top - float(their_logits[i, ours[i]])) / bf16_ulp(top)
        assert gap_ulps < near_tie_ulps, (
            f"token {i}: ours {ours[i]}, transformers' {theirs[i]}, {gap_ulps:g} bf16 ulps apart in its logits (near-tie: below {near_tie_ulps})"
        )
    return i
