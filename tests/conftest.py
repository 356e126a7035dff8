"""Fixtures shared by every component's tests. Test support code lives in `testing/`."""

from __future__ import annotations

import os

import pytest
import torch

from testing.e2e_fixtures import GreedyOracle, build_tiny_llama_dir

# Without CUDA, Triton's kernels run only in its interpreter (tests/model/test_triton_attention.py). triton.jit reads
# TRITON_INTERPRET when it decorates, triton's own helpers at its first import, which comes early and from anywhere
# (importing transformers imports torch._dynamo, which imports triton): so it is set here, before any test module.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny random Llama with a real byte-level BPE tokenizer: what the server tests serve.
    Built once per session (deterministic, and no test writes into it)."""
    return build_tiny_llama_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def oracle(model_dir):
    """transformers on `model_dir`'s weights: the greedy tokens and logprobs the server must match."""
    return GreedyOracle(model_dir)
