"""--quantization gguf end to end for the types of llama.cpp's Q2_K..Q3_K_M and IQ4 files (Q2_K,
Q3_K, IQ4_NL, IQ4_XS; model_proc/weights/gguf_super_blocks.py, gguf_small_blocks.py), decoded natively
to int8 codes instead of dequantized and quantized again, fp32 on CPU:

  * --gemm-backend torch (int8_torch: the stored codes dequantized exactly for torch.mm): greedy
    tokens identical to zserve's own --quantization none run of the same file (every matrix
    dequantized to float32 by gguf);
  * --gemm-backend zserve_dot (the int8 x int8 kernel): identical to transformers' GGUF loader
    with every linear layer's input quantized as the kernel quantizes its activations, up to a
    near-tie (tests/model/test_gguf_stored.py says why).

gguf cannot quantize to these types, so each layer's matrices are random blocks with values within
about +-MAGNITUDES (testing/gguf_random_blocks.py), written by the fixture's GGUF writer (patched
here to know them); the embedding and LM head are the tiny model's own (sharpened) weights in Q8_0,
so greedy decoding does not settle on one token. LOW_BIT_MIX fuses pieces of several types (q/k
Q2_K with offsets in groups of 16, v Q3_K; gate Q2_K with up Q4_K), which join in int8 codes with
offsets, groups of 16.
"""

from __future__ import annotations

import logging

import pytest

from testing import gguf_fixtures
from testing.cache_dirs import private_cache_dir
from testing.gguf_random_blocks import random_blocks
from testing.int8_oracle import quantize_linear_inputs
from testing.model_fixtures import GreedyDriver, first_divergence, make_runner, make_tiny_checkpoint, random_prompt
from tests.model.test_gguf_stored import transformers_greedy_with_logits
from zserve.launcher.demo_model import _load_gguf_model
from zserve.launcher.gguf_model_dir import gguf_model_dir
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot
from zserve.model_proc.layers.gemm import GemmWeight

NEW_TOKENS = 12
NEAR_TIE_ULPS = 2.0
# the random blocks' values: within about +-this; Q2_K's offsets (-dmin m, a mean per group of 16)
# at 0.05 swamp the residual stream, and every prompt decodes one token over and over
MAGNITUDES = {"Q2_K": 0.01, "Q3_K": 0.05, "IQ4_NL": 0.05, "IQ4_XS": 0.05}
WIDE = {"hidden_size": 256, "intermediate_size": 512}
LOW_BIT_TYPES = ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS")
LOW_BIT_MIX = {"attn_q": "Q2_K", "attn_k": "Q2_K", "attn_v": "Q3_K", "attn_output": "IQ4_XS", "ffn_gate": "Q2_K",
               "ffn_up": "Q4_K", "ffn_down": "IQ4_NL"}
VARIANTS = {  # name -> (tiny kind, GGUF weight type)
    "llama_q2_k": ("llama", "Q2_K"),
    "qwen2_q3_k": ("qwen2", "Q3_K"),
    "llama_iq4_nl": ("llama", "IQ4_NL"),
    "qwen2_iq4_xs": ("qwen2", "IQ4_XS"),
    "llama_mix": ("llama", "LOW_BIT_MIX"),
}


