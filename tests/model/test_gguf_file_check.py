"""common/gguf_file_check.py: a valid GGUF passes; a truncated file, a tensor-info offset that
lies, and a type id patched to a wrong, unread or unknown type are each refused with one line (a
ValueError naming the file and the tensor), before gguf.GGUFReader could crash or read the wrong
bytes; GGUFCheckpoint refuses such a file the same way.

The files are written by GGUFWriter and patched in place: a tensor's info is its name, then n_dims
u32, dims u64 x n_dims, type u32, offset u64 (the names are unique in the file, so found by search).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import write_gguf
from testing.model_fixtures import make_tiny_checkpoint
from zserve.common.gguf_file_check import check_gguf_file, open_checked_reader
from zserve.launcher.gguf_model_dir import gguf_model_dir
from zserve.model_proc.checkpoints.gguf_checkpoint import GGUFCheckpoint

TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "I32": 26}


def write_small(path: Path) -> Path:
    """Three tensors: first.weight F32 [8], second.weight Q8_0 [4, 64], third.weight F16 [16, 32]."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("first.weight", np.ones(8, np.float32))
    q8 = gguf.quants.quantize(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("second.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("third.weight", np.zeros((16, 32), np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def patch_info(path: Path, name: str, *, type_id: int | None = None, offset: int | None = None) -> None:
    """Overwrite tensor `name`'s type id or offset in the tensor-info section."""
    raw = bytearray(path.read_bytes())
    pos = raw.index(name.encode()) + len(name)
    num_dims = struct.unpack_from("<I", raw, pos)[0]
    type_pos = pos + 4 + 8 * num_dims
    if type_id is not None:
        struct.pack_into("<I", raw, type_pos, type_id)
    if offset is not None:
        struct.pack_into("<Q", raw, type_pos + 4, offset)
    path.write_bytes(bytes(raw))


def one_line_error(path: Path, *fragments: str) -> str:
    with pytest.raises(ValueError) as info:
        check_gguf_file(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.fixture()
def small(tmp_path):
    return write_small(tmp_path / "small.gguf")


def test_a_valid_file_passes(small):
    check_gguf_file(small)
    reader = open_checked_reader(small)
    assert [t.name for t in reader.tensors] == ["first.weight", "second.weight", "third.weight"]


def test_a_truncated_file_is_refused(small):
    raw = small.read_bytes()
    small.write_bytes(raw[:-40])  # into third.weight's 1024 bytes
    one_line_error(small, "'third.weight'", "past the end of the file")
    small.write_bytes(raw[:60])  # inside the key/values
    one_line_error(small, "ends inside its header")
    small.write_bytes(b"")
    one_line_error(small, "empty")


def test_an_offset_that_lies_is_refused(small):
    patch_info(small, "second.weight", offset=0)  # onto first.weight's bytes
    one_line_error(small, "'first.weight'", "overlaps tensor 'second.weight'")
    patch_info(small, "second.weight", offset=1 << 40)
    one_line_error(small, "'second.weight'", "past the end of the file")
    patch_info(small, "second.weight", offset=40)
    one_line_error(small, "'second.weight'", "not a multiple of the alignment 32")


def test_a_wrong_type_is_refused(small):
    patch_info(small, "first.weight", type_id=TYPE_IDS["F16"])  # fewer bytes: fits, but
    check_gguf_file(small)  # a smaller declared type inside its own span is not detectable from the layout
    patch_info(small, "second.weight", type_id=TYPE_IDS["F16"])  # 2 bytes a value, not Q8_0's 34 per 32
    one_line_error(small, "'second.weight'", "overlaps tensor 'third.weight'")
    patch_info(small, "second.weight", type_id=TYPE_IDS["Q4_K"])  # rows of 64: not whole 256-value blocks
    one_line_error(small, "'second.weight'", "multiple of Q4_K's block of 256")
    patch_info(small, "second.weight", type_id=TYPE_IDS["Q8_0"])
    patch_info(small, "third.weight", type_id=TYPE_IDS["I32"])
    one_line_error(small, "'third.weight'", "I32, which zserve does not read")
    patch_info(small, "third.weight", type_id=99)
    one_line_error(small, "'third.weight'", "unknown type id 99")


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    one_line_error(path, "not a GGUF file")


def test_the_checkpoint_refuses_a_truncated_file_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "cache")))
    gguf_file = write_gguf(make_tiny_checkpoint(tmp_path / "hf", "llama"), tmp_path / "tiny.gguf", "Q8_0")
    model_dir = gguf_model_dir(gguf_file, with_tokenizer=False)
    gguf_file.write_bytes(gguf_file.read_bytes()[:-1000])  # damaged after the launcher read its metadata
    with pytest.raises(ValueError) as info:
        GGUFCheckpoint(model_dir, gguf_file)
    assert "\n" not in str(info.value) and str(gguf_file) in str(info.value) and "past the end" in str(info.value)


def test_the_readers_own_refusal_is_one_line_too(small):
    raw = small.read_bytes()
    small.write_bytes(raw.replace(b"third.weight", b"first.weight"))  # two tensors of one name
    with pytest.raises(ValueError) as info:
        open_checked_reader(small)
    assert "\n" not in str(info.value) and str(small) in str(info.value) and "duplicated" in str(info.value)


def test_a_file_that_ends_inside_a_string_array_is_refused(tmp_path):
    """A vocabulary-like array of strings (skipped in one loop, not string by string) that the file cuts
    short, at a length or inside a string's bytes, is refused in one line; whole, the file passes."""
    import gguf

    path = tmp_path / "tokens.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list([f"token{i}" for i in range(1000)])
    writer.add_tensor("first.weight", np.ones(8, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    check_gguf_file(path)
    raw = path.read_bytes()
    start = raw.index(b"token0")
    for cut in (start + 3, start + 8 * 14 + 4):  # inside token0's bytes; inside a later token's length
        cut_path = tmp_path / f"cut{cut}.gguf"
        cut_path.write_bytes(raw[:cut])
        one_line_error(cut_path, "tokenizer.ggml.tokens", "truncated")
