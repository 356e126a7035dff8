"""Fixtures for the model worker's tests."""

from __future__ import annotations

import pytest

from testing.model_fixtures import make_tiny_checkpoint


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    """A tiny Llama checkpoint (random weights, fixed seed), no tokenizer."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama")
