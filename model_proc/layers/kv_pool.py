"""The KV pool: per layer, one K and one V tensor indexed by slot (num_pages * page_size slots).

The scheduler decides which slots a request owns; this object only holds the tensors. Layout is
head-major, [num_kv_heads, num_slots, head_dim], so a gather of whole pages
(`index_select` on the page dimension of the [kvh, num_pages, page_size, d] view) comes out
as [kvh, batch, len, d], ready for a batched matmul without another copy.

With kv_cache_dtype "int8" (--kv-cache-dtype int8) K and V are int8 and each (head, slot) row has a
bf16 scale in k_scales / v_scales [kvh, num_slots] (kv_int8.py): d + 2 bytes a row instead of 2d, so
the same memory holds 2d / (d + 2) times the pages (1.94x at d = 64, 1.97x at d = 128, against a
16-bit cache). Its writers are `write` and the C++ rope_store_int8 (model_proc/kernels/fused_ops.cpp);
the CPU kernel reads it in place (paged_attention_int8), the other paths through `read_pages` /
`read_slots` / `dequantized`, which hand back rows in `dtype`.

With "fp8_e4m3" / "fp8_e5m2" K and V are float8_e4m3fn / float8_e5m2 with scale 1.0 (kv_fp8.py): d bytes a
row, so the same memory holds exactly twice the pages of a 16-bit cache (four times fp32's). Its writers are
`write` and the C++ rope_store into fp8 caches; the CPU kernel reads it in place (paged_attention over fp8
caches), the other paths through the same three reads. torch has no index_copy_ for fp8, so rows move as bytes.
"""

from __future__ import annotations

import logging
import math
import mmap
from dataclasses import dataclass, field
from pathlib import Path

import torch

from zserve.common.int_math import cdiv
from zserve.common.kernel_choices import KV_CACHE_DTYPES
from zserve.model_proc.layers.kv_fp8 import FP8_DTYPES, from_fp8, to_fp8
from zserve.model_proc.layers.kv_int8 import SCALE_BYTES, SCALE_DTYPE, dequantize_rows, quantize_rows

logger = logging.getLogger(__name__)

HUGE_PAGE_BYTES = 2 << 20  # a transparent huge page on x86-64
OS_PAGE_BYTES = 4096


