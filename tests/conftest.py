"""Fixtures shared by every component's tests. Test support code lives in `testing/`."""

from __future__ import annotations

import pytest

from testing.e2e_fixtures import GreedyOracle, build_tiny_llama_dir


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny random Llama with a real byte-level BPE tokenizer: what the server tests serve.
    Built once per session (deterministic, and no test writes into it)."""
    return build_tiny_llama_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def oracle(model_dir):
    """transformers on `model_dir`'s weights: the greedy tokens and logprobs the server must match."""
    return GreedyOracle(model_dir)
