"""Loading the --lora-modules adapters (PEFT directories) into the model: each adapted projection of each
decoder layer gets a LoraLayer holding every adapter's update (lora_layer.py), all reading one LoraBatch.

PEFT stores `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` [r, in] and `...lora_B.weight`
[out, r]; the scaling is adapter_config.json's lora_alpha / r. Served: the Llama family's attention (q, k, v,
o) and gated MLP (gate, up, down) with --tp-size 1 (the launcher checks the flags: common/lora_modules.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from zserve.common.lora_modules import ADAPTER_WEIGHTS_FILE, AdapterConfig, LoraModule
from zserve.model_proc.kernels.cpu_kernels import load_lora_rows
from zserve.model_proc.layers.weight_kernels.weight_kernel import WeightKernel
from zserve.model_proc.lora.lora_batch import LoraBatch
from zserve.model_proc.lora.lora_layer import LoraLayer
from zserve.model_proc.lora.lora_rows_layer import LoraRowsLayer
from zserve.model_proc.lora.lora_stack import Update

LORA_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.weight)?$")
# each adapted projection of a layer: its LoraLayer's attribute (declared by the Llama family's attention and MLP,
# models/llama.py: the module that has it adds the update), the PEFT names it fuses
PROJECTIONS = (
    ("qkv_lora", ("q_proj", "k_proj", "v_proj")),
    ("o_lora", ("o_proj",)),
    ("gate_up_lora", ("gate_proj", "up_proj")),
    ("down_lora", ("down_proj",)),
)


def read_adapter(module: LoraModule, max_rank: int) -> tuple[AdapterConfig, dict[tuple[int, str], Update]]:
    """The adapter's config and its updates by (layer, projection name)."""
    config = AdapterConfig.read(module.path, max_rank)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(str(Path(module.path) / ADAPTER_WEIGHTS_FILE)).items():
        match = LORA_KEY.search(key)
        if match is None:
            raise ValueError(f"LoRA adapter {module.name}: tensor {key} is not a q/k/v/o or MLP lora_A / lora_B")
        layer, name, which = int(match[1]), match[2], match[3]
        pairs.setdefault((layer, name), {})[which] = tensor
    updates = {}
    for (layer, name), pair in pairs.items():
        if set(pair) != {"A", "B"} or pair["A"].shape[0] != config.rank or pair["B"].shape[1] != config.rank:
            raise ValueError(f"LoRA adapter {module.name}: layer {layer} {name} needs lora_A [r, in] and lora_B "
                             f"[out, r] with r = {config.rank}")
        updates[(layer, name)] = (pair["A"], pair["B"], config.scaling)
    return config, updates


def attach_lora(
    model: nn.Module, modules: tuple[LoraModule, ...], max_rank: int, dtype: torch.dtype, device: torch.device,
    kernel: WeightKernel | None,
) -> LoraBatch:
    """Give the model's adapted projections their LoRA layers; returns the LoraBatch the runner sets each step.
    `dtype`: the model's, the updates' too. On a CPU with zserve's kernels, in float32 or bfloat16, each is a
    LoraRowsLayer (one kernel call per projection, each token on its own adapter); elsewhere a LoraLayer whose dense
    products run on `kernel`, the float weight kernel (None: torch's)."""
    batch = LoraBatch(len(modules), dtype, device)
    lora_rows = load_lora_rows(device, dtype)
    adapters = [read_adapter(m, max_rank) for m in modules]
    rank = max(config.rank for config, _ in adapters)
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ValueError(f"LoRA adapters are not served for {type(model).__name__} (the Llama family's are)")
    used: set[tuple[int, str]] = set()
    for layer_idx, layer in enumerate(layers):
        for owner in (getattr(layer, "self_attn", None), getattr(layer, "mlp", None)):
            for attr, names in PROJECTIONS:
                if owner is None or not hasattr(owner, attr):
                    continue
                pieces = [[updates.get((layer_idx, name)) for name in names] for _, updates in adapters]
                if all(p is None for adapter in pieces for p in adapter):
                    continue
                base = getattr(owner, attr.replace("_lora", "_proj"))
                out_sizes = list(getattr(base, "out_sizes", [getattr(base, "out_features", 0)]))
                if lora_rows is not None:
                    lora = LoraRowsLayer.build(pieces, base.in_features, out_sizes, rank, batch, lora_rows)
                else:
                    lora = LoraLayer.build(pieces, base.in_features, out_sizes, rank, batch, kernel)
                setattr(owner, attr, lora)
                used.update((layer_idx, name) for name in names)
    for module, (_, updates) in zip(modules, adapters, strict=True):
        missing = sorted(set(updates) - used)
        if missing:
            layer_idx, name = missing[0]
            raise ValueError(f"LoRA adapter {module.name}: layer {layer_idx} has no {name} this model can adapt")
    return batch
