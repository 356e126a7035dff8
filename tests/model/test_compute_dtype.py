"""`--dtype auto`: bf16 on CUDA, on CPUs with native bf16 instructions and where the widening
16-bit GEMM runs (AVX2 + FMA + F16C kernels); fp32 on other CPUs."""

from __future__ import annotations

import pytest
import torch

from zserve.model_proc import compute_dtype
from zserve.model_proc.compute_dtype import native_bf16_feature, resolve_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def with_cpu_features(monkeypatch, **features: bool) -> None:
    monkeypatch.setattr(compute_dtype.torch.cpu, "get_capabilities", lambda: {"architecture": "x86_64", "avx512_f": True, **features})


@pytest.mark.parametrize(
    "features, expected",
    [
        ({"avx512_bf16": True}, "avx512_bf16"),
        ({"amx_bf16": True, "amx_tile": True}, "amx_bf16"),
        ({"avx512_bf16": False, "avx2": True}, None),  # AVX-512 alone: bf16 would be emulated
    ],
)
def test_native_bf16_feature(monkeypatch, features, expected):
    with_cpu_features(monkeypatch, **features)
    assert native_bf16_feature() == expected


def test_auto_is_bf16_on_a_cpu_with_native_bf16(monkeypatch):
    with_cpu_features(monkeypatch, avx512_bf16=True)
    assert resolve_dtype("auto", CPU) == (torch.bfloat16, "auto: this CPU has avx512_bf16")


def test_auto_is_bf16_where_the_widening_gemm_runs(monkeypatch):
    with_cpu_features(monkeypatch)
    monkeypatch.setattr(compute_dtype, "widening_gemm_level", lambda: "avx2")
    dtype, reason = resolve_dtype("auto", CPU)
    assert dtype == torch.bfloat16 and "(avx2 kernels)" in reason


def test_auto_is_fp32_on_other_cpus_and_bf16_on_cuda(monkeypatch):
    with_cpu_features(monkeypatch)
    monkeypatch.setattr(compute_dtype, "widening_gemm_level", lambda: None)
    dtype, reason = resolve_dtype("auto", CPU)
    assert dtype == torch.float32 and "none of avx512_bf16, amx_bf16" in reason
    assert resolve_dtype("auto", CUDA) == (torch.bfloat16, "auto: CUDA")  # no CUDA needed to decide


def test_named_dtypes_win_over_the_cpu(monkeypatch):
    with_cpu_features(monkeypatch, avx512_bf16=True)
    assert resolve_dtype("float32", CPU) == (torch.float32, "--dtype float32")
    assert resolve_dtype("bf16", CPU)[0] == torch.bfloat16 and resolve_dtype("fp16", CPU)[0] == torch.float16
    assert resolve_dtype(torch.float32, CPU)[0] == torch.float32
    with pytest.raises(ValueError, match="dtype 'int8' is not one of auto, float32"):
        resolve_dtype("int8", CPU)


def test_this_machine_reads_its_cpu():
    """The real query answers (whatever this CPU is), and auto follows it."""
    feature = native_bf16_feature()
    assert feature in (None, *compute_dtype.NATIVE_BF16_CPU_FEATURES)
    level = compute_dtype.widening_gemm_level()
    assert resolve_dtype("auto", CPU)[0] == (torch.bfloat16 if feature or level else torch.float32)
