"""Loading a quantized file straight into its resident form (issue 44, items 1 and 3):

  * each matrix is packed as soon as its layer has loaded (`pack_as_loaded`): after loading only a
    tied LM head is left to pack;
  * a matrix the file stores quantized, in a format the kernel runs (GGUF Q4_0 / Q4_K / Q6_K,
    a fused q/k/v of Q4_K and Q6_K joined exactly), is never dequantized into a --dtype tensor;
    the float kernels still get its exact values;
  * --gemm-weight-copy: no bf16 copy beside a quantized file's codes under `auto`, one where asked.
"""

from __future__ import annotations

import logging

import pytest
import torch

from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import write_gguf
from testing.model_fixtures import GreedyDriver, make_runner, make_tiny_checkpoint, random_prompt
from zserve.launcher.gguf_model_dir import gguf_model_dir
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot
from zserve.model_proc.layers.gemm import GemmWeight
from zserve.model_proc.layers.weight_kernels.float_kernels import TorchKernel
from zserve.model_proc.layers.weight_kernels.int8_kernels import ZserveInt8DotKernel
from zserve.model_proc.layers.weight_kernels.row_split_int8_kernel import RowSplitInt8Kernel
from zserve.model_proc.layers.weight_kernels.weight_copy_policy import WeightCopyPolicy

WIDE = {"hidden_size": 256, "intermediate_size": 512}
NO_DOT = "the int8 x int8 GEMM needs the avx2 level and a built extension"


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "cache")))


@pytest.fixture
def dequantize_calls(monkeypatch):
    """How many times a layer wrote stored pieces into its float weight."""
    calls = []
    original = GemmWeight._dequantize_into_plain

    def counting(self, parts):
        calls.append(len(parts))
        return original(self, parts)

    monkeypatch.setattr(GemmWeight, "_dequantize_into_plain", counting)
    return calls


def gguf_runner(tmp_path, kind: str, weight_type: str, **settings):
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", kind, **WIDE)
    gguf_file = write_gguf(hf_dir, tmp_path / f"{kind}-{weight_type}.gguf", weight_type)
    return make_runner(gguf_model_dir(gguf_file, with_tokenizer=False), page_size=4, kv_cache_tokens=512,
                       device="cpu", **settings)


@pytest.mark.skipif(load_gemm_int8_dot() is None, reason=NO_DOT)
@pytest.mark.parametrize("kind, weight_type", [("llama", "Q4_0"), ("llama_tied", "Q4_K_M"), ("qwen2", "Q6_K")])
def test_stored_matrices_are_never_dequantized_into_the_dtype(tmp_path, dequantize_calls, kind, weight_type, caplog):
    with caplog.at_level(logging.INFO, logger="zserve.model_proc.model_runner"):
        runner = gguf_runner(tmp_path, kind, weight_type, dtype="bfloat16", quantization="gguf",
                             gemm_backend="zserve_dot")
    layers = [m for m in runner.model.modules() if isinstance(m, GemmWeight)]
    assert dequantize_calls == []
    packed = [piece for m in layers for piece in (m.packed.pieces or (m.packed,))]  # q/k/v of two types: pieces
    assert all(m.weight is None for m in layers) and all(p.bits in (4, 6, 8) for p in packed)
    assert any(m.packed.pieces for m in layers) == (weight_type == "Q4_K_M")  # Q4_K q, k beside a Q6_K v
    tied = kind == "llama_tied"
    assert f"({int(tied)} after loading)" in caplog.text  # all packed as they loaded, but a tied LM head
    embed, head = runner.model.embed_tokens, runner.model.lm_head
    # the lookup table stays in the file's blocks (no float copy); a tied LM head multiplies by the same codes
    assert embed.weight is None and embed.packed_table is not None
    assert (embed.packed_table.values.data_ptr() == head.packed.values.data_ptr()) == tied
    ids = torch.tensor([0, 5, 17, 255])
    exact = embed.packed_table.dequantize().t()[ids].to(torch.bfloat16)
    assert torch.equal(embed(ids), exact)


