"""benchmarks/make_shaped_gguf.py: the blocks it writes are valid and ~0.02 in size, its Q4_K_M mix
is llama-quantize's, and zserve serves the file it writes (a tiny Llama and a tiny Qwen3-MoE from
--config, --quantization gguf): logits finite, tokens in the vocabulary.

The tokenizer comes from a tiny GGUF written by testing/gguf_fixtures.py (a 600-token byte-level
BPE), not the demo's 49152 tokens, so the model stays small.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.gguf_model_shape import SHAPES
from benchmarks.gguf_quant_mix import tensor_type, use_more_bits
from benchmarks.gguf_random_blocks import WEIGHT_STD, random_rows
from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import write_gguf
from testing.model_fixtures import GreedyDriver, make_runner, make_tiny_checkpoint, random_prompt
from testing.paths import REPO_ROOT
from zserve.launcher.gguf_model_dir import gguf_model_dir

TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "max_position_embeddings": 512, "tie_word_embeddings": True}
TINY_QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
                  "rope_theta": 1e6, "max_position_embeddings": 512, "tie_word_embeddings": False, "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 256, "mlp_only_layers": [1]}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "cache")))


@pytest.fixture(scope="module")
def tokenizer_gguf(tmp_path_factory):
    work = tmp_path_factory.mktemp("tokenizer")
    hf_dir = make_tiny_checkpoint(work / "hf", "llama", with_tokenizer=True)
    return write_gguf(hf_dir, work / "tokenizer.gguf", "F32")


@pytest.mark.parametrize("type_name", ["F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q6_K"])
def test_blocks_dequantize_to_finite_weights_of_the_intended_size(type_name):
    import gguf

    raw = random_rows(type_name, 32, 512, np.random.default_rng(0))
    weights = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])
    assert weights.shape == (32, 512) and np.isfinite(weights).all()
    assert abs(float(weights.mean())) < 0.2 * WEIGHT_STD
    assert 0.8 * WEIGHT_STD < float(weights.std()) < 1.2 * WEIGHT_STD


def test_the_q4_k_m_mix_follows_llama_quantize():
    assert [i for i in range(16) if use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    n = 32
    assert tensor_type("q4_k_m", "blk.0.attn_v.weight", (1024, 4096), n, False) == "Q6_K"
    assert tensor_type("q4_k_m", "blk.5.attn_v.weight", (1024, 4096), n, False) == "Q4_K"
    assert tensor_type("q4_k_m", "blk.6.ffn_down.weight", (4096, 14336), n, False) == "Q6_K"  # (6 - 4) % 3 == 2
    assert tensor_type("q4_k_m", "blk.5.ffn_down_exps.weight", (128, 2048, 768), 48, False) == "Q6_K"  # 5 < 48/8
    assert tensor_type("q4_k_m", "blk.6.ffn_down_exps.weight", (128, 2048, 768), 48, False) == "Q4_K"
    assert tensor_type("q4_k_m", "blk.6.ffn_gate_inp.weight", (128, 2048), 48, False) == "F32"
    assert tensor_type("q4_k_m", "output.weight", (49152, 4096), n, False) == "Q6_K"
    assert tensor_type("q4_k_m", "token_embd.weight", (49152, 4096), n, False) == "Q4_K"
    assert tensor_type("q4_k_m", "token_embd.weight", (49152, 2048), 16, True) == "Q6_K"  # tied: the output's type
    assert tensor_type("q4_k_m", "blk.3.ffn_gate.weight", (96, 64), 4, False) == "Q5_0"  # rows of 64: fallback
    assert tensor_type("q4_k_m", "blk.3.ffn_down.weight", (64, 96), 4, False) == "Q8_0"  # Q6_K's fallback
    assert tensor_type("q4_0", "output.weight", (49152, 4096), n, False) == "Q6_K"
    assert tensor_type("q8_0", "output.weight", (49152, 4096), n, False) == "Q8_0"
    assert tensor_type("q8_0", "blk.0.attn_norm.weight", (4096,), n, False) == "F32"


def test_named_shapes_have_the_real_models_matrices():
    one_b = SHAPES["llama-3.2-1b"].with_vocab(49152)
    params = sum(int(np.prod(shape)) for _, shape in one_b.tensors())
    assert 1.0e9 < params < 1.1e9  # Llama-3.2-1B less its vocabulary's difference (1.24 B with 128256)
    moe = dict(SHAPES["qwen3-30b-a3b"].with_vocab(49152).tensors())
    assert moe["blk.47.ffn_down_exps.weight"] == (128, 2048, 768) and moe["blk.0.attn_q.weight"] == (4096, 2048)
    assert "output.weight" in moe and "blk.0.attn_k_norm.weight" in moe


@pytest.mark.parametrize(("config", "mix"), [(TINY_LLAMA, "q4_k_m"), (TINY_QWEN3_MOE, "q4_k_m"), (TINY_LLAMA, "q8_0")])
def test_zserve_serves_the_written_file(tmp_path, tokenizer_gguf, config, mix):
    import gguf

    (tmp_path / "config.json").write_text(json.dumps(config))
    out = tmp_path / "shaped.gguf"
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "make_shaped_gguf.py"), "--config", str(tmp_path / "config.json"),
           "--type", mix, "--tokenizer-gguf", str(tokenizer_gguf), "--out", str(out), "--progress-every", "8"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") >= 3 and f"{out.stat().st_size} bytes" in proc.stdout.splitlines()[-1]
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
    if mix == "q4_k_m":  # rows of 256 in Q4_K / Q6_K, the others their fallbacks
        assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"} <= set(types.values()), types
    model_dir = gguf_model_dir(out, with_tokenizer=True)
    runner = make_runner(model_dir, page_size=4, kv_cache_tokens=256, device="cpu", dtype="float32",
                         quantization="gguf", gemm_backend="torch")
    driver = GreedyDriver(runner)
    seqs = [driver.add(random_prompt(n, seed=n), 4) for n in (3, 9)]
    logits = runner.last_logits(driver.build_batch(seqs))
    assert logits.shape == (2, 600) and bool(logits.isfinite().all())
    driver = GreedyDriver(runner)
    tokens = driver.generate([driver.add(random_prompt(n, seed=n), 4) for n in (3, 9)])
    assert all(len(t) == 4 and all(0 <= i < 600 for i in t) for t in tokens)
