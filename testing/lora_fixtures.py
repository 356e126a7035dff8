"""LoRA adapters for tests and benchmarks: random PEFT directories on a base checkpoint, and the merged
checkpoint transformers runs as the oracle (PEFT's merge_and_unload: W + B @ A * lora_alpha / r; PEFT itself is
not a dependency).

    adapter = build_peft_adapter(tmp / "sql", model_dir, seed=1, rank=4)
    oracle = GreedyOracle(merge_adapter(model_dir, adapter, tmp / "sql-merged"))
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PEFT_PREFIX = "base_model.model."  # PEFT's name of the wrapped model's tensors


def _projection_shapes(base_dir: Path) -> dict[str, tuple[int, int]]:
    """Each adapted projection's base weight name -> [out, in] (transformers' layout)."""
    weights = load_file(str(base_dir / "model.safetensors"))
    return {
        name.removesuffix(".weight"): tuple(w.shape) for name, w in weights.items()
        if name.endswith(".weight") and name.split(".")[-2] in ALL_TARGETS
    }


def build_peft_adapter(
    target_dir: Path, base_dir: Path, *, seed: int, rank: int = 4, alpha: float = 8.0,
    targets: tuple[str, ...] = ALL_TARGETS, scale: float = 0.3,
) -> Path:
    """A PEFT LoRA directory with random A and (non-zero) B for `targets` of every layer of `base_dir`."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (out_features, in_features) in _projection_shapes(Path(base_dir)).items():
        if name.split(".")[-1] not in targets:
            continue
        tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = torch.randn(rank, in_features, generator=gen) * scale
        tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = torch.randn(out_features, rank, generator=gen) * scale
    target_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target_dir / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(targets), "lora_dropout": 0.0,
        "bias": "none", "base_model_name_or_path": str(base_dir), "task_type": "CAUSAL_LM",
    }
    (target_dir / "adapter_config.json").write_text(json.dumps(config))
    return target_dir


def merge_adapter(base_dir: Path, adapter_dir: Path, target_dir: Path) -> Path:
    """A copy of `base_dir` with the adapter merged into its weights (what merge_and_unload computes)."""
    shutil.copytree(base_dir, target_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    scaling = config["lora_alpha"] / config["r"]
    weights = load_file(str(base_dir / "model.safetensors"))
    lora = load_file(str(adapter_dir / "adapter_model.safetensors"))
    for key, a in lora.items():
        if ".lora_A." not in key:
            continue
        name = key.removeprefix(PEFT_PREFIX).replace(".lora_A.weight", ".weight")
        b = lora[key.replace(".lora_A.", ".lora_B.")]
        weights[name] = (weights[name].double() + (b.double() @ a.double()) * scaling).to(weights[name].dtype)
    save_file(weights, str(target_dir / "model.safetensors"), metadata={"format": "pt"})
    return target_dir