@pytest.mark.parametrize("kind", ["llama", "llama_tied"])
def test_a_float_kernel_gets_the_stored_values(tmp_path, kind, dequantize_calls):
    """--gemm-backend torch with --quantization none on a Q4_K_M file: each stored piece is dequantized into
    the float weight at pack time, and greedy tokens equal the int8_torch kernel's (the same values exactly)."""
    floats = gguf_runner(tmp_path / "f", kind, "Q4_K_M", dtype="float32", quantization="gguf", gemm_backend="torch")
    assert floats.gemm_backend == "int8_torch" and dequantize_calls == []
    plain = gguf_runner(tmp_path / "p", kind, "Q4_K_M", dtype="float32", quantization="none", gemm_backend="torch")
    assert plain.gemm_backend == "torch"
    prompts = [random_prompt(n, seed=n) for n in (3, 11)]
    outs = []
    for runner in (floats, plain):
        driver = GreedyDriver(runner)
        outs.append(driver.generate([driver.add(p, 8) for p in prompts]))
    assert outs[0] == outs[1]


def test_a_fused_weight_of_a_stored_and_a_float_piece_is_dequantized_at_pack():
    from zserve.model_proc.weights.int8_weights import Int8Weight

    w = torch.randn(64, 48, generator=torch.Generator().manual_seed(1))
    stored = Int8Weight.quantize(w[:, :32], 32)
    layer = GemmWeight()
    layer.init_weight(64, 48)

    class Ckpt:
        def copy_into(self, param, tensor, name, row_offset=0, transposed=False):
            with torch.no_grad():
                param.t()[row_offset : row_offset + tensor.shape[0]].copy_(tensor)

        def mark_loaded(self, param):
            self.marked = param

    ckpt = Ckpt()
    layer.fill_weight(ckpt, stored, "q")
    layer.fill_weight(ckpt, w[:, 32:].t(), "k", col_offset=32)
    with pytest.raises(ValueError, match="does not fit columns 40"):
        layer.fill_weight(ckpt, stored, "v", col_offset=40)
    layer.pack(TorchKernel())
    assert torch.equal(layer.weight[:, :32], stored.dequantize()) and torch.equal(layer.weight[:, 32:], w[:, 32:])


def test_the_copy_policy():
    few, row_split = ZserveInt8DotKernel(), RowSplitInt8Kernel()
    assert WeightCopyPolicy().apply(few, 10**9, 10**6, True).kernel is few  # one copy already: nothing to decide
    stored = WeightCopyPolicy("auto").apply(row_split, 10**6, 10**10, stored_quantized=True)
    assert stored.kernel == row_split.one_copy() and "no bf16 copy" in stored.reason and not stored.warning
    fits = WeightCopyPolicy("auto").apply(row_split, 10**6, 10**10, stored_quantized=False)
    assert fits.kernel is row_split and fits.reason == ""
    short = WeightCopyPolicy("auto").apply(row_split, 10**9, 10**9, stored_quantized=False)
    assert short.kernel == row_split.one_copy() and short.warning and "instead (one copy" in short.reason
    assert WeightCopyPolicy("on").apply(row_split, 10**9, 10**6, True).kernel is row_split
    assert WeightCopyPolicy("off").apply(row_split, 1, 10**10, False).kernel == row_split.one_copy()
    with pytest.raises(ValueError, match="--gemm-weight-copy 'both'"):
        WeightCopyPolicy("both")


@pytest.mark.skipif(not RowSplitInt8Kernel.runs(torch.device("cpu"), torch.bfloat16), reason=NO_DOT + " and oneDNN bf16")
def test_gemm_weight_copy_on_keeps_the_copy_for_a_gguf_file(tmp_path):
    auto = gguf_runner(tmp_path / "a", "llama", "Q4_0", dtype="bfloat16")
    assert auto.gemm_backend == "zserve_int8_dot"
    on = gguf_runner(tmp_path / "o", "llama", "Q4_0", dtype="bfloat16", gemm_weight_copy="on")
    assert on.gemm_backend == "zserve_int8_dot+onednn"
