"""What zserve knows about one architecture, in one record (the specs are in specs/, one file each).

An `ArchSpec` says how a config.json of its Hugging Face architectures becomes a ModelConfig
(common/model_config.py walks the same steps for every spec, reading the rules here), which model
class runs it (`model`: the `family` of a class in model_proc/models/), and, in `gguf`, how llama.cpp's
GGUF file of it is read (the architecture name in `general.architecture`, the tensor names, the
metadata -> config.json keys). Hooks are plain functions of config.json dicts: no torch, no
transformers, so every process can import the table cheaply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zserve.common.architectures.gguf_metadata import GgufMetadata
from zserve.common.architectures.gguf_names import GGUF_TO_HF

# config.json (flattened) -> the ModelConfig fields of sizes, norms, biases, positions (GPT-2's own reading)
CoreHook = Callable[[dict[str, Any], Path], dict[str, Any]]
# config.json (flattened) -> more ModelConfig fields; `num_layers` and `path` for the errors
FieldsHook = Callable[[dict[str, Any], int, Path], dict[str, Any]]
# config.json as read -> the flat dict the generic parser reads (a multimodal text_config lifted, defaults filled)
TextConfigHook = Callable[[dict[str, Any], Path], dict[str, Any]]
# GGUF metadata -> config.json keys
GgufConfigHook = Callable[[GgufMetadata], dict[str, Any]]
# GGUF metadata + transformers' config (as a dict) -> keys to set on it
GgufPatchHook = Callable[[GgufMetadata, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class BiasRule:
    """A projection's bias: config.json `key` when present (None: never read), else `default`."""

    key: str | None = "attention_bias"
    default: bool = False

    def read(self, raw: dict[str, Any]) -> bool:
        return bool(raw.get(self.key, self.default)) if self.key is not None else self.default


@dataclass(frozen=True, slots=True)
class WindowRule:
    """Which layers slide (common/architectures/layer_windows.py), as transformers' code for the
    architecture reads config.json. `every_layer`: `sliding_window` applies to every layer (Mistral);
    else `layer_types`, else `default_type(raw, layer_idx, path)`. `needs_use_flag`: only when
    `use_sliding_window` is true (Qwen)."""

    every_layer: bool = False
    needs_use_flag: bool = False
    default_type: Callable[[dict[str, Any], int, Path], str] | None = None


@dataclass(frozen=True, slots=True)
class MoeKeys:
    """How config.json spells a mixture of experts (common/moe_config.py)."""

    width_key: str  # the expert MLP's width
    always_norm_topk: bool = False  # renormalise the top-k always (Mixtral), else as `norm_topk_prob` says
    shared_expert: bool = False  # one shared expert in every sparse layer (Qwen2-MoE)


@dataclass(frozen=True, slots=True)
class RopeQuirks:
    """Where an architecture's config class reads RoPE differently (Phi-3: old type names, a default
    original context)."""

    type_aliases: tuple[tuple[str, str], ...] = ()  # (config.json's rope_type, what transformers reads it as)
    original_max_len_default: int | None = None  # top-level original_max_position_embeddings when absent


@dataclass(frozen=True, slots=True)
class GgufSpec:
    """llama.cpp's GGUF file of an architecture. The launcher writes config.json either by `config`
    (from the metadata alone) or by transformers' GGUF reader plus `patch`; `moe_keys` adds the experts
    when the file has `<name>.expert_count`. The reader (model_proc/checkpoints/gguf_checkpoint.py) maps
    `blk.N.<key>` through `block_names`, un-permutes q/k rows when `permuted_qk`, subtracts 1 from norms
    when `shifted_norms`."""

    name: str  # general.architecture
    block_names: dict[str, str] = field(default_factory=lambda: dict(GGUF_TO_HF))
    permuted_qk: bool = False  # convert_hf_to_gguf permuted q/k rows for llama.cpp's rotary (llama)
    shifted_norms: bool = False  # norms stored as 1 + w (Gemma)
    config: GgufConfigHook | None = None  # None: transformers' GGUF config reader, then `patch`
    patch: GgufPatchHook | None = None
    moe_keys: GgufConfigHook | None = None


@dataclass(frozen=True, slots=True)
class ArchSpec:
    """One architecture; see the README's "Adding an architecture"."""

    name: str  # the spec's file name (specs/<name>.py), as Hugging Face's model_type
    hf_architectures: tuple[str, ...]  # config.json "architectures"[0] values read with this spec
    model: str  # ModelConfig.family: the `family` of the model class (model_proc/models/) that runs it
    text_config: TextConfigHook | None = None  # flatten first (Gemma: text_config, class defaults)
    core_fields: CoreHook | None = None  # None: the Llama-shaped reading (decoder_fields.py)
    gated_mlp: bool = True  # gate * act(up) (False: GPT-2's act(fc)); decides the activation table
    head_dim_default: int | None = None  # when config.json has no head_dim; None: hidden / heads
    qkv_bias: BiasRule = BiasRule()
    o_bias: BiasRule = BiasRule()
    qk_norm: bool = False  # an RMSNorm over head_dim on q and k (Qwen3, Gemma 3)
    rope: RopeQuirks = RopeQuirks()
    windows: WindowRule | None = None  # None: no sliding window in its transformers code
    moe: MoeKeys | None = None
    reads_attn_softcap: bool = False  # its attention applies config.json's attn_logit_softcapping
    extra_fields: FieldsHook | None = None  # fields beyond the Llama-shaped ones (Gemma: scale, softcap, local RoPE)
    gguf: GgufSpec | None = None  # None: no GGUF file of its own (served through another spec's, or not at all)
