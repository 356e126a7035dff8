"""A GGUF file's header checked against the file before gguf.GGUFReader maps it, so a truncated or
lying file is refused in one line (a ValueError naming the file and the tensor) instead of a numpy
reshape error, an IndexError, or a tensor silently read from its neighbour's bytes.

    magic "GGUF", version u32 (2 or 3), tensor count u64, key/value count u64
    key/values: key string (u64 length + bytes), value type u32, value (scalar, string, array)
    tensor infos: name string, n_dims u32, dims u64 x n_dims (innermost first), type u32, offset u64
    padding to `general.alignment` (32 unless given)
    data: each tensor at data start + its offset, (product of dims) / block values * block bytes long

Every read is bounds-checked against the file's size. Per tensor: the type is one zserve's loader
reads (KNOWN_TYPES); every dim is positive and the innermost a multiple of the type's block; the
offset is aligned; the bytes lie within the file and overlap no other tensor's (a declared type
whose byte count does not match the layout overlaps its neighbour or runs past the end).

No torch here (common/): the model worker opens its file through `open_checked_reader`
(model_proc/checkpoints/gguf_checkpoint.py), and the launcher, which may not import model_proc, can check one too.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from zserve.common.int_math import cdiv

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# F32/F16/BF16 read as stored, the rest dequantized by gguf.quants (model_proc/checkpoints/gguf_checkpoint.py)
KNOWN_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
               "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "IQ1_M", "TQ1_0", "TQ2_0",
               "MXFP4")
SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType -> size
STRING_TYPE, ARRAY_TYPE, UINT32_TYPE = 8, 9, 4
LENGTH = struct.Struct("<Q")  # a GGUF string's length


class GGUFFormatError(ValueError):
    """One line: what is wrong with which file (and tensor)."""


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as the tensor-info section declares it."""

    name: str
    dims: tuple[int, ...]  # innermost first, as GGML lists them
    type_id: int
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class GGUFLayout:
    """Where a GGUF file's header says its tensors are."""

    tensors: list[TensorInfo]
    data_start: int  # the data section's first byte
    alignment: int
    file_size: int
    strings: dict[str, str]  # the metadata's string values by key (arrays are skipped, not read)


class _Cursor:
    """Bounds-checked little-endian reads from the mapped file."""

    def __init__(self, data: mmap.mmap | bytes, where: str):
        self.data, self.pos, self.where = data, 0, where

    def take(self, num_bytes: int, what: str) -> bytes:
        if num_bytes < 0 or self.pos + num_bytes > len(self.data):
            raise GGUFFormatError(f"{self.where}: the file ends inside its header ({what} at byte {self.pos} "
                                  f"needs {num_bytes} bytes of {len(self.data) - self.pos} left): truncated or corrupt")
        chunk = self.data[self.pos:self.pos + num_bytes]
        self.pos += num_bytes
        return chunk

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str) -> str:
        return self.take(self.u64(what), what).decode("utf-8", errors="replace")

    def skip_value(self, value_type: int, key: str) -> None:
        if value_type == STRING_TYPE:
            self.take(self.u64(key), key)
        elif value_type == ARRAY_TYPE:
            item_type, count = self.u32(key), self.u64(key)
            if item_type in SCALAR_BYTES:
                self.take(count * SCALAR_BYTES[item_type], key)
            elif item_type == STRING_TYPE:
                self._skip_strings(count, key)
            else:
                for _ in range(count):  # strings (or nested arrays): each runs to its own length
                    self.skip_value(item_type, key)
        elif value_type in SCALAR_BYTES:
            self.take(SCALAR_BYTES[value_type], key)
        else:
            raise GGUFFormatError(f"{self.where}: metadata key {key!r} has unknown value type {value_type}")

    def _skip_strings(self, count: int, key: str) -> None:
        """`count` strings (a length, then its bytes) in one tight loop: a vocabulary's 50-150k tokens and merges
        went through `take` twice each (0.3 s of every worker's start on a 2-core machine)."""
        data, pos, end, length_at = self.data, self.pos, len(self.data), LENGTH.unpack_from
        for _ in range(count):
            if pos + 8 > end:
                break
            pos += 8 + length_at(data, pos)[0]
            if pos > end:
                break
        else:
            self.pos = pos
            return
        self.pos = min(pos, end)
        self.take(end + 1 - self.pos, key)  # raises: the file ends inside its header


