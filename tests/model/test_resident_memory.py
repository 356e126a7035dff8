"""The memory line's resident bytes (model_proc/resident_memory.py) count an embedding table kept in the
file's blocks: an untied table's codes and scales once (before, no GemmWeight held them and they were
left out: the 8B Q4_K_M file showed 0.995x its tensors), a tied one's not twice (the LM head multiplies by
the same tensors)."""

from __future__ import annotations

import pytest
import torch

from tests.model.test_weight_loading import NO_DOT, cache_dir, gguf_runner  # noqa: F401 (a fixture)
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot
from zserve.model_proc.resident_memory import resident_bytes_by_form


@pytest.mark.skipif(load_gemm_int8_dot() is None, reason=NO_DOT)
@pytest.mark.parametrize("kind", ["llama", "llama_tied"])
def test_a_packed_embedding_table_counts_once(tmp_path, kind):
    runner = gguf_runner(tmp_path, kind, "Q4_0", dtype="bfloat16", quantization="gguf", gemm_backend="zserve_dot")
    embed = runner.model.embed_tokens
    table = embed.packed_table
    assert table is not None
    with_table = sum(resident_bytes_by_form(runner.model, torch.bfloat16)[0].values())
    embed.packed_table = None
    without = sum(resident_bytes_by_form(runner.model, torch.bfloat16)[0].values())
    embed.packed_table = table
    table_bytes = table.values.numel() + table.compact.nbytes
    assert with_table - without == (0 if kind == "llama_tied" else table_bytes)
    assert sum(runner.memory.resident_bytes_by_form.values()) == with_table
