"""What zserve needs from a Hugging Face model directory's config.json, read without torch.

The scheduler and tokenizer processes import this to learn the context length and EOS ids
cheaply; the model worker builds its model from it. Both spellings of RoPE settings are read:
the older top-level `rope_theta` + `rope_scaling`, and transformers 5's `rope_parameters`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zserve.common.checkpoint_quantization import quantization_refusal
from zserve.common.feature_refusal import feature_refusal
from zserve.common.gemma_config import GEMMA_FAMILIES, gemma_fields, gemma_text_config
from zserve.common.layer_windows import layer_windows_for
from zserve.common.moe_config import MoeConfig

# architecture (config.json "architectures"[0]) -> model family our code implements
ARCH_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "GPT2LMHeadModel": "gpt2",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "MixtralForCausalLM": "mixtral",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # its text model; the vision tower is not loaded
    "Phi3ForCausalLM": "phi3",
}
# architectures whose transformers attention reads config.json's attn_logit_softcapping
LOGIT_SOFTCAP_ARCHS = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
# rope_parameters keys each type reads (besides rope_type, rope_theta, factor, partial_rotary_factor); others refused
ROPE_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": (),
    "llama3": ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": (
        "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
        "truncate",
    ),
    "dynamic": (),
    "longrope": ("original_max_position_embeddings", "attention_factor", "short_factor", "long_factor"),
}
DEFAULT_ROPE_THETA = 10_000.0


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE frequency scaling, as transformers' modeling_rope_utils reads it: `rope_type` is "linear",
    "llama3" (Llama 3.1), "yarn", "dynamic" (NTK-aware, base grown with the sequence length) or
    "longrope" (Phi-3: per-frequency short/long factors). model_proc/layers/rope_frequencies.py
    computes the frequencies."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    max_position_embeddings: int = 8192  # config.json's: "dynamic" grows the base past it
    attention_factor: float | None = None  # yarn / longrope: multiplies cos and sin; None: from `factor`
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0  # yarn: 0 means unset, as transformers tests it (`if mscale and mscale_all_dim`)
    mscale_all_dim: float = 0.0
    truncate: bool = True
    short_factor: tuple[float, ...] = ()  # longrope: one per rotary frequency
    long_factor: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model_dir: str
    architecture: str  # e.g. "LlamaForCausalLM"
    family: str  # "llama" | "qwen3" | "gpt2"
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
    # one per layer: its sliding window in tokens, 0 = full causal attention (common/layer_windows.py);
    # every page stays in the KV cache, so windows change what attention reads, not the KV accounting
    layer_windows: tuple[int, ...] = ()
    attn_logit_softcap: float = 0.0  # config.json attn_logit_softcapping (Gemma 2); 0: none
    moe: MoeConfig | None = None  # mixture-of-experts settings (Qwen3-MoE, Qwen2-MoE, Mixtral)
    # Gemma 2/3 (common/gemma_config.py)
    final_logit_softcap: float = 0.0  # logits = cap * tanh(logits / cap); 0: off
    local_layers: tuple[bool, ...] = ()  # per layer: a sliding-window ("local") layer; () for other families
    rope_local_theta: float | None = None  # Gemma 3: the local layers' RoPE base (unscaled); None: rope_theta
    # Phi-4-mini: only the first head_dim * partial_rotary_factor dims of each head rotate
    partial_rotary_factor: float = 1.0

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
        dense_mlp = (2 if self.family == "gpt2" else 3) * self.hidden_size * self.intermediate_size
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
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ValueError(f"{path}: 'architectures' must be a non-empty list of names, got {archs!r}")
    arch = archs[0]
    if arch not in ARCH_FAMILIES:
        raise ValueError(f"{path}: architecture {arch!r} is not supported; supported: {', '.join(ARCH_FAMILIES)}")
    refusal = quantization_refusal(raw, path)
    if refusal is not None:
        raise ValueError(refusal)
    family = ARCH_FAMILIES[arch]
    if family in GEMMA_FAMILIES:  # the refusal below then sees a multimodal checkpoint's text_config
        raw = gemma_text_config(raw, family, path)
    refusal = feature_refusal(raw, arch, gated_mlp=family != "gpt2", path=path)
    if refusal is not None:
        raise ValueError(refusal)

    def get(*keys: str, default: Any = ..., kind: type = int) -> Any:
        return _field(raw, path, keys, default, kind)

    if family == "gpt2":
        hidden = get("n_embd", "hidden_size")
        num_heads = get("n_head", "num_attention_heads")
        num_kv_heads = num_heads
        intermediate = get("n_inner", default=4 * hidden)
        num_layers = get("n_layer", "num_hidden_layers")
        context_len = get("n_positions", "max_position_embeddings")
        norm_eps = get("layer_norm_epsilon", default=1e-5, kind=float)
        hidden_act = get("activation_function", default="gelu_new", kind=str)
        head_dim = hidden // num_heads
        tie, qkv_bias, o_bias, mlp_bias, qk_norm = True, True, True, True, False
        rope_theta, rope_scaling = None, None
        partial_rotary_factor = 1.0
        attn_scale = head_dim**-0.5 if raw.get("scale_attn_weights", True) else 1.0
        attn_scale_by_layer = bool(raw.get("scale_attn_by_inverse_layer_idx", False))
    else:
        hidden = get("hidden_size")
        num_heads = get("num_attention_heads")
        num_kv_heads = get("num_key_value_heads", default=num_heads)
        intermediate = get("intermediate_size")
        num_layers = get("num_hidden_layers")
        context_len = get("max_position_embeddings")
        norm_eps = get("rms_norm_eps", default=1e-6, kind=float)
        hidden_act = get("hidden_act", default="silu", kind=str)
        head_dim = get("head_dim", default=128 if family in ("qwen3", "qwen3_moe") else hidden // num_heads)
        tie = bool(raw.get("tie_word_embeddings", False))
        attention_bias = bool(raw.get("attention_bias", False))
        qkv_bias = True if arch == "Qwen2ForCausalLM" else attention_bias
        if arch == "Qwen2MoeForCausalLM":
            qkv_bias = bool(raw.get("qkv_bias", True))
        o_bias = False if arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM") else attention_bias
        mlp_bias = bool(raw.get("mlp_bias", False))
        qk_norm = family in ("qwen3", "qwen3_moe")
        rope_theta, rope_scaling = _parse_rope(raw, path)
        partial_rotary_factor = _partial_rotary_factor(raw, path, head_dim)
        if rope_scaling is not None and rope_scaling.rope_type in ("yarn", "dynamic"):
            # as vLLM: these scale the context past the maximum they were trained at
            context_len = max(context_len, int(_extended_len(rope_scaling)))
        attn_scale = head_dim**-0.5
        attn_scale_by_layer = False
    if num_heads % num_kv_heads:
        raise ValueError(
            f"{path}: num_attention_heads={num_heads} is not a multiple of num_key_value_heads={num_kv_heads}"
        )
    vocab_size = get("vocab_size")
    softcap = get("attn_logit_softcapping", default=0.0, kind=float) if arch in LOGIT_SOFTCAP_ARCHS else 0.0
    cfg = ModelConfig(
        model_dir=model_dir,
        architecture=arch,
        family=family,
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        context_len=context_len,
        norm_eps=norm_eps,
        hidden_act=hidden_act,
        tie_word_embeddings=tie,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        qk_norm=qk_norm,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        attn_scale=attn_scale,
        attn_scale_by_layer=attn_scale_by_layer,
        eos_token_ids=_eos_ids(raw, gen, path),
        default_sampling=_default_sampling(gen),
        bos_token_id=raw.get("bos_token_id") if isinstance(raw.get("bos_token_id"), int) else None,
        stored_dtype=raw.get("torch_dtype") or raw.get("dtype"),
        layer_windows=layer_windows_for(arch, raw, num_layers, path),
        attn_logit_softcap=softcap,
        moe=MoeConfig.from_config(raw, arch, path),
        partial_rotary_factor=partial_rotary_factor,
    )
    if family in GEMMA_FAMILIES:
        return replace(cfg, **gemma_fields(raw, family, num_layers, path))
    return cfg


def _field(raw: dict[str, Any], path: Path, keys: tuple[str, ...], default: Any, kind: type) -> Any:
    """The first of `keys` present (and not null) in config.json, checked to be of `kind`."""
    for key in keys:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
            raise ValueError(f"{path}: {key!r} must be {kind.__name__}, got {value!r}")
        return kind(value)
    if default is ...:
        raise ValueError(f"{path}: missing {' / '.join(repr(k) for k in keys)}")
    return default


def _parse_rope(raw: dict[str, Any], path: Path) -> tuple[float, RopeScaling | None]:
    """theta and scaling from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`.
    Keys a rope type does not read, and types we do not implement, are refused, never ignored."""
    params = _rope_params(raw, path)
    theta = float(params.get("rope_theta", raw.get("rope_theta", DEFAULT_ROPE_THETA)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    is_phi3 = raw.get("architectures", [None])[0] == "Phi3ForCausalLM"
    if is_phi3 and rope_type in ("su", "yarn"):
        rope_type = "longrope"  # what transformers' Phi3Config reads these old names as
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{path}: rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    known = {"rope_type", "type", "rope_theta", "factor", "partial_rotary_factor", *ROPE_KEYS[rope_type]}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"{path}: rope type {rope_type!r} with {', '.join(unknown)} is not supported")
    if rope_type == "default":
        return theta, None
    max_len = _field(raw, path, ("max_position_embeddings",), 8192, int)
    # transformers: a top-level original_max_position_embeddings (Phi-3 always has one, 4096 by
    # default) wins over the one in rope_parameters, which wins over max_position_embeddings
    original_max_len = raw.get("original_max_position_embeddings", 4096 if is_phi3 else None)
    original_max_len = int(original_max_len or params.get("original_max_position_embeddings") or max_len)
    if rope_type == "longrope":
        factor = float(params.get("factor") or max_len / original_max_len)
    elif "factor" not in params:
        raise ValueError(f"{path}: rope type {rope_type!r} needs a 'factor'")
    else:
        factor = float(params["factor"])
    attention_factor = params.get("attention_factor")
    scaling = RopeScaling(
        rope_type=rope_type,
        factor=factor,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original_max_len,
        max_position_embeddings=max_len,
        attention_factor=None if attention_factor is None else float(attention_factor),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=float(params.get("mscale") or 0.0),
        mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
        truncate=bool(params.get("truncate", True)),
        short_factor=_factor_list(params, "short_factor", path),
        long_factor=_factor_list(params, "long_factor", path),
    )
    if rope_type == "longrope" and not (scaling.short_factor and scaling.long_factor):
        raise ValueError(f"{path}: rope type 'longrope' needs 'short_factor' and 'long_factor'")
    return theta, scaling


def _extended_len(scaling: RopeScaling) -> float:
    if scaling.rope_type == "yarn":
        return scaling.original_max_position_embeddings * scaling.factor
    return scaling.max_position_embeddings * scaling.factor


def _rope_params(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    params = raw.get("rope_parameters")
    if params is None:
        params = dict(raw.get("rope_scaling") or {})
        params.setdefault("rope_theta", raw.get("rope_theta", DEFAULT_ROPE_THETA))
    if not isinstance(params, dict):
        raise ValueError(f"{path}: 'rope_parameters' must be an object, got {params!r}")
    return params


def _factor_list(params: dict[str, Any], key: str, path: Path) -> tuple[float, ...]:
    value = params.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) for v in value):
        raise ValueError(f"{path}: rope {key!r} must be a list of numbers, got {value!r}")
    return tuple(float(v) for v in value)


def _partial_rotary_factor(raw: dict[str, Any], path: Path, head_dim: int) -> float:
    """The fraction of each head that rotates (Phi-4-mini: 0.75), from rope_parameters or the top level."""
    factor = _rope_params(raw, path).get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
        raise ValueError(f"{path}: partial_rotary_factor must be in (0, 1], got {factor!r}")
    rotary_dim = int(head_dim * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"{path}: partial_rotary_factor {factor} rotates {rotary_dim} of {head_dim} dims; need even")
    return float(factor)


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