def read_layout(gguf_file: Path) -> GGUFLayout:
    """The layout `gguf_file`'s header declares, every read in bounds."""
    where = str(gguf_file)
    with open(gguf_file, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise GGUFFormatError(f"{where}: the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            cur = _Cursor(data, where)
            if cur.take(4, "magic") != GGUF_MAGIC:
                raise GGUFFormatError(f"{where}: not a GGUF file (no GGUF magic)")
            version = cur.u32("version")
            if version not in (2, 3):
                raise GGUFFormatError(f"{where}: GGUF version {version} is not 2 or 3")
            num_tensors, num_kv = cur.u64("tensor count"), cur.u64("key/value count")
            alignment, strings = DEFAULT_ALIGNMENT, {}
            for _ in range(num_kv):
                key = cur.string("a metadata key")
                value_type = cur.u32(key)
                if key == "general.alignment" and value_type == UINT32_TYPE:
                    alignment = cur.u32(key)
                elif value_type == STRING_TYPE:
                    strings[key] = cur.string(key)
                else:
                    cur.skip_value(value_type, key)
            if alignment <= 0 or alignment & (alignment - 1):
                raise GGUFFormatError(f"{where}: general.alignment {alignment} is not a power of two")
            infos = [_tensor_info(cur) for _ in range(num_tensors)]
            return GGUFLayout(infos, cdiv(cur.pos, alignment) * alignment, alignment, size, strings)


def _tensor_info(cur: _Cursor) -> TensorInfo:
    name = cur.string("a tensor name")
    num_dims = cur.u32(f"tensor {name!r}'s dims")
    if not 1 <= num_dims <= MAX_DIMS:
        raise GGUFFormatError(f"{cur.where}: tensor {name!r} has {num_dims} dims; expected 1 to {MAX_DIMS}")
    dims = tuple(cur.u64(f"tensor {name!r}'s dims") for _ in range(num_dims))
    return TensorInfo(name, dims, cur.u32(f"tensor {name!r}'s type"), cur.u64(f"tensor {name!r}'s offset"))


def check_gguf_file(gguf_file: str | Path) -> GGUFLayout:
    """Raise GGUFFormatError (a ValueError, one line) if a tensor of `gguf_file` is not what the
    loader can read from where the header says it is; else the layout, checked."""
    import gguf

    gguf_file = Path(gguf_file)
    layout = read_layout(gguf_file)
    data_start, alignment, size = layout.data_start, layout.alignment, layout.file_size
    spans = []
    for t in layout.tensors:
        where = f"{gguf_file}: tensor {t.name!r}"
        try:
            qtype = gguf.GGMLQuantizationType(t.type_id)
        except ValueError:
            raise GGUFFormatError(f"{where} has unknown type id {t.type_id}") from None
        if qtype.name not in KNOWN_TYPES:
            raise GGUFFormatError(f"{where} has type {qtype.name}, which zserve does not read")
        block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        if any(d <= 0 for d in t.dims) or t.dims[0] % block_values:
            raise GGUFFormatError(f"{where} has shape {list(t.dims)}: dims must be positive and the innermost "
                                  f"({t.dims[0]}) a multiple of {qtype.name}'s block of {block_values}")
        num_values = 1
        for d in t.dims:
            num_values *= d
        start, num_bytes = data_start + t.offset, num_values // block_values * block_bytes
        if t.offset % alignment:
            raise GGUFFormatError(f"{where} has offset {t.offset}, not a multiple of the alignment {alignment}")
        if start + num_bytes > size:
            raise GGUFFormatError(f"{where} ({qtype.name} {list(t.dims)}: {num_bytes} bytes at byte {start}) runs "
                                  f"past the end of the file ({size} bytes): truncated, or its header lies")
        spans.append((start, start + num_bytes, t.name, qtype.name))
    spans.sort()
    for (_, end, name, type_name), (next_start, _, next_name, _) in pairwise(spans):
        if end > next_start:
            raise GGUFFormatError(f"{gguf_file}: tensor {name!r} ({type_name}) overlaps tensor {next_name!r}: "
                                  f"its declared type or shape does not match the file's layout")
    names = [t.name for t in layout.tensors]
    if len(set(names)) != len(names):
        duplicate = next(name for name in names if names.count(name) > 1)
        raise GGUFFormatError(f"{gguf_file}: tensor {duplicate!r} is duplicated in the header")
    return layout


def open_checked_reader(gguf_file: str | Path):
    """gguf.GGUFReader of `gguf_file` once check_gguf_file passes; the reader's own refusals (bad
    magic, version, duplicate names, a shape it cannot map) as one GGUFFormatError too."""
    import gguf

    check_gguf_file(gguf_file)
    try:
        return gguf.GGUFReader(str(gguf_file))
    except (ValueError, KeyError, IndexError) as exc:  # what the reader raises on a malformed header
        raise GGUFFormatError(f"{gguf_file}: not a readable GGUF file ({exc})") from None