@dataclass
class KVPool:
    num_layers: int
    num_kv_heads: int  # on this rank
    head_dim: int
    page_size: int
    num_pages: int
    dtype: torch.dtype  # the model's: what attention computes in, and a 16-bit cache's
    device: torch.device
    kv_cache_dtype: str = "auto"  # "auto": K/V in `dtype`; "int8": int8 with a scale per (head, slot); "fp8_*"
    k: list[torch.Tensor] = field(init=False)  # per layer [kvh, num_slots, d]
    v: list[torch.Tensor] = field(init=False)
    k_scales: list[torch.Tensor] = field(init=False)  # int8: per layer fp32 [kvh, num_slots]; else empty
    v_scales: list[torch.Tensor] = field(init=False)
    _mappings: list[mmap.mmap] = field(init=False, repr=False)  # CPU: the memory k and v live in

    def __post_init__(self) -> None:
        if self.num_pages < 1 or self.page_size < 1:
            raise ValueError(f"KV pool needs num_pages >= 1 and page_size >= 1, got {self.num_pages}, {self.page_size}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype {self.kv_cache_dtype!r}: expected one of {', '.join(KV_CACHE_DTYPES)}")
        shape, cache_dtype = (self.num_kv_heads, self.num_slots, self.head_dim), self.cache_dtype
        self._mappings = []
        self.k = [_zeros(shape, cache_dtype, self.device, self._mappings) for _ in range(self.num_layers)]
        self.v = [_zeros(shape, cache_dtype, self.device, self._mappings) for _ in range(self.num_layers)]
        num_scaled = self.num_layers if self.quantized else 0
        self.k_scales = [_zeros(shape[:2], SCALE_DTYPE, self.device, self._mappings) for _ in range(num_scaled)]
        self.v_scales = [_zeros(shape[:2], SCALE_DTYPE, self.device, self._mappings) for _ in range(num_scaled)]

    @property
    def quantized(self) -> bool:
        """int8 rows with a scale each (k_scales / v_scales)."""
        return self.kv_cache_dtype == "int8"

    @property
    def fp8(self) -> bool:
        """fp8 rows, scale 1.0."""
        return self.kv_cache_dtype in FP8_DTYPES

    @property
    def cache_dtype(self) -> torch.dtype:
        """What k and v hold: int8, an fp8 format, or the model's dtype."""
        return torch.int8 if self.quantized else FP8_DTYPES.get(self.kv_cache_dtype, self.dtype)

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def num_bytes(self) -> int:
        per_token = KVPool.bytes_per_token(
            self.num_layers, self.num_kv_heads, self.head_dim, self.dtype, self.kv_cache_dtype
        )
        return per_token * self.num_slots

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """This step's k and v [T, kvh, d] (the model's dtype) into `slots` (int64[T]) of `layer`."""
        if self.fp8:
            for x, cache in ((k, self.k[layer]), (v, self.v[layer])):
                _bytes(cache).index_copy_(1, slots, _bytes(to_fp8(x.transpose(0, 1), cache.dtype)))
            return
        if not self.quantized:
            self.k[layer].index_copy_(1, slots, k.transpose(0, 1))
            self.v[layer].index_copy_(1, slots, v.transpose(0, 1))
            return
        for x, cache, scales in ((k, self.k[layer], self.k_scales[layer]), (v, self.v[layer], self.v_scales[layer])):
            q, row_scales = quantize_rows(x.transpose(0, 1))  # [kvh, T, d], [kvh, T]
            cache.index_copy_(1, slots, q)
            scales.index_copy_(1, slots, row_scales)

    def read_pages(self, layer: int, page_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `page_ids` (int64[n]) of `layer`, [kvh, n, page_size, d] each in the model's dtype (gathered,
        dequantized for an int8 cache, converted for an fp8 one)."""
        keys, values = (self.pages(cache).index_select(1, page_ids) for cache in (self.k[layer], self.v[layer]))
        if self.fp8:
            return from_fp8(keys, self.dtype), from_fp8(values, self.dtype)
        if not self.quantized:
            return keys, values
        shape = (self.num_kv_heads, self.num_pages, self.page_size)
        k_scales, v_scales = (
            s.view(shape).index_select(1, page_ids) for s in (self.k_scales[layer], self.v_scales[layer])
        )
        return dequantize_rows(keys, k_scales, self.dtype), dequantize_rows(values, v_scales, self.dtype)

    def read_slots(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `slots` (int64[n]) of `layer`, [kvh, n, d] each in the model's dtype."""
        keys, values = self.k[layer].index_select(1, slots), self.v[layer].index_select(1, slots)
        if self.fp8:
            return from_fp8(keys, self.dtype), from_fp8(values, self.dtype)
        if not self.quantized:
            return keys, values
        k_scales, v_scales = self.k_scales[layer].index_select(1, slots), self.v_scales[layer].index_select(1, slots)
        return dequantize_rows(keys, k_scales, self.dtype), dequantize_rows(values, v_scales, self.dtype)

    def dequantized(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole of `layer`'s K and V [kvh, num_slots, d] in the model's dtype: the cache itself when 16-bit, a
        dequantized copy for int8 and fp8 (the Triton path's simplest correct read; a copy of the layer per call)."""
        if self.fp8:
            return from_fp8(self.k[layer], self.dtype), from_fp8(self.v[layer], self.dtype)
        if not self.quantized:
            return self.k[layer], self.v[layer]
        return (dequantize_rows(self.k[layer], self.k_scales[layer], self.dtype),
                dequantize_rows(self.v[layer], self.v_scales[layer], self.dtype))

    def pages(self, cache: torch.Tensor) -> torch.Tensor:
        """[kvh, num_slots, d] -> [kvh, num_pages, page_size, d] view."""
        return cache.view(self.num_kv_heads, self.num_pages, self.page_size, self.head_dim)

    def prefault(self) -> int:
        """Fault in now the memory a first request writes: in every layer's K and V, the first huge
        page's worth of slots of each head (a fresh pool hands out the lowest page ids first:
        scheduler_proc/page_allocator.py). With MADV_HUGEPAGE and this kernel's `defrag=madvise`, each
        first touch of a huge page compacts memory when the page cache has filled it: 1.2 s on the
        1B model's 0.5 GB pool, paid by the first request unless done here (ModelRunner runs this
        while the weights load). A request's first write touches these same pages (one huge page
        per head, layer, K and V), so this commits nothing a first request would not. Writes zeros
        over zeros: the values do not change. Returns the bytes in the pages touched (0 off CPU)."""
        if self.device.type != "cpu":
            return 0
        bytes_per_slot = self.head_dim * self.cache_dtype.itemsize
        num_slots = min(self.num_slots, cdiv(HUGE_PAGE_BYTES, bytes_per_slot))
        touched = 0
        for cache in (*self.k, *self.v, *self.k_scales, *self.v_scales):
            heads = cache[:, :num_slots].flatten(1)  # [kvh, num_slots * d (1 for scales)], each row contiguous
            step = max(1, OS_PAGE_BYTES // cache.dtype.itemsize)  # one element of every OS page
            heads[:, ::step].zero_()
            heads[:, -1].zero_()  # a row's last page when its start is not page-aligned
            touched += heads.numel() * cache.dtype.itemsize
        return touched

    def copy_slots(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """K and V of `src_slots` into `dst_slots` (int64, same length, disjoint), every layer:
        a row sharing an identical prompt's K/V takes what its KV source computed this step."""
        for cache in (*self.k, *self.v, *self.k_scales, *self.v_scales):  # an int8 cache's scales with its rows
            _bytes(cache).index_copy_(1, dst_slots, _bytes(cache).index_select(1, src_slots))

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, kv_cache_dtype: str = "auto"
    ) -> int:
        """K and V of one token in every layer: 2 d bytes a (layer, head) row in a 16-bit cache (4 d in fp32),
        d + 4 in an int8 one (its scale), d in an fp8 one."""
        if kv_cache_dtype == "int8":
            row_bytes = head_dim + SCALE_BYTES
        else:
            row_bytes = head_dim * FP8_DTYPES.get(kv_cache_dtype, dtype).itemsize
        return 2 * num_layers * num_kv_heads * row_bytes

    @staticmethod
    def num_pages_for(num_tokens: int, page_size: int) -> int:
        return max(1, cdiv(num_tokens, page_size))

    @staticmethod
    def num_pages_for_memory(fraction: float, device: torch.device, bytes_per_token: int, page_size: int) -> int:
        """Pages that fit in `fraction` of the memory free now (after the weights are loaded)."""
        if not 0 < fraction < 1:
            raise ValueError(f"KV memory fraction must be in (0, 1), got {fraction}")
        free = free_memory_bytes(device)
        num_pages = int(free * fraction) // (bytes_per_token * page_size)
        if num_pages < 1:
            raise ValueError(f"{fraction:.0%} of {free / 2**30:.2f} GiB free memory is less than one KV page")
        return num_pages

    @staticmethod
    def num_pages_for_static_share(
        fraction: float, device: torch.device, weight_bytes: int, bytes_per_token: int, page_size: int
    ) -> int:
        """SGLang's --mem-fraction-static: `fraction` of the device's whole memory holds the weights and the
        KV pool. Capped at 90% of the memory free now (others may use the machine), with a warning."""
        total = total_memory_bytes(device)
        want = int(total * fraction) - weight_bytes
        if want < bytes_per_token * page_size:
            raise ValueError(
                f"--mem-fraction-static {fraction}: {fraction:.0%} of {total / 2**30:.2f} GiB does not hold the "
                f"{weight_bytes / 2**30:.2f} GiB of weights and one KV page"
            )
        free_cap = int(free_memory_bytes(device) * 0.9)
        if want > free_cap:
            logger.warning(
                "--mem-fraction-static %s asks %.2f GiB for the KV pool; "
                "only %.2f GiB are free: the pool takes 90%% of that",
                fraction, want / 2**30, free_cap / 2**30,
            )
            want = free_cap
        return max(1, want // (bytes_per_token * page_size))


def _bytes(cache: torch.Tensor) -> torch.Tensor:
    """An fp8 tensor as its bytes (torch's CPU index_copy_ has no fp8 kernel); others as they are."""
    return cache.view(torch.uint8) if cache.dtype in FP8_DTYPES.values() else cache


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, keep_alive: list) -> torch.Tensor:
    """Zeros (attention masks slots no request wrote, and 0 * garbage could be NaN).

    On CPU from an anonymous mmap: the kernel maps zero pages lazily, so RAM is committed as
    slots are first written rather than all at start (torch.zeros would touch every page of a
    pool that may be a third of the machine's memory), and MADV_HUGEPAGE asks for 2 MiB pages,
    which decode's page gathers stream through (see worker_env.py on huge pages)."""
    if device.type != "cpu" or math.prod(shape) == 0:  # nothing to map (no heads on this rank: the model refuses it)
        return torch.zeros(shape, dtype=dtype, device=device)
    num_bytes = math.prod(shape) * dtype.itemsize
    buffer = mmap.mmap(-1, max(num_bytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buffer.madvise(mmap.MADV_HUGEPAGE)
    keep_alive.append(buffer)  # the tensor borrows the mapping's memory
    return torch.frombuffer(buffer, dtype=dtype, count=math.prod(shape)).view(shape)


def total_memory_bytes(device: torch.device) -> int:
    """The device's whole memory: torch.cuda.mem_get_info on CUDA; on CPU MemTotal, or the cgroup's limit when lower."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    total = _meminfo_bytes("MemTotal:")
    limit = Path("/sys/fs/cgroup/memory.max")  # cgroup v2; "max" = no limit
    if limit.is_file() and limit.read_text().strip().isdigit():
        total = min(total, int(limit.read_text().strip()))
    return total


def _meminfo_bytes(key: str) -> int:
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot tell this system's memory; give the KV pool size in tokens instead")


def free_memory_bytes(device: torch.device) -> int:
    """Free device memory: torch.cuda.mem_get_info on CUDA, MemAvailable from /proc/meminfo on CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return _meminfo_bytes("MemAvailable:")
