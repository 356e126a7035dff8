"""--quantization gguf end to end: a GGUF file's quantized matrices kept as stored (4-bit codes
packed, the other types as int8 codes; model_proc/weights/gguf_blocks.py) against transformers' own GGUF
loader on the same file, fp32 on CPU:

  * --gemm-backend torch (int8_torch: the stored codes dequantized exactly for torch.mm): greedy
    tokens identical to transformers' (which dequantizes the same blocks with gguf);
  * --gemm-backend zserve_dot (the int8 x int8 kernel, its 4-bit path): identical to transformers'
    with every linear layer's input quantized as the kernel quantizes its activations
    (testing/int8_oracle.py `quantize_linear_inputs`), up to a near-tie (NEAR_TIE_ULPS): an
    activation a hair from a rounding boundary of that quantization can round the other way on
    the two sides (their fp32 sums differ in order), which moves a logit by ~0.2% (measured: a
    first difference at 0.38 bf16 ulps between the top two logits, Q4_0, 23-token prompt).

Q4_0 and Q4_1 are quantized by gguf from the fixture's weights; Q4_K, Q5_K and Q6_K are random
blocks with valid scales; Q4_K_M mixes them as llama-quantize does (testing/gguf_fixtures.py), so
a fused q/k/v of Q4_K and Q6_K pieces joins in int8 codes with offsets. K-quant rows are 256
values, so the fixture is 256 wide.
"""

from __future__ import annotations

import logging

import pytest

from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import write_gguf
from testing.int8_oracle import quantize_linear_inputs
from testing.model_fixtures import GreedyDriver, first_divergence, make_runner, make_tiny_checkpoint, random_prompt
from zserve.launcher.demo_model import _load_gguf_model
from zserve.launcher.gguf_model_dir import gguf_model_dir
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot, load_gguf_pack
from zserve.model_proc.layers.gemm import GemmWeight

NEW_TOKENS = 12
NEAR_TIE_ULPS = 2.0
WIDE = {"hidden_size": 256, "intermediate_size": 512}
VARIANTS = {  # name -> (tiny kind, GGUF weight type)
    "llama_q4_0": ("llama", "Q4_0"),
    "qwen2_q4_1": ("qwen2", "Q4_1"),
    "llama_q4_k": ("llama", "Q4_K"),
    "llama_q5_k": ("llama", "Q5_K"),
    "qwen2_q5_0": ("qwen2", "Q5_0"),
    "llama_q5_1": ("llama", "Q5_1"),
    "qwen2_q6_k": ("qwen2", "Q6_K"),
    "llama_tied_q4_k_m": ("llama_tied", "Q4_K_M"),
}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "cache")))


def greedy_pair(tmp_path, name: str, gemm: str):
    kind, weight_type = VARIANTS[name]
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", kind, **WIDE)
    gguf_file = write_gguf(hf_dir, tmp_path / f"{name}.gguf", weight_type)
    runner = make_runner(gguf_model_dir(gguf_file, with_tokenizer=False), page_size=4, kv_cache_tokens=512, device="cpu",
                         dtype="float32", quantization="gguf", gemm_backend=gemm)
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    driver = GreedyDriver(runner)
    return runner, gguf_file, prompts, driver.generate([driver.add(p, NEW_TOKENS) for p in prompts])


def transformers_greedy_with_logits(model, prompt: list[int], n: int):
    import torch

    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                         pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long), output_logits=True,
                         return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), torch.stack(out.logits)[:, 0].float()


def transformers_greedy(model, prompt: list[int], n: int) -> list[int]:
    return transformers_greedy_with_logits(model, prompt, n)[0]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_stored_blocks_dequantized_exactly_match_transformers(tmp_path, name):
    runner, gguf_file, prompts, ours = greedy_pair(tmp_path, name, "torch")
    assert runner.gemm_backend == "int8_torch"
    layers = [m for m in runner.model.modules() if isinstance(m, GemmWeight)]
    assert layers and all(m.packed.scales is not None for m in layers)
    model = _load_gguf_model(gguf_file)
    for prompt, out in zip(prompts, ours, strict=True):
        assert out == transformers_greedy(model, prompt, NEW_TOKENS), f"{name}: prompt of {len(prompt)} tokens"


@pytest.mark.skipif(load_gemm_int8_dot() is None, reason="the int8 x int8 GEMM needs the avx2 feature and a built extension")
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_int8_dot_kernel_matches_transformers_with_quantized_activations(tmp_path, name):
    runner, gguf_file, prompts, ours = greedy_pair(tmp_path, name, "zserve_dot")
    assert runner.gemm_backend == "zserve_int8_dot"
    bits = {m.packed.bits for m in runner.model.modules() if isinstance(m, GemmWeight)}
    four_bit = VARIANTS[name][1] in ("Q4_0", "Q4_1", "Q4_K", "Q4_K_M")
    assert (4 in bits) == four_bit, bits  # Q4_K_M: gate/up and the o projections stay 4-bit
    model = _load_gguf_model(gguf_file)
    quantize_linear_inputs(model)
    exact = 0
    for prompt, out in zip(prompts, ours, strict=True):
        theirs, logits = transformers_greedy_with_logits(model, prompt, NEW_TOKENS)
        exact += first_divergence(out, theirs, logits, NEAR_TIE_ULPS) is None
    assert exact >= 2, f"{name}: {exact} of 3 prompts identical"


def test_types_are_logged_and_a_non_gguf_model_is_refused(tmp_path, caplog):
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", "llama", **WIDE)
    model_dir = gguf_model_dir(write_gguf(hf_dir, tmp_path / "m.gguf", "Q4_K_M"), with_tokenizer=False)
    with caplog.at_level(logging.INFO, logger="zserve.model_proc.checkpoints.gguf_checkpoint"):
        make_runner(model_dir, page_size=4, kv_cache_tokens=64, device="cpu", dtype="float32", quantization="gguf")
    lines = [r.getMessage() for r in caplog.records]
    # 2 layers: q k gate up o in Q4_K (10), v down in Q6_K (4) plus the output; the embedding in Q8_0
    assert any("10 Q4_K tensors kept as stored for --quantization gguf (4-bit codes" in line for line in lines), lines
    six_bit = "6-bit codes" if load_gguf_pack() is not None else "int8 codes"  # packed at load where built
    assert any(f"Q6_K tensors kept as stored for --quantization gguf ({six_bit}" in line for line in lines), lines
