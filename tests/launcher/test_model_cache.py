"""The model cache: one root for the model directories and the CPU kernels' builds, each directory
built in one step (a complete one is kept, an incomplete one replaced whole, a killed run's partial
directory removed once stale), and the chat template written where every reader looks."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from testing.cache_dirs import private_cache_dir
from zserve.common.cache_root import cache_root
from zserve.launcher import model_cache

REQUIRED = ("config.json", "tokenizer.json")


def _complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in REQUIRED)


def _fake_model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    for name in REQUIRED:
        (path / name).write_text("{}")
    return path


def _quiet(message: str) -> None:
    pass


def test_one_root_for_models_and_kernels(monkeypatch, tmp_path):
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "mine"  # ZSERVE_CACHE_DIR wins
    monkeypatch.delenv("ZSERVE_CACHE_DIR")
    assert cache_root() == tmp_path / "xdg" / "zserve"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "zserve"


def test_the_kernels_build_under_the_same_root(monkeypatch, tmp_path):
    kernels = pytest.importorskip("zserve.model_proc.kernels.cpu_kernels")
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(tmp_path))
    assert kernels.kernel_cache_dir() == tmp_path / "kernels"


def test_a_private_cache_shares_the_kernels_build(monkeypatch, tmp_path):
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(tmp_path / "shared"))
    private = private_cache_dir(tmp_path / "private")
    assert (private / "kernels").resolve() == (tmp_path / "shared" / "kernels").resolve()


def test_build_dir_renames_a_complete_directory_into_place(tmp_path):
    target = tmp_path / "model"

    def build(staging: Path) -> None:
        assert staging.parent == tmp_path and staging.name.startswith(".model.partial-")
        for name in REQUIRED:
            (staging / name).write_text("{}")

    assert model_cache.build_dir(target, build, _complete, _quiet) == target
    assert _complete(target) and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_failed_build_leaves_nothing(tmp_path):
    def build(staging: Path) -> None:
        (staging / "config.json").write_text("{}")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        model_cache.build_dir(tmp_path / "model", build, _complete, _quiet)
    assert list(tmp_path.iterdir()) == []


def test_install_replaces_an_incomplete_directory_and_keeps_a_complete_one(tmp_path):
    target = tmp_path / "SmolLM2-135M-Instruct"
    target.mkdir()
    (target / "config.json").write_text("{}")  # a half model, not made by us
    staging = _fake_model_dir(tmp_path / "staging")
    model_cache.install(staging, target, _complete, _quiet)
    assert _complete(target) and not staging.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SmolLM2-135M-Instruct"]

    other = _fake_model_dir(tmp_path / "other")
    (other / "marker").write_text("")
    model_cache.install(other, target, _complete, _quiet)  # a complete one is already there
    assert not (target / "marker").exists()


def test_stale_partial_directories_are_removed(tmp_path):
    stale = tmp_path / f"{model_cache.partial_prefix('model')}old"
    live = tmp_path / f"{model_cache.partial_prefix('model')}new"
    stale.mkdir()
    live.mkdir()
    old = time.time() - model_cache.STALE_PARTIAL_S - 60
    os.utime(stale, (old, old))
    model_cache.remove_stale_partials(tmp_path, "model")
    assert not stale.exists() and live.exists()


def test_chat_template_goes_into_tokenizer_config(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    model_cache.ensure_chat_template(tmp_path, "{{ messages }}")
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config == {"eos_token": "<|im_end|>", "chat_template": "{{ messages }}"}
