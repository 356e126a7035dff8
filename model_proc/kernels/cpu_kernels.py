"""Builds and loads the CPU kernels, once per machine and instruction set: one torch extension
from paged_attention.cpp (zserve::paged_attention), gemm_widen.cpp (zserve::gemm_widen: 16-bit
weights widened in registers, AVX2 or AVX-512), gemm_int8.cpp (zserve::gemm_int8: int8 weights
and scales, --quantization int8; its drivers and tiles shared with gemm_widen in cpu_gemm.h),
gemm_int8_dot.cpp (zserve::gemm_int8_dot: int8 weights times activations quantized to int8,
VPDPBUSD with AVX512-VNNI or AVX-VNNI, VPMADDUBSW elsewhere; many rows in AMX tiles by TDPBSUD in
gemm_amx.cpp with amx_int8), gemm_bf16.cpp (zserve::gemm_bf16, with
AVX512-BF16), fused_ops.cpp (zserve::rms_norm, add_rms_norm_, silu_mul, rope_store), gguf_pack.cpp
(zserve::gguf_pack: a GGUF matrix's quantized rows straight into gemm_int8_dot's layout, at load),
six_bit_quads.cpp (zserve::six_bit_quads: Q6_K's 6-bit codes, six_bit_codes.h, as int8 quads),
moe_experts.cpp (zserve::moe_experts: a MoE layer's routed experts in one call over their stacked GGUF
blocks), lora_rows.cpp (zserve::lora_rows_: a projection's LoRA update for every adapted token, on its own
adapter's matrices) and cpu_probe.cpp (zserve::probe_rate: the clock and each GEMM instruction's rate under load, for
bench_model's peak).

The instruction set is cpu_isa.py's: every feature the CPU has, or a smaller set forced with
--cpu-isa. The build is cached under <cache root>/kernels
(common/cache_root.py: $ZSERVE_CACHE_DIR, else $XDG_CACHE_HOME/zserve, else ~/.cache/zserve),
in a folder named by the feature set and keyed by it, the source, the compile flags,
torch's version and install path, the interpreter and the CPU's flags, so a new torch, a forced
set or a copied home directory never loads a stale or foreign build, and two virtual
environments (a CI clone beside a working tree) do not rebuild each other's folder in turn: the
compile command names torch's and Python's include folders, and ninja rebuilds when it changes.
A build holds an flock on `<folder>.flock` (released by the kernel when its process dies), so a
lock file left by torch's builder in a killed build is known stale and removed, instead of every
later worker waiting on it forever. scripts/setup.sh builds it
(`python -m zserve.model_proc.kernels.cpu_kernels`); a worker that finds no build compiles it on
first use (about a minute on 2 cores) and waits. When it cannot be built (no compiler, no ninja,
an error), `load_cpu_kernels()` logs one line and returns False: attention runs the pure-torch
path and the linear layers oneDNN.

It is compiled with the set's flags (cpu_isa.py: -march=x86-64-v3 or -v4 and -mavx512vnni,
-mavxvnni, -mavx512bf16, -mamx-tile -mamx-int8 as the set has them), never -march=native: a build for avx2 on an AVX-512
machine holds no AVX-512 instruction.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from zserve.common.cache_root import KERNELS_SUBDIR, cache_root
from zserve.common.kernel_choices import FUSED_OPS_CHOICES
from zserve.model_proc.kernels.cpu_isa import IsaFeatures, cpu_flags, cpu_isa, march_flags

logger = logging.getLogger(__name__)

# included by the sources; part of the build key
HEADERS = tuple(
    Path(__file__).with_name(name)
    for name in ("cpu_math.h", "cpu_gemm.h", "int8_dot.h", "six_bit_codes.h", "int8_attention.h", "fp8_attention.h")
)
SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "paged_attention.cpp", "gemm_widen.cpp", "gemm_int8.cpp", "gemm_int8_dot.cpp", "gemm_amx.cpp", "gemm_bf16.cpp",
        "fused_ops.cpp", "cpu_probe.cpp", "gguf_pack.cpp", "six_bit_quads.cpp", "moe_experts.cpp",
        "bf16_tiles.cpp", "lora_rows.cpp",
    )
)
# Reassociation lets the dot products reduce as a tree (in order, their last step is 16 dependent
# adds); finite-math stays on (the kernel never makes inf or NaN, but must pass them through), and
# no -ffast-math anywhere: linked, it would set flush-to-zero for the whole process.
CFLAGS = ("-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros")
LDFLAGS = ("-fopenmp",)  # libgomp.so.1: the one torch already loaded answers to that name


def kernel_cache_dir() -> Path:
    return cache_root() / KERNELS_SUBDIR


def compile_flags(isa: IsaFeatures) -> tuple[str, ...]:
    return (*CFLAGS, *march_flags(isa))


def build_key(isa: IsaFeatures) -> str:
    digest = hashlib.sha256()
    for source in (*SOURCES, *HEADERS):
        digest.update(source.read_bytes())
    install = (str(Path(torch.__file__).resolve().parent), sys.prefix, platform.python_version())
    for part in (
        isa.name, " ".join(compile_flags(isa) + LDFLAGS), torch.__version__, *install, platform.machine(),
        " ".join(sorted(cpu_flags())),
    ):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch's build runs `ninja` from PATH; the pip package `ninja` puts one in the venv's bin,
    which is not on PATH when the venv's python is run without activating it."""
    if shutil.which("ninja"):
        yield
        return
    candidates = [Path(sys.executable).parent]
    with contextlib.suppress(ImportError):
        import ninja

        candidates.append(Path(ninja.BIN_DIR))
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([*map(str, candidates), old])
    try:
        yield
    finally:
        os.environ["PATH"] = old


