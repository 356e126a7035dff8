"""model_proc/quant/: one class per quantization method. Which method a checkpoint is stored in,
what --quantization auto serves it as, which GGUF types each keeps as stored, and which weight
kernels registry.choose_kernel gives each (the choice the kernels' own flags used to make)."""

from __future__ import annotations

import json

import pytest
import torch

from zserve.common.gguf_source import write_gguf_source
from zserve.common.weight_formats import QUANTIZATION_CHOICES
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8, load_gemm_int8_dot
from zserve.model_proc.layers.weight_kernels.registry import KERNELS, choose_kernel
from zserve.model_proc.quant.methods import QUANTIZATION_METHODS, auto_quantization, checkpoint_method, get_quant_method
from zserve.model_proc.weights.gguf_blocks import STORED_TYPES

CPU = torch.device("cpu")
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}


def test_the_methods_are_the_six_and_the_served_ones_are_the_flag_choices():
    assert list(QUANTIZATION_METHODS) == ["none", "int8", "int4", "gguf", "awq", "gptq"]
    assert tuple(get_quant_method(name).name for name in QUANTIZATION_CHOICES) == QUANTIZATION_CHOICES
    for name in ("awq", "gptq", "fp8"):  # checkpoint formats, not a --quantization
        with pytest.raises(ValueError, match=f"--quantization '{name}': expected one of none, int8, int4, gguf"):
            get_quant_method(name)


@pytest.mark.parametrize(("config", "expected"), [({}, "none"), ({"quantization_config": AWQ}, "awq"),
                                                  ({"quantization_config": GPTQ}, "gptq")])
def test_a_safetensors_checkpoint_is_detected_by_its_config(tmp_path, config, expected):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **config}))
    method = checkpoint_method(tmp_path)
    assert method.name == expected and method.quantized == (expected != "none")


def test_a_gguf_directory_is_detected_by_its_pointer(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    write_gguf_source(tmp_path, tmp_path / "model.gguf")
    assert checkpoint_method(tmp_path).name == "gguf"


def test_awq_and_gptq_refuse_what_they_do_not_load():
    assert QUANTIZATION_METHODS["awq"].refusal(AWQ) is None and QUANTIZATION_METHODS["gptq"].refusal(GPTQ) is None
    assert QUANTIZATION_METHODS["awq"].refusal({**AWQ, "bits": 8}) == "8-bit weights (only 4-bit are loaded)"
    assert QUANTIZATION_METHODS["gptq"].refusal({**GPTQ, "desc_act": True}) == "GPTQ with act-order (desc_act)"
    assert all(QUANTIZATION_METHODS[m].refusal({}) is None for m in ("none", "int8", "int4", "gguf"))


@pytest.mark.parametrize(("stored", "where_int8_dot_runs"), [("none", "none"), ("gguf", "gguf"), ("awq", "int8"),
                                                             ("gptq", "int8")])
def test_auto_serves_a_stored_method_as_its_own_where_the_int8_dot_kernel_runs(stored, where_int8_dot_runs):
    method = QUANTIZATION_METHODS[stored]
    assert auto_quantization(method, cpu_int8_dot_runs=True) == where_int8_dot_runs
    assert auto_quantization(method, cpu_int8_dot_runs=False) == "none"


def test_the_gguf_types_each_method_keeps_as_stored():
    kept = {name: (m.gguf_types_kept, m.gguf_packs) for name, m in QUANTIZATION_METHODS.items() if m.served}
    assert kept == {"none": (frozenset(), False), "int8": (frozenset({"Q8_0"}), False), "int4": (frozenset(), False),
                    "gguf": (frozenset(STORED_TYPES), True)}


@pytest.mark.parametrize("quantization", QUANTIZATION_CHOICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("choice", ["auto", "zserve_widen", "zserve_dot", "torch"])
def test_the_chosen_kernel_is_one_the_method_runs_on(quantization, dtype, choice):
    method = get_quant_method(quantization)
    kernel = choose_kernel(CPU, dtype, choice, quantization)
    assert method.runs_on(kernel)
    runnable = [k.name for k in KERNELS if method.runs_on(k)]
    assert runnable and kernel.name in runnable
    if quantization == "none":
        assert kernel.quantization == "none"
    else:  # the int8 kernels; gguf and int4 only those that run 4-bit codes and offsets (never zserve_int8)
        assert kernel.quantization == "int8" and kernel.weight_bits == (4 if quantization == "int4" else 8)
        assert ("zserve_int8" in runnable) == (quantization == "int8")


@pytest.mark.skipif(load_gemm_int8() is None or load_gemm_int8_dot() is None, reason="the int8 CPU kernels are not built")
def test_fp32_auto_keeps_the_widening_int8_kernel_for_int8_only():
    assert choose_kernel(CPU, torch.float32, "auto", "int8").name == "zserve_int8"
    assert choose_kernel(CPU, torch.float32, "auto", "gguf").name == "int8_torch"  # 4-bit codes: not zserve_int8
    assert choose_kernel(CPU, torch.float32, "auto", "int4").name == "int8_torch"
