"""The architecture table (common/architectures/): every spec consistent with the others and with
transformers' own config classes, and no architecture test outside it (the README's "Adding an
architecture": a new one is one spec file plus one model file)."""

from __future__ import annotations

import re

import pytest

from testing.paths import REPO_ROOT
from zserve.common.architectures import (
    ARCHITECTURES,
    GGUF_ARCHITECTURES,
    HF_ARCHITECTURES,
    MODEL_FAMILIES,
    spec_for_gguf,
    spec_for_hf,
)
from zserve.common.architectures.gguf_names import GGUF_TO_HF

PRODUCT_PACKAGES = ("common", "launcher", "tokenizer_proc", "scheduler_proc", "model_proc", "detokenizer_proc",
                    "http_proc", "client", "zserve")
ARCH_TEST = re.compile(r"(family|arch|architecture)\s*(==|!=|in |not in )")


def test_names_are_unique_and_found_back():
    hf_names = [name for spec in ARCHITECTURES for name in spec.hf_architectures]
    assert len(hf_names) == len(set(hf_names)) == len(HF_ARCHITECTURES)
    gguf_names = [spec.gguf.name for spec in ARCHITECTURES if spec.gguf is not None]
    assert len(gguf_names) == len(set(gguf_names)) == len(GGUF_ARCHITECTURES)
    assert len({spec.name for spec in ARCHITECTURES}) == len(ARCHITECTURES)
    for spec in ARCHITECTURES:
        assert spec.hf_architectures and all(spec_for_hf(name) is spec for name in spec.hf_architectures)
        assert spec.gguf is None or spec_for_gguf(spec.gguf.name) is spec
    assert spec_for_hf("MambaForCausalLM") is None and spec_for_gguf("mamba") is None


@pytest.mark.parametrize("spec", ARCHITECTURES, ids=lambda spec: spec.name)
def test_each_spec_is_consistent(spec):
    assert spec.model in MODEL_FAMILIES and re.fullmatch(r"[a-z0-9_]+", spec.model)
    if spec.core_fields is not None:  # its own reading (GPT-2): the Llama-shaped rules would be ignored
        assert spec.head_dim_default is None and not spec.qk_norm and spec.windows is None
    if spec.windows is not None and not spec.windows.every_layer:
        assert spec.windows.default_type is not None  # a config.json without layer_types needs the rule
    if spec.gguf is not None:
        assert set(GGUF_TO_HF) - set(spec.gguf.block_names) <= {"ffn_norm"}  # Gemma gives ffn_norm another meaning
        assert spec.gguf.config is None or spec.gguf.patch is None  # the config is either the spec's or transformers'


# transformers 5's Qwen3MoeConfig has no head_dim (its attention takes hidden / heads); zserve keeps 128, as
# before the table moved: every Qwen3-MoE config.json on the hub gives head_dim, so the two never meet
DIFFERS_FROM_TRANSFORMERS = {"qwen3_moe"}


@pytest.mark.parametrize("spec", [
    pytest.param(s, marks=pytest.mark.xfail(strict=True, raises=AttributeError)) if s.name in DIFFERS_FROM_TRANSFORMERS
    else s for s in ARCHITECTURES if s.head_dim_default is not None
], ids=lambda s: s.name)
def test_head_dim_default_is_transformers(spec):
    transformers = pytest.importorskip("transformers")
    config_class = getattr(transformers, spec.hf_architectures[0].replace("ForCausalLM", "Config"))
    assert config_class().head_dim == spec.head_dim_default


def test_the_model_registry_has_the_specs_families():
    pytest.importorskip("torch")
    from zserve.model_proc.models.registry import MODEL_CLASSES

    assert set(MODEL_CLASSES) == MODEL_FAMILIES


def test_architecture_tests_live_only_in_common_architectures():
    """An architecture / family name compared anywhere in product code outside common/architectures/
    is a second table of architectures: read the spec instead."""
    found = []
    for package in PRODUCT_PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            rel = path.relative_to(REPO_ROOT).as_posix()
            if rel.startswith("common/architectures/"):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if ARCH_TEST.search(line):
                    found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
