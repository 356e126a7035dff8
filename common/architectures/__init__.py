"""The architectures zserve runs: one ArchSpec per architecture (arch_spec.py), one module per spec
in specs/, collected here into ARCHITECTURES, the only list. common/model_config.py parses any
config.json through its spec, the launcher writes a GGUF file's config.json through it
(launcher/gguf_model_dir.py), the GGUF reader names tensors through it, and model_proc/models/registry.py
checks that a model class exists for every spec's `model`. Torch-free and cheap to import (the
scheduler and tokenizer processes read ModelConfig). See the README, "Adding an architecture".
"""

from __future__ import annotations

import importlib
import pkgutil

from zserve.common.architectures import specs
from zserve.common.architectures.arch_spec import ArchSpec


def _collect() -> tuple[ArchSpec, ...]:
    found = []
    for info in sorted(pkgutil.iter_modules(specs.__path__), key=lambda info: info.name):
        spec = importlib.import_module(f"{specs.__name__}.{info.name}").SPEC
        assert spec.name == info.name, f"specs/{info.name}.py holds the spec named {spec.name!r}"
        found.append(spec)
    return tuple(found)


ARCHITECTURES: tuple[ArchSpec, ...] = _collect()
_BY_HF_NAME = {hf: spec for spec in ARCHITECTURES for hf in spec.hf_architectures}
_BY_GGUF_NAME = {spec.gguf.name: spec for spec in ARCHITECTURES if spec.gguf is not None}
HF_ARCHITECTURES: tuple[str, ...] = tuple(_BY_HF_NAME)
GGUF_ARCHITECTURES: tuple[str, ...] = tuple(_BY_GGUF_NAME)
MODEL_FAMILIES: frozenset[str] = frozenset(spec.model for spec in ARCHITECTURES)


def spec_for_hf(architecture: str) -> ArchSpec | None:
    """The spec reading config.json "architectures"[0] == `architecture`; None: not supported."""
    return _BY_HF_NAME.get(architecture)


def spec_for_gguf(architecture: str) -> ArchSpec | None:
    """The spec of a GGUF file whose general.architecture is `architecture`; None: not supported."""
    return _BY_GGUF_NAME.get(architecture)
