"""PackedCache: a GGUF file's matrices as kernels/gguf_pack.cpp packed them, kept on disk beside the model's
metadata directory, read back on later starts instead of packed again (--packed-cache).

    <model dir>/packed/tp<rank>of<size>-<key>.bin    the packed tensors: gguf_pack's 5 outputs as 5 runs
                                                     (every values tensor in packing order, then every
                                                     scale_supers, ...), each tensor at a 64-byte offset
    <model dir>/packed/tp<rank>of<size>-<key>.json   the manifest, written last (so the .bin is complete):
        {"format", "key", "data_bytes", "entries": {"<tensor>|<r0>|<r1>": {"bits", "group", "implied_offset",
                                                                          "tensors": [[dtype, shape, offset], ...]}}}

    key = sha256(the .gguf's path, size and mtime; gguf_pack.cpp's and six_bit_codes.h's source (the layout);
                 zserve's version; this rank's tensor-parallel slice)[:16]
                 (writing one removes this slice's files of other keys: a stale layout's bytes)

A start finds the manifest of its key or builds it: every gguf_pack result is appended to 5
temporary run files as it is packed, joined into the .bin when loading ends, and the .bin then the
.json are renamed into place (two servers building at once each write their own temporary files; the last rename wins,
both complete). A manifest that does not parse, names another key, does not match the .bin's
size, or points outside it is refused with a warning naming the reason, and the cache is
rebuilt. The data bytes carry no checksum (summing 4.7 GB would cost what the cache saves; a
GGUF file has none either): truncation, a changed file and a changed layout are caught, a
flipped bit inside the data is not.

On a hit the whole .bin is read (not memory-mapped) with one read into one fresh buffer, and each
tensor is a view of it: the weights stay in anonymous memory that the allocator backs with huge
pages (decode reads them through the TLB; file-backed pages would be 4 KiB), the cache file's
page-cache pages are not mapped (they do not count in the server's PSS), and the pieces of a
fused matrix (q, k, v; gate, up), packed one after the other, lie back to back in each run, so
joining them is a view, not a copy (layers/block_cat.py): a copy into fresh memory took as long as
the read itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO

import torch

from zserve.model_proc.checkpoints.early_cache_read import EarlyCacheRead

logger = logging.getLogger(__name__)

FORMAT = "zserve-packed-2"  # 2: each entry keeps gguf_pack's implied offset factor
ALIGN_BYTES = 64
# the layout the cached bytes are in: gguf_pack.cpp and the 6-bit units it writes
LAYOUT_SOURCES = tuple(Path(__file__).parents[1] / "kernels" / name for name in ("gguf_pack.cpp", "six_bit_codes.h"))
DTYPES = {str(dtype): dtype for dtype in (torch.uint8, torch.int8, torch.float16)}
READ_THREADS = 2  # a hit's read, split in this many parts (this machine's cores; more do not help a 2-core one)
HUGE_PAGE_BYTES = 2 << 20  # the read's parts start on huge-page boundaries: no page is faulted by two threads
NUM_RUNS = 5  # gguf_pack's tensors: values, scale_supers, scale_subs, offset_supers, offset_subs

# gguf_pack's (values, scale_supers, scale_subs, offset_supers, offset_subs, bits, group, implied_offset)
PackResult = tuple


def cache_key(gguf_file: Path, tp_rank: int, tp_size: int) -> str:
    stat = gguf_file.stat()
    digest = hashlib.sha256()
    for part in (str(gguf_file.resolve()), str(stat.st_size), str(stat.st_mtime_ns), FORMAT, _zserve_version(),
                 f"tp {tp_rank}/{tp_size}"):
        digest.update(part.encode() + b"\0")
    for source in LAYOUT_SOURCES:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def _zserve_version() -> str:
    try:
        return metadata.version("zserve")
    except metadata.PackageNotFoundError:
        return "unknown"


def entry_name(tensor: str, rows: tuple[int, int]) -> str:
    return f"{tensor}|{rows[0]}|{rows[1]}"


@dataclass
class PackedCache:
    """One start's view of the cache: `hits` to read from (None: nothing valid on disk, so this start
    writes one), or a writer of what this start packs. Owned by the GGUFCheckpoint that loads."""

    folder: Path
    prefix: str  # "tp<rank>of<size>": this rank's files
    key: str
    manifest: dict | None = None  # a valid manifest found on disk: read from it
    _buffer: torch.Tensor | None = field(default=None, repr=False)  # a hit: the whole .bin, uint8
    _runs: list[IO[bytes]] = field(default_factory=list, repr=False)  # a build: the 5 run files being written
    _run_bytes: list[int] = field(default_factory=lambda: [0] * NUM_RUNS, repr=False)
    _written: dict = field(default_factory=dict, repr=False)  # a build: entries, offsets within their run
    num_hits: int = 0
    num_packed: int = 0

    @classmethod
    def open(
        cls, model_dir: Path, gguf_file: Path, tp_rank: int = 0, tp_size: int = 1, early: EarlyCacheRead | None = None
    ) -> PackedCache:
        """The cache of `gguf_file` in `model_dir`/packed: read if valid (taken from `early` where it
        read this file while the worker started), else a fresh one to write."""
        folder = Path(model_dir) / "packed"
        cache = cls(folder, f"tp{tp_rank}of{tp_size}", cache_key(gguf_file, tp_rank, tp_size))
        manifest_path, data_path = cache.paths()
        if not manifest_path.is_file() and early is not None:
            early.take(data_path, -1)  # another key's file: freed
        if manifest_path.is_file():
            problem = cache._check(manifest_path, data_path)
            num_bytes = int(cache.manifest["data_bytes"]) if problem is None else -1
            early_buffer = early.take(data_path, num_bytes) if early is not None else None
            if problem is None:
                if early_buffer is not None:  # read while the worker imported torch: shared, not copied
                    cache._buffer = torch.frombuffer(early_buffer, dtype=torch.uint8)
                else:
                    cache._buffer = _read_whole(data_path, num_bytes)
                return cache
            logger.warning("packed cache %s refused (%s): packing from the GGUF file and writing it again",
                           manifest_path, problem)
            cache.manifest = None
        return cache

    def paths(self) -> tuple[Path, Path]:
        stem = f"{self.prefix}-{self.key}"
        return self.folder / f"{stem}.json", self.folder / f"{stem}.bin"

    def _check(self, manifest_path: Path, data_path: Path) -> str | None:
        """Why the manifest on disk cannot be used (None: it can; it is kept in self.manifest)."""
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"the manifest does not parse: {exc}"
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("key") != self.key:
            return "the manifest is of another format or key"
        size = data_path.stat().st_size if data_path.is_file() else -1
        if size != manifest.get("data_bytes"):
            return f"the data file has {size} bytes, the manifest says {manifest.get('data_bytes')}"
        entries = manifest.get("entries")
        if not isinstance(entries, dict):
            return "the manifest lists no entries"
        for name, entry in entries.items():
            try:
                for dtype, shape, offset in entry["tensors"]:
                    num_bytes = _num_bytes(DTYPES[dtype], shape)
                    if not (isinstance(offset, int) and 0 <= offset and offset + num_bytes <= size):
                        return f"entry {name} lies outside the data file"
                int(entry["bits"]), int(entry["group"]), int(entry["implied_offset"])
            except (KeyError, TypeError, ValueError) as exc:
                return f"entry {name} is malformed: {exc!r}"
        self.manifest = manifest
        return None

    def get_or_pack(self, tensor: str, rows: tuple[int, int], pack) -> PackResult:
        """gguf_pack's result for rows `rows` of `tensor`: read from the cache, or `pack()` (then written
        to the one being built)."""
        name = entry_name(tensor, rows)
        if self.manifest is not None:
            entry = self.manifest["entries"].get(name)
            if entry is not None:
                self.num_hits += 1
                return (*(self._view(dtype, shape, offset) for dtype, shape, offset in entry["tensors"]),
                        int(entry["bits"]), int(entry["group"]), int(entry["implied_offset"]))
        result = pack()
        self.num_packed += 1
        if self.manifest is None:  # a hit's cache is never written: an entry it lacks is packed each start
            self._write(name, result)
        return result

    def _view(self, dtype: str, shape: list[int], offset: int) -> torch.Tensor:
        num_bytes = _num_bytes(DTYPES[dtype], shape)
        return self._buffer[offset : offset + num_bytes].view(DTYPES[dtype]).view(shape)

    def _write(self, name: str, result: PackResult) -> None:
        *tensors, bits, group, implied_offset = result
        assert len(tensors) == NUM_RUNS, len(tensors)
        if not self._runs:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._runs = [open(self._run_path(i), "wb") for i in range(NUM_RUNS)]  # noqa: SIM115 - close()
        listed = []
        for run, tensor in enumerate(tensors):
            tensor = tensor.contiguous()
            pad = -self._run_bytes[run] % ALIGN_BYTES
            self._runs[run].write(b"\0" * pad)
            self._run_bytes[run] += pad
            listed.append([str(tensor.dtype), list(tensor.shape), run, self._run_bytes[run]])
            if tensor.numel():
                self._runs[run].write(memoryview(tensor.view(torch.uint8).reshape(-1).numpy()))
            self._run_bytes[run] += _num_bytes(tensor.dtype, tensor.shape)
        self._written[name] = {"bits": int(bits), "group": int(group), "implied_offset": int(implied_offset),
                               "tensors": listed}

    def _run_path(self, run: int) -> Path:
        return self._temporary(self.paths()[1].with_suffix(f".run{run}"))

    def _temporary(self, path: Path) -> Path:
        return path.with_name(f"{path.name}.tmp-{os.getpid()}")

    def close(self, complete: bool) -> None:
        """End this start's use; a cache being built is put in place when loading `complete`d, else dropped."""
        self._buffer = None  # the tensors keep their views of it alive
        runs, self._runs = self._runs, []
        for run in runs:
            run.close()
        if not runs:
            return
        manifest_path, data_path = self.paths()
        try:
            if complete and self._written:
                self._put_in_place(manifest_path, data_path)
        finally:
            for run in range(NUM_RUNS):
                self._run_path(run).unlink(missing_ok=True)

    def _put_in_place(self, manifest_path: Path, data_path: Path) -> None:
        """The runs joined into the .bin (each run at a 64-byte offset), then the manifest: renamed in that order."""
        starts, total = [], 0
        temporary = self._temporary(data_path)
        with open(temporary, "wb") as data:
            for run in range(NUM_RUNS):
                pad = -total % ALIGN_BYTES
                data.write(b"\0" * pad)
                starts.append(total + pad)
                with open(self._run_path(run), "rb") as source:
                    shutil.copyfileobj(source, data, 16 << 20)
                total = starts[-1] + self._run_bytes[run]
        entries = {name: {**entry, "tensors": [[dtype, shape, starts[run] + offset]
                                                for dtype, shape, run, offset in entry["tensors"]]}
                   for name, entry in self._written.items()}
        manifest = {"format": FORMAT, "key": self.key, "data_bytes": total, "entries": entries}
        temporary_manifest = self._temporary(manifest_path)
        temporary_manifest.write_text(json.dumps(manifest), encoding="utf-8")
        manifest_path.unlink(missing_ok=True)  # no manifest names a .bin while it is replaced
        os.replace(temporary, data_path)
        os.replace(temporary_manifest, manifest_path)  # last: the cache is complete from here
        for stale in self.folder.glob(f"{self.prefix}-*"):  # this slice under another key: never read again
            if stale.name not in (manifest_path.name, data_path.name) and ".tmp-" not in stale.name:
                stale.unlink(missing_ok=True)
        logger.info("packed cache written: %s (%.1f MB, %d matrices); later starts read it instead of packing",
                    data_path, total / 1e6, len(self._written))


