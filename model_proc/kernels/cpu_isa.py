"""The x86 feature set the CPU kernels are built for, chosen once per process, and what the build
does with it (compile flags, the int8 dot-product instruction).

The features and the rules that pick a set are common/isa_features.py's (torch-free: the launcher
checks `--cpu-isa` with them and resolves it once). A server's model worker starts with the
resolved set in $ZSERVE_CPU_ISA (common/worker_env.py, from the config), like its OpenMP
settings: the kernels are one extension per process, loaded once. A process that runs the
kernels without a server (tests, benchmarks) gets every feature the CPU has, or $ZSERVE_CPU_ISA's.

The compile flags come from the set: the base's -march (x86-64-v3 is AVX2 + FMA + F16C + BMI;
x86-64-v4 adds AVX-512 F/BW/CD/DQ/VL) plus one -m flag per extension, never -march=native: a
build for avx2 on an AVX-512 machine must hold no AVX-512 instruction. The set's name is part of
the kernels' build key (cpu_kernels.py).
"""

from __future__ import annotations

import functools
import os
import platform

from zserve.common.isa_features import CPU_ISA_ENV, LEVELS, X86_MACHINES, IsaFeatures, choose_isa, cpu_flags

__all__ = [
    "AMX_MIN_ROWS", "BF16_TILE_MIN_ROWS", "INT8_DECODE_HEAD_DIMS", "LEVELS", "IsaFeatures", "choose_isa", "cpu_flags",
    "cpu_isa", "fp8_decode_instruction", "int8_decode_instruction", "int8_dot_instruction", "march_flags",
]
ISA_ENV = CPU_ISA_ENV  # the worker's set, from --cpu-isa by the launcher (worker_env)
BASE_MARCH = {0: "-march=x86-64", 256: "-march=x86-64-v3", 512: "-march=x86-64-v4"}  # by vector width
EXTENSION_FLAGS = {  # the compiler flags of each extension
    "avx512_vnni": ("-mavx512vnni",), "avx_vnni": ("-mavxvnni",), "avx512_bf16": ("-mavx512bf16",),
    "amx_int8": ("-mamx-tile", "-mamx-int8"),
}
AMX_MIN_ROWS = 16  # kernels/int8_dot.h's: from this many rows gemm_int8_dot multiplies in AMX tiles
# kernels/int8_dot.h's: from this many rows a bf16 x goes through bf16 tiles (kernels/bf16_tiles.cpp), where granted
BF16_TILE_MIN_ROWS = 256


@functools.cache
def cpu_isa() -> IsaFeatures:
    """This process's set: everything the CPU has, or $ZSERVE_CPU_ISA's (read once per process)."""
    return choose_isa(cpu_flags(), os.environ.get(ISA_ENV), platform.machine(), what=f"${ISA_ENV}")


def march_flags(isa: IsaFeatures) -> tuple[str, ...]:
    """Compiler flags selecting `isa`'s instructions (none off x86, where gcc's default applies)."""
    if platform.machine() not in X86_MACHINES:
        return ()
    extensions = (flag for feature, flags in EXTENSION_FLAGS.items() if feature in isa for flag in flags)
    return (BASE_MARCH[isa.vector_bits], *extensions)


INT8_DECODE_HEAD_DIMS = (64, 128)  # kernels/paged_attention.cpp's attend_int8_decode and attend_fp8_decode instances


def int8_decode_instruction(isa: IsaFeatures, head_dim: int) -> str:
    """What kernels/paged_attention.cpp scores a decode token's rows against an int8 KV cache with in a build for
    `isa` (kernels/int8_attention.h), at head_dim 64 or 128: the rows quantized to int8 and multiplied by VPDPBUSD
    where the build has AVX512-VNNI, VPMADDUBSW in an AVX2 build; "" elsewhere (AVX-512 without VNNI, no AVX2,
    other head dims: the rows stay fp32 and each key row is widened to fp32)."""
    if head_dim not in INT8_DECODE_HEAD_DIMS:
        return ""
    if isa.vector_bits == 512:
        return "vpdpbusd zmm" if "avx512_vnni" in isa else ""
    return "vpmaddubsw ymm" if isa.vector_bits == 256 else ""


def fp8_decode_instruction(isa: IsaFeatures, head_dim: int, query_dtype: str) -> str:
    """What kernels/paged_attention.cpp scores a decode token's bf16 query rows against an fp8 KV cache with in a build
    for `isa`, at head_dim 64 or 128: the keys' bytes converted to bf16 pairs for VDPBF16PS where the build has
    AVX512-BF16 (and AVX512-VNNI, whose transposition it shares; kernels/fp8_attention.h); "" elsewhere and for fp32
    queries (each key row widened to fp32 for attend()'s dot products, bit for bit the 16-bit path's)."""
    if head_dim not in INT8_DECODE_HEAD_DIMS or query_dtype != "bfloat16" or isa.vector_bits != 512:
        return ""
    return "vdpbf16ps zmm" if "avx512_bf16" in isa and "avx512_vnni" in isa else ""


def int8_dot_instruction(isa: IsaFeatures, amx_granted: bool = True) -> str:
    """What kernels/gemm_int8_dot.cpp multiplies int8 with in a build for `isa` (its
    gemm_int8_dot_instruction()): VPDPBUSD where the build's width has VNNI, else VPMADDUBSW
    (+ VPMADDWD + VPADDD), and with amx_int8 (where the OS granted the tiles: `amx_granted`) TDPBSUD
    in AMX tiles from AMX_MIN_ROWS rows; "" without AVX2 (no kernel)."""
    if isa.vector_bits == 512:
        vector = "vpdpbusd zmm" if "avx512_vnni" in isa else "vpmaddubsw zmm"
        if "amx_int8" in isa and amx_granted:
            return f"tdpbsud (amx-int8) from {AMX_MIN_ROWS} rows, {vector} below"
        return vector
    if isa.vector_bits == 256:
        return "vpdpbusd ymm (avx-vnni)" if "avx_vnni" in isa else "vpmaddubsw ymm"
    return ""
