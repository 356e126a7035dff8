"""Threads for the model worker, and the environment its process must start with (torch-free).

How many threads, and why OpenMP waits passively:

  - A CPU decode step is ~10 small ops per layer, each one OpenMP parallel region. With N
    threads, a region ends only when the slowest thread does, so a thread queued behind another
    process (scheduler, tokenizer, detokenizer) can stall a region for a time slice. That was
    the reason for an earlier default of one core fewer than allowed. Measured with
    benchmarks/bench_serving.py and bench_offline.py (BENCHMARKS.md, sections 1, 5 and 6) it
    did not show: the other server processes use 2-5% of a core each, and 2 worker threads on
    2 cores gave 1.3x the output throughput of 1 on a quiet machine (no loss on a loaded one)
    and are what make zserve faster than transformers offline. So the default is every core the
    process may use (`default_num_threads`); `--num-threads` overrides it.
  - OpenMP threads spin a short while after each parallel region, then sleep
    (GOMP_SPINCOUNT=`omp_spin_count`, default OMP_SPIN_COUNT iterations, ~0.1-0.2 ms here).
    A decode step is hundreds of regions microseconds apart: threads that sleep at once
    (OMP_WAIT_POLICY=PASSIVE, spin count 0, the earlier default) pay a futex wake-up in each,
    which made a bf16 SmolLM2-135M decode step 1.4-1.6x slower at batch 1, 8 and 64 than with
    a spin count of 10,000-100,000 (BENCHMARKS.md section 11). Spinning forever (ACTIVE) would
    take CPU between steps from exactly the processes the worker waits for (scheduler,
    tokenizer, detokenizer); a bounded spin ends well inside the gap between steps.
  - glibc malloc serves blocks over 128 KiB-32 MiB with mmap and gives them back on free, so
    every step's activations and K/V gathers (MBs each) come back as fresh pages that the
    kernel faults in and zeroes: at batch 64 that tripled a CPU decode step. Raising the mmap
    and trim thresholds keeps freed memory in the heap for the next step; the worker's
    footprint stays at its peak, which is what a long-running server reaches anyway.
  - THP_MEM_ALLOC_ENABLE=1: torch asks the kernel for transparent huge pages (madvise) for
    its allocations of 2 MiB and more. A decode step streams every weight once; with 4 KiB
    pages that is ~130k TLB misses per step for SmolLM2-135M, and on a virtual machine each
    miss walks two page tables. Measured here, one thread: a large GEMV reads 0.5-1.5 GB/s
    on 4 KiB pages and 5-8 GB/s on huge pages. The KV pool asks for them itself (kv_pool.py).
  - These variables are read once, when the C runtime or OpenMP loads, so they cannot be set
    from inside a running worker: the launcher starts the worker with `worker_env(...)`.
    The thread count itself is set again in the worker (`torch.set_num_threads`).
"""

from __future__ import annotations

import os

from zserve.common.isa_features import CPU_ISA_ENV

OMP_SPIN_COUNT = 10_000  # GOMP_SPINCOUNT: iterations an idle OpenMP thread spins before it sleeps
MALLOC_MMAP_THRESHOLD_BYTES = 1 << 32  # blocks below 4 GiB come from the heap, not fresh mmaps
MALLOC_TRIM_THRESHOLD_BYTES = 1 << 34  # and freed heap memory is kept for reuse


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_num_threads(num_cores: int | None = None) -> int:
    """Every core this process may use (see the module docstring for the measurement), at least 1."""
    return max(1, num_cores or available_cores())


def worker_env(
    num_threads: int = 0, device: str = "auto", omp_spin_count: int = OMP_SPIN_COUNT, cpu_isa: str = "",
) -> dict[str, str]:
    """Environment variables the model worker process must be started with.

    `num_threads` 0 picks `default_num_threads()`. On CUDA the CPU only launches kernels, so
    a couple of threads are enough whatever the core count. `omp_spin_count`: GOMP_SPINCOUNT
    (0 = idle threads sleep at once, as OMP_WAIT_POLICY=PASSIVE). `cpu_isa`: the kernels' feature
    set, resolved by the launcher from --cpu-isa ("" = none given: everything the CPU has); the kernels
    are one extension per process, loaded once, so the set comes with the process's start.
    """
    if num_threads < 0:
        raise ValueError(f"num_threads must be >= 0 (0 = automatic), got {num_threads}")
    if omp_spin_count < 0:
        raise ValueError(f"omp_spin_count must be >= 0, got {omp_spin_count}")
    if num_threads == 0:
        num_threads = min(2, default_num_threads()) if device.startswith("cuda") else default_num_threads()
    threads = str(num_threads)
    return {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "GOMP_SPINCOUNT": str(omp_spin_count),
        "MALLOC_MMAP_THRESHOLD_": str(MALLOC_MMAP_THRESHOLD_BYTES),
        "MALLOC_TRIM_THRESHOLD_": str(MALLOC_TRIM_THRESHOLD_BYTES),
        "THP_MEM_ALLOC_ENABLE": "1",
        "ZSERVE_NUM_THREADS": threads,
        **({CPU_ISA_ENV: cpu_isa} if cpu_isa and cpu_isa != "auto" else {}),
    }