@contextlib.contextmanager
def _build_lock(build_dir: Path) -> Iterator[None]:
    """One builder per folder at a time, by an flock the kernel drops when its holder dies. Whoever
    holds it knows torch's own `lock` file in the folder (torch waits on it forever) was left by a
    build that died, and removes it."""
    with open(build_dir.with_name(build_dir.name + ".flock"), "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        stale = build_dir / "lock"
        if stale.exists():
            logger.warning("removing %s, left by a kernel build that did not finish", stale)
            stale.unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(verbose: bool = False) -> Path:
    """Compile (or find the cached build of) the kernel and load it into this process; returns
    the build folder. Raises on failure."""
    from torch.utils import cpp_extension

    isa = cpu_isa()
    build_dir = kernel_cache_dir() / f"cpu_kernels-{isa.name}-{build_key(isa)}"
    if hasattr(torch.ops.zserve, "paged_attention"):  # loaded already: torch allows one registration per process
        return build_dir
    build_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with _build_lock(build_dir), _ninja_on_path():
        cpp_extension.load(
            name=f"zserve_cpu_kernels_{isa.name.replace('+', '_')}",  # a C identifier
            sources=[str(source) for source in SOURCES],
            extra_cflags=list(compile_flags(isa)),
            extra_ldflags=list(LDFLAGS),
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=verbose,
        )
    logger.debug("CPU kernels (%s) loaded from %s in %.1fs", isa.name, build_dir, time.perf_counter() - t0)
    return build_dir


@functools.cache
def load_cpu_kernels() -> bool:
    """Whether the extension is loaded (building it if needed); a failure is logged once per
    process (cached)."""
    try:
        build()
    except Exception as exc:  # a failed build of an optional fast path must not stop the worker
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        logger.warning(
            "CPU kernels unavailable (%s); using the pure-torch attention path and oneDNN linear layers", reason[:300]
        )
        return False
    return True


def load_paged_attention() -> Callable | None:
    """torch.ops.zserve.paged_attention, or None when the kernels cannot be built here."""
    return torch.ops.zserve.paged_attention if load_cpu_kernels() else None


def fused_ops_available(device: torch.device, dtype: torch.dtype, choice: str = "auto") -> bool:
    """Whether the fused elementwise ops (fused_ops.cpp) run here: CPU, float32 or bfloat16,
    built, and not turned off by `choice` (a server's --fused-ops: auto, or off for torch's ops)."""
    if choice not in FUSED_OPS_CHOICES:
        raise ValueError(f"--fused-ops {choice!r}: expected auto or off")
    return choice == "auto" and device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and load_cpu_kernels()


def load_gemm_bf16() -> Callable | None:
    """torch.ops.zserve.gemm_bf16, or None when the kernels cannot be built here or were built
    without AVX512-BF16."""
    if not load_cpu_kernels() or not torch.ops.zserve.gemm_bf16_supported():
        return None
    return torch.ops.zserve.gemm_bf16


def load_gemm_widen() -> Callable | None:
    """torch.ops.zserve.gemm_widen (16-bit weights widened in registers), or None when the
    kernels cannot be built here or the set has no avx2 (AVX2 + FMA + F16C)."""
    if not load_cpu_kernels() or not torch.ops.zserve.gemm_widen_supported():
        return None
    return torch.ops.zserve.gemm_widen


def load_gemm_int8() -> Callable | None:
    """torch.ops.zserve.gemm_int8 (int8 weights widened in registers), or None when the kernels
    cannot be built here or the set has no avx2 (`baseline`: gemm.py then
    dequantizes on the fly for torch.mm)."""
    if not load_cpu_kernels() or not torch.ops.zserve.gemm_int8_supported():
        return None
    return torch.ops.zserve.gemm_int8


def load_gemm_int8_dot() -> Callable | None:
    """torch.ops.zserve.gemm_int8_dot (int8 weights times int8 activations), or None when the
    kernels cannot be built here or the set has no avx2. Logs once which instructions multiply,
    and when the set has amx_int8 but the OS refused this process the tiles."""
    if not load_cpu_kernels() or not torch.ops.zserve.gemm_int8_dot_supported():
        return None
    _log_int8_dot_instruction()
    return torch.ops.zserve.gemm_int8_dot


@functools.cache
def _log_int8_dot_instruction() -> None:
    instruction = torch.ops.zserve.gemm_int8_dot_instruction()
    if "amx_int8" in cpu_isa() and not torch.ops.zserve.gemm_int8_dot_amx_granted():
        logger.warning(
            "int8 dot products by %s: the OS refused this process the AMX tile data (arch_prctl "
            "ARCH_REQ_XCOMP_PERM; a thread's signal stack too small, or a kernel without AMX support)", instruction
        )
    else:
        logger.info("int8 dot products by %s", instruction)
    bf16_tile_rows = torch.ops.zserve.gemm_int8_dot_bf16_tile_rows()
    if bf16_tile_rows:
        logger.info("bf16 activations of %d rows and more: the weight decoded to bf16 per chunk, AMX-BF16 tiles "
                    "(oneDNN's matmul; kernels/bf16_tiles.cpp)", bf16_tile_rows)


def load_gguf_pack() -> Callable | None:
    """torch.ops.zserve.gguf_pack (GGUF rows into gemm_int8_dot's layout; plain C++, every feature set), or None
    when the kernels cannot be built here."""
    return torch.ops.zserve.gguf_pack if load_cpu_kernels() else None


def load_moe_experts() -> Callable | None:
    """torch.ops.zserve.moe_experts (a MoE layer's routed experts over gemm_dot_compact), or None when
    the kernels cannot be built here or the set has no avx2 (no gemm_int8_dot under it)."""
    if not load_cpu_kernels() or not torch.ops.zserve.gemm_int8_dot_supported():
        return None
    return torch.ops.zserve.moe_experts


def load_lora_rows(device: torch.device, dtype: torch.dtype) -> Callable | None:
    """torch.ops.zserve.lora_rows_ (a projection's LoRA update on each token's own adapter; plain C++ and
    AVX2 / AVX-512, every feature set) for a CPU model in float32 or bfloat16, or None (another device or dtype,
    or the kernels cannot be built here)."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16) or not load_cpu_kernels():
        return None
    return torch.ops.zserve.lora_rows_


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t0 = time.perf_counter()
    build_dir = build(verbose="-v" in sys.argv)
    supported = (
        ("gemm_widen", torch.ops.zserve.gemm_widen_supported()),
        ("gemm_int8", torch.ops.zserve.gemm_int8_supported()),
        ("gemm_bf16", torch.ops.zserve.gemm_bf16_supported()),
        ("gemm_int8_dot", torch.ops.zserve.gemm_int8_dot_supported()),
    )
    gemms = [name for name, ok in supported if ok]
    int8_dot = torch.ops.zserve.gemm_int8_dot_instruction()
    print(
        f"[setup] CPU kernels for {cpu_isa()} ready in {build_dir}, "
        f"GEMMs: {', '.join(gemms) or 'none'}, int8 dot products by {int8_dot or 'none'} "
        f"({time.perf_counter() - t0:.1f}s)"
    )


if __name__ == "__main__":
    main()