def _read_whole(path: Path, num_bytes: int, num_threads: int = READ_THREADS) -> torch.Tensor:
    """uint8 [num_bytes]: the file's bytes, in fresh memory, read in `num_threads` parts at once (most
    of a read's time is the kernel faulting in the fresh pages, which each thread does for its part)."""
    buffer = torch.empty(num_bytes, dtype=torch.uint8)
    view = memoryview(buffer.numpy())
    bounds = [num_bytes * i // num_threads // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES for i in range(num_threads)]
    bounds.append(num_bytes)
    with open(path, "rb") as data, ThreadPoolExecutor(num_threads, thread_name_prefix="packed-read") as pool:
        parts = [pool.submit(_read_range, data.fileno(), view, lo, hi, path)
                 for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        for part in parts:
            part.result()  # raises a part's error
    return buffer


def _read_range(fd: int, view: memoryview, lo: int, hi: int, path: Path) -> None:
    done = lo
    while done < hi:
        got = os.preadv(fd, [view[done:hi]], done)
        if got <= 0:
            raise ValueError(f"packed cache {path}: ended at byte {done}")
        done += got


def _num_bytes(dtype: torch.dtype, shape) -> int:
    count = 1
    for dim in shape:
        if not isinstance(dim, int) or dim < 0:
            raise ValueError(f"bad dimension {dim!r}")
        count *= dim
    return count * dtype.itemsize