@pytest.fixture(autouse=True)
def low_bit_writer(tmp_path, monkeypatch):
    """The fixture's GGUF writer with the low-bit types (random blocks) and LOW_BIT_MIX."""
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "cache")))
    quantized_tensor, type_of = gguf_fixtures.quantized_tensor, gguf_fixtures.type_of

    def low_bit_tensor(type_name, data, seed):
        if type_name not in LOW_BIT_TYPES:
            return quantized_tensor(type_name, data, seed)
        import gguf

        raw = random_blocks(type_name, data.size // data.shape[-1], data.shape[-1], seed=seed, magnitude=MAGNITUDES[type_name])
        return raw.reshape(*data.shape[:-1], -1), gguf.GGMLQuantizationType[type_name]

    def mixed_type_of(weight_type, gguf_tensor_name):
        if weight_type not in (*LOW_BIT_TYPES, "LOW_BIT_MIX"):
            return type_of(weight_type, gguf_tensor_name)
        parts = gguf_tensor_name.split(".")
        if not gguf_tensor_name.startswith("blk."):
            return "Q8_0"  # the embedding and LM head: the tiny model's own (sharpened) weights
        return weight_type if weight_type in LOW_BIT_TYPES else LOW_BIT_MIX.get(parts[-2], "F32")  # norms: 1-D

    monkeypatch.setattr(gguf_fixtures, "QUANTIZED_TYPES", (*gguf_fixtures.QUANTIZED_TYPES, *LOW_BIT_TYPES))
    monkeypatch.setattr(gguf_fixtures, "quantized_tensor", low_bit_tensor)
    monkeypatch.setattr(gguf_fixtures, "type_of", mixed_type_of)


def greedy(tmp_path, name: str, quantization: str, gemm: str):
    kind, weight_type = VARIANTS[name]
    gguf_file = tmp_path / f"{name}.gguf"
    if not gguf_file.exists():
        hf_dir = make_tiny_checkpoint(tmp_path / "hf", kind, **WIDE)
        gguf_fixtures.write_gguf(hf_dir, gguf_file, weight_type)
    runner = make_runner(gguf_model_dir(gguf_file, with_tokenizer=False), page_size=4, kv_cache_tokens=512, device="cpu",
                         dtype="float32", quantization=quantization, gemm_backend=gemm)
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    driver = GreedyDriver(runner)
    return runner, gguf_file, prompts, driver.generate([driver.add(p, NEW_TOKENS) for p in prompts])


def code_bits(runner) -> set[int]:
    """The code widths of every packed weight, a fused weight's column pieces each (layers/column_pieces.py)."""
    layers = [m for m in runner.model.modules() if isinstance(m, GemmWeight) and m.packed is not None]
    return {piece.bits for m in layers for piece in (m.packed.pieces or (m.packed,))}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_stored_low_bit_blocks_match_the_dequantized_float_path(tmp_path, name):
    runner, _, _, ours = greedy(tmp_path, name, "gguf", "torch")
    assert runner.gemm_backend == "int8_torch"
    layers = [m for m in runner.model.modules() if isinstance(m, GemmWeight)]
    assert layers and all(m.packed.scales is not None for m in layers)
    floats_runner, _, _, theirs = greedy(tmp_path, name, "none", "torch")
    assert floats_runner.gemm_backend != "int8_torch"
    assert ours == theirs, name


@pytest.mark.skipif(load_gemm_int8_dot() is None, reason="the int8 x int8 GEMM needs the avx2 feature and a built extension")
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_int8_dot_kernel_runs_low_bit_blocks_as_transformers_with_quantized_activations(tmp_path, name):
    runner, gguf_file, prompts, ours = greedy(tmp_path, name, "gguf", "zserve_dot")
    # int8 codes (packed from the file's blocks, kernels/gguf_pack.cpp); the mix's Q4_K up stays 4-bit, a piece
    # beside the Q2_K gate
    assert runner.gemm_backend == "zserve_int8_dot" and code_bits(runner) == ({4, 8} if name == "llama_mix" else {8})
    model = _load_gguf_model(gguf_file)
    quantize_linear_inputs(model)
    exact = 0
    for prompt, out in zip(prompts, ours, strict=True):
        theirs, logits = transformers_greedy_with_logits(model, prompt, NEW_TOKENS)
        exact += first_divergence(out, theirs, logits, NEAR_TIE_ULPS) is None
    assert exact >= 2, f"{name}: {exact} of 3 prompts identical"


def test_low_bit_types_are_logged_as_int8_codes(tmp_path, caplog):
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", "llama", **WIDE)
    model_dir = gguf_model_dir(gguf_fixtures.write_gguf(hf_dir, tmp_path / "m.gguf", "LOW_BIT_MIX"), with_tokenizer=False)
    with caplog.at_level(logging.INFO, logger="zserve.model_proc.checkpoints.gguf_checkpoint"):
        make_runner(model_dir, page_size=4, kv_cache_tokens=64, device="cpu", dtype="float32", quantization="gguf")
    lines = [r.getMessage() for r in caplog.records]
    for type_name in LOW_BIT_TYPES:
        kept = f"{type_name} tensors kept as stored for --quantization gguf (int8 codes"
        assert any(kept in line for line in lines), (type_name, lines)
    assert any("Q4_K tensors kept as stored for --quantization gguf (4-bit codes" in line for line in lines)
