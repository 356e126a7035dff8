"""Model family (ModelConfig.family, an ArchSpec's `model`) -> our model class.

Every class in this package that declares its own `family` is collected (a new architecture's model
file is found here without an edit), and the families must be exactly those the specs of
common/architectures/ name: a spec without model code, or model code without a spec, fails at import.
"""

from __future__ import annotations

import importlib
import pkgutil

from torch import nn

from zserve.common.architectures import MODEL_FAMILIES
from zserve.common.model_config import ModelConfig


def _collect_model_classes() -> dict[str, type[nn.Module]]:
    package = importlib.import_module(__package__)
    classes: dict[str, type[nn.Module]] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{__package__}.{info.name}")
        for cls in vars(module).values():
            if isinstance(cls, type) and cls.__module__ == module.__name__ and "family" in vars(cls):
                assert classes.setdefault(cls.family, cls) is cls, f"two model classes for family {cls.family!r}"
    return classes


MODEL_CLASSES: dict[str, type[nn.Module]] = _collect_model_classes()
assert set(MODEL_CLASSES) == MODEL_FAMILIES, (
    f"model classes {sorted(MODEL_CLASSES)} != the architecture specs' models {sorted(MODEL_FAMILIES)}"
)


def build_model(cfg: ModelConfig, tp_rank: int = 0, tp_size: int = 1) -> nn.Module:
    """Uninitialised parameters (in the current default device and dtype); call `.load(ckpt)` next."""
    model_class = MODEL_CLASSES.get(cfg.family)
    if model_class is None:
        have = ", ".join(MODEL_CLASSES)
        raise ValueError(f"no model code for family {cfg.family!r} ({cfg.architecture}); have {have}")
    return model_class(cfg, tp_rank, tp_size)
