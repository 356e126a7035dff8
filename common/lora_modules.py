"""The LoRA adapters a server loads: --lora-modules (vLLM's NAME=PATH) or --lora-paths (SGLang's NAME=PATH or
PATH, named by itself), stored comma-joined in `ModelSection.lora_modules`.

An adapter's index is its place in this list: the scheduler sends it per row (ForwardBatch.lora_ids, -1 for the
base model) and the worker stacks the adapters' weights in the same order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

NO_ADAPTER = -1  # a row (or request) served by the base model
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
# the projections an adapter may target: the attention's and the gated MLP's (Llama, Qwen2/3, Mistral)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraModule:
    name: str  # what a request names: lora_path, or `model` on the OpenAI routes
    path: str  # a PEFT directory


def parse_lora_modules(text: str) -> tuple[LoraModule, ...]:
    """The adapters of `--lora-modules` as stored (comma-joined); ValueError naming a bad or repeated entry."""
    modules: list[LoraModule] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        name, sep, path = entry.partition("=")
        name, path = (name.strip(), path.strip()) if sep else (entry, entry)
        if not name or not path:
            raise ValueError(f"--lora-modules entry {entry!r} is not NAME=PATH")
        if any(m.name == name for m in modules):
            raise ValueError(f"--lora-modules names the adapter {name!r} twice")
        modules.append(LoraModule(name, path))
    return tuple(modules)


@dataclass(frozen=True)
class AdapterConfig:
    """What adapter_config.json says that the server uses: delta W = B @ A * lora_alpha / r."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @staticmethod
    def read(path: str | Path, max_rank: int) -> AdapterConfig:
        """The adapter directory's config, checked (JSON only: the launcher reads it before any child
        starts); ValueError naming what the server cannot serve."""
        root = Path(path)
        try:
            data = json.loads((root / ADAPTER_CONFIG_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"LoRA adapter {path}: no readable {ADAPTER_CONFIG_FILE} ({exc})") from None
        if not (root / ADAPTER_WEIGHTS_FILE).is_file():
            raise ValueError(f"LoRA adapter {path}: no {ADAPTER_WEIGHTS_FILE}")
        rank, alpha, targets = data.get("r"), data.get("lora_alpha", data.get("r")), data.get("target_modules")
        if not isinstance(rank, int) or not 1 <= rank <= max_rank:
            raise ValueError(f"LoRA adapter {path}: rank r={rank!r} is not in 1..{max_rank} (--max-lora-rank)")
        if isinstance(targets, str):
            targets = [targets]
        if not isinstance(targets, list) or not targets:
            raise ValueError(f"LoRA adapter {path}: target_modules must list the projections it adapts")
        unknown = sorted(set(targets) - set(LORA_TARGETS))
        if unknown:
            raise ValueError(f"LoRA adapter {path}: target_modules {unknown} are not served (only {LORA_TARGETS})")
        for key in ("use_dora", "use_rslora"):
            if data.get(key):
                raise ValueError(f"LoRA adapter {path}: {key} is not supported")
        if data.get("modules_to_save"):
            raise ValueError(f"LoRA adapter {path}: modules_to_save (full copies of layers) is not supported")
        return AdapterConfig(rank, float(alpha), tuple(targets))


def served_lora_modules(enable_lora: bool, lora_modules: str) -> tuple[LoraModule, ...]:
    """The adapters a server serves, by index: --lora-modules (SGLang's --lora-paths alone turns LoRA on, as
    --enable-lora does); empty without either."""
    return parse_lora_modules(lora_modules) if enable_lora or lora_modules.strip() else ()


def lora_names(enable_lora: bool, lora_modules: str) -> tuple[str, ...]:
    """The adapter names a server serves, by index (empty without LoRA)."""
    return tuple(m.name for m in served_lora_modules(enable_lora, lora_modules))


def check_lora_flags(enable_lora: bool, lora_modules: str, max_loras: int, max_lora_rank: int, tp_size: int) -> None:
    """The LoRA flags together and each adapter's config; ValueError naming the flag."""
    modules = served_lora_modules(enable_lora, lora_modules)
    if enable_lora and not modules:
        raise ValueError("--enable-lora needs the adapters to load: --lora-modules NAME=PATH [NAME=PATH ...]")
    if not modules:
        return
    if len(modules) > max_loras:
        raise ValueError(f"--lora-modules names {len(modules)} adapters; --max-loras allows {max_loras}")
    if tp_size > 1:
        raise ValueError("LoRA adapters are served with --tp-size 1 only")
    for module in modules:
        AdapterConfig.read(module.path, max_lora_rank)


def unknown_adapter_error(name: str, names: tuple[str, ...]) -> str:
    if not names:
        return f"lora_path {name!r}: this server serves no LoRA adapters (start it with --enable-lora --lora-modules)"
    return f"the LoRA adapter {name!r} does not exist; this server serves {', '.join(names)}"


def adapter_index(names: tuple[str, ...], lora_path: str | None) -> int:
    """The adapter a request names, by index; NO_ADAPTER for none. The frontend checked the name."""
    return NO_ADAPTER if not lora_path else names.index(lora_path)
