"""What zserve needs from a Hugging Face model directory's config.json, read without torch.

The scheduler and tokenizer processes import this to learn the context length and EOS ids
cheaply; the model worker builds its model from it. Parsing is the same for every architecture:
what differs is read from its spec (common/architectures/); RoPE from either spelling
(common/architectures/rope_config.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zserve.common.architectures import HF_ARCHITECTURES, spec_for_hf
from zserve.common.architectures.arch_spec import ArchSpec
from zserve.common.architectures.config_field import config_field
from zserve.common.architectures.decoder_fields import decoder_fields
from zserve.common.architectures.layer_windows import layer_windows
from zserve.common.architectures.rope_config import RopeScaling
from zserve.common.checkpoint_quantization import quantization_refusal
from zserve.common.feature_refusal import feature_refusal
from zserve.common.moe_config import MoeConfig


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model_dir: str
    architecture: str  # e.g. "LlamaForCausalLM"
    family: str  # the spec's `model`: which model class runs it ("llama", "qwen3", "gpt2", ...)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context_len: int  # max positions the model can attend over (config.json's; sliding windows do not cap it)
    norm_eps: float
    hidden_act: str  # "silu" | "gelu_new" | ...
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k
    rope_theta: float | None  # None: learned absolute positions (GPT-2)
    rope_scaling: RopeScaling | None
    attn_scale: float  # softmax scale for layer 0
    attn_scale_by_layer: bool  # GPT-2 scale_attn_by_inverse_layer_idx: layer i divides by (i + 1)
    eos_token_ids: tuple[int, ...]  # union of config.json and generation_config.json
    bos_token_id: int | None
    stored_dtype: str | None  # "bfloat16", "float32"... as config.json says; weights are cast at load
    # generation_config.json's sampling, when it samples (do_sample)
    default_sampling: tuple[tuple[str, float], ...] = ()
    # one per layer: its sliding window in tokens, 0 = full causal attention (common/architectures/layer_windows.py);
    # every page stays in the KV cache, so windows change what attention reads, not the KV accounting
    layer_windows: tuple[int, ...] = ()
    attn_logit_softcap: float = 0.0  # config.json attn_logit_softcapping (Gemma 2); 0: none
    moe: MoeConfig | None = None  # mixture-of-experts settings (Qwen3-MoE, Qwen2-MoE, Mixtral)
    # Gemma 2/3 (common/architectures/gemma_text.py)
    final_logit_softcap: float = 0.0  # logits = cap * tanh(logits / cap); 0: off
    local_layers: tuple[bool, ...] = ()  # per layer: a sliding-window ("local") layer; () for other families
    rope_local_theta: float | None = None  # Gemma 3: the local layers' RoPE base (unscaled); None: rope_theta
    # Phi-4-mini: only the first head_dim * partial_rotary_factor dims of each head rotate
    partial_rotary_factor: float = 1.0
    gated_mlp: bool = True  # gate * act(up) (three matrices); False: GPT-2's act(fc) (two)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)  # int(), as transformers truncates

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_params(self) -> int:
        """Approximate parameter count (weights of linears and embeddings, every expert), for progress and sizing."""
        return self._count_params(active_only=False)

    @property
    def num_active_params(self) -> int:
        """Parameters one token's forward multiplies by: a MoE layer counts only its top-k experts."""
        return self._count_params(active_only=True)

    def _count_params(self, active_only: bool) -> int:
        attn = self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
        dense_mlp = (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        mlp = sum(
            self.moe.sparse_mlp_params(self.hidden_size, active_only)
            if self.moe is not None and self.moe.is_sparse_layer(i) else dense_mlp
            for i in range(self.num_layers)
        )
        return self.num_layers * attn + mlp + embed

    @staticmethod
    def from_model_dir(model_dir: str | Path) -> ModelConfig:
        """Read config.json (+ generation_config.json if present). Raises FileNotFoundError or
        ValueError naming the file and the problem."""
        root = Path(model_dir)
        if not root.is_dir():
            raise FileNotFoundError(f"model directory {str(root)!r} does not exist or is not a directory")
        path = root / "config.json"
        raw = _read_json(path, required=True)
        gen = _read_json(root / "generation_config.json", required=False) or {}
        return _parse(raw, gen, str(root), path)


def _read_json(path: Path, required: bool) -> dict[str, Any] | None:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} not found: a Hugging Face model directory needs a config.json")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _parse(raw: dict[str, Any], gen: dict[str, Any], model_dir: str, path: Path) -> ModelConfig:
    """config.json through its architecture's spec (common/architectures/): flatten, refuse what no
    code runs, the core fields, then what every spec reads the same way, then the spec's extra fields."""
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ValueError(f"{path}: 'architectures' must be a non-empty list of names, got {archs!r}")
    arch = archs[0]
    spec = spec_for_hf(arch)
    if spec is None:
        raise ValueError(f"{path}: architecture {arch!r} is not supported; supported: {', '.join(HF_ARCHITECTURES)}")
    refusal = quantization_refusal(raw, path)
    if refusal is not None:
        raise ValueError(refusal)
    if spec.text_config is not None:  # the refusal below then sees a multimodal checkpoint's text_config
        raw = spec.text_config(raw, path)
    refusal = feature_refusal(raw, arch, gated_mlp=spec.gated_mlp, path=path)
    if refusal is not None:
        raise ValueError(refusal)
    core = spec.core_fields(raw, path) if spec.core_fields is not None else decoder_fields(spec, raw, path)
    if core["num_heads"] % core["num_kv_heads"]:
        raise ValueError(
            f"{path}: num_attention_heads={core['num_heads']} is not a multiple of "
            f"num_key_value_heads={core['num_kv_heads']}"
        )
    num_layers = core["num_layers"]
    fields = dict(
        core,
        model_dir=model_dir,
        architecture=arch,
        family=spec.model,
        vocab_size=config_field(raw, path, ("vocab_size",), ..., int),
        eos_token_ids=_eos_ids(raw, gen, path),
        default_sampling=_default_sampling(gen),
        bos_token_id=raw.get("bos_token_id") if isinstance(raw.get("bos_token_id"), int) else None,
        stored_dtype=raw.get("torch_dtype") or raw.get("dtype"),
        layer_windows=layer_windows(spec.windows, raw, num_layers, path),
        attn_logit_softcap=_attn_softcap(spec, raw, path),
        moe=MoeConfig.from_config(raw, spec.moe, path),
        gated_mlp=spec.gated_mlp,
    )
    if spec.extra_fields is not None:
        fields.update(spec.extra_fields(raw, num_layers, path))
    return ModelConfig(**fields)


def _attn_softcap(spec: ArchSpec, raw: dict[str, Any], path: Path) -> float:
    """config.json's attn_logit_softcapping where the architecture's attention applies it (Gemma 2); else 0."""
    if not spec.reads_attn_softcap:
        return 0.0
    return config_field(raw, path, ("attn_logit_softcapping",), 0.0, float)


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")


def _default_sampling(gen: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """The sampling generation_config.json asks for, as transformers reads it: only with
    `do_sample: true` (else generation is greedy whatever the temperature), temperature 1 unless
    given; values that are not numbers are ignored."""
    if gen.get("do_sample") is not True:
        return ()
    values = {"temperature": 1.0}
    for key in SAMPLING_KEYS:
        value = gen.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values[key] = int(value) if key == "top_k" else float(value)
    return tuple(sorted(values.items()))


def _eos_ids(raw: dict[str, Any], gen: dict[str, Any], path: Path) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (raw, gen):
        value = source.get("eos_token_id")
        for token_id in value if isinstance(value, list) else [value]:
            if token_id is None:
                continue
            if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
                raise ValueError(f"{path.parent}: eos_token_id must be non-negative integers, got {value!r}")
            if token_id not in ids:
                ids.append(token_id)
    return tuple(ids)
