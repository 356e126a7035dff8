"""--packed-cache: a GGUF file's packed matrices written on the first start, read back on the next (the
same bytes: bit-identical logits), refused and rebuilt when stale or corrupt; cat_blocks joins views."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import write_gguf
from testing.model_fixtures import GreedyDriver, make_runner, make_tiny_checkpoint, random_prompt
from zserve.launcher.gguf_model_dir import gguf_model_dir
from zserve.model_proc.checkpoints.early_cache_read import EarlyCacheRead
from zserve.model_proc.checkpoints.packed_cache import PackedCache
from zserve.model_proc.kernels.cpu_kernels import load_gguf_pack
from zserve.model_proc.weights.block_cat import cat_blocks

WIDE = {"hidden_size": 256, "intermediate_size": 512}
needs_gguf_pack = pytest.mark.skipif(load_gguf_pack() is None, reason="the CPU kernels (gguf_pack) are not built here")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "cache")))


@pytest.fixture
def gguf_dir(tmp_path):
    """A Q4_K_M file (Q4_K and Q6_K matrices, q/k/v of two types, a tied embedding) and its model directory."""
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", "llama_tied", **WIDE)
    gguf_file = write_gguf(hf_dir, tmp_path / "tiny-q4_k_m.gguf", "Q4_K_M")
    return gguf_model_dir(gguf_file, with_tokenizer=False), gguf_file


def logits_and_cache(model_dir, packed_cache: str):
    """(the last logits of two prompts, the runner's cache files' names and counts) of a fresh runner."""
    runner = make_runner(model_dir, page_size=4, kv_cache_tokens=256, device="cpu", dtype="bfloat16",
                         quantization="gguf", packed_cache=packed_cache)
    driver = GreedyDriver(runner)
    batch = driver.build_batch([driver.add(random_prompt(n, seed=n), 1) for n in (3, 11)])
    return runner.last_logits(batch)


def cache_files(model_dir) -> list[str]:
    folder = model_dir / "packed"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@needs_gguf_pack
def test_written_once_then_read_back_bit_identical(gguf_dir, caplog):
    model_dir, _ = gguf_dir
    off = logits_and_cache(model_dir, "off")
    assert cache_files(model_dir) == []  # off writes nothing
    with caplog.at_level(logging.INFO, logger="zserve.model_proc"):
        first = logits_and_cache(model_dir, "on")
    assert "packed cache written" in caplog.text and "packed cache: 0 matrices read from" in caplog.text
    files = cache_files(model_dir)
    assert len(files) == 2 and files[0].endswith(".bin") and files[1].endswith(".json")  # no temporaries left
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zserve.model_proc"):
        second = logits_and_cache(model_dir, "on")
    assert "packed cache written" not in caplog.text and " 0 packed from the file" in caplog.text
    assert torch.equal(first, off) and torch.equal(second, off)


@needs_gguf_pack
@pytest.mark.parametrize("damage", ["truncated", "bad json", "offset outside", "other key"])
def test_a_damaged_cache_is_refused_and_rebuilt(gguf_dir, caplog, damage):
    model_dir, _ = gguf_dir
    reference = logits_and_cache(model_dir, "on")
    manifest_name, data_name = sorted(cache_files(model_dir), key=lambda n: n.endswith(".bin"))
    manifest_path, data_path = model_dir / "packed" / manifest_name, model_dir / "packed" / data_name
    manifest = json.loads(manifest_path.read_text())
    if damage == "truncated":
        os.truncate(data_path, data_path.stat().st_size - 1)
    elif damage == "bad json":
        manifest_path.write_text(manifest_path.read_text()[:-10])
    elif damage == "offset outside":
        entry = next(iter(manifest["entries"].values()))
        entry["tensors"][0][2] = manifest["data_bytes"]  # starts at the end: its bytes lie past it
        manifest_path.write_text(json.dumps(manifest))
    else:
        manifest_path.write_text(json.dumps({**manifest, "key": "0" * 16}))
    with caplog.at_level(logging.INFO, logger="zserve.model_proc"):
        rebuilt = logits_and_cache(model_dir, "on")
    assert "refused" in caplog.text and "packed cache written" in caplog.text
    assert torch.equal(rebuilt, reference)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zserve.model_proc"):
        assert torch.equal(logits_and_cache(model_dir, "on"), reference)  # the rebuilt one is read
    assert "refused" not in caplog.text and " 0 packed from the file" in caplog.text


@needs_gguf_pack
def test_a_changed_file_or_layout_gets_a_new_key_and_the_stale_files_go(gguf_dir, monkeypatch):
    model_dir, gguf_file = gguf_dir
    logits_and_cache(model_dir, "on")
    before = cache_files(model_dir)
    key = PackedCache.open(model_dir, gguf_file).key
    os.utime(gguf_file, ns=(gguf_file.stat().st_atime_ns, gguf_file.stat().st_mtime_ns + 10**9))
    assert PackedCache.open(model_dir, gguf_file).key != key  # (the launcher would also make a new model directory)
    assert PackedCache.open(model_dir, gguf_file, tp_rank=1, tp_size=2).key != PackedCache.open(model_dir, gguf_file).key
    logits_and_cache(model_dir, "on")  # this model directory, the file changed: rebuilt under the new key
    after = cache_files(model_dir)
    assert len(after) == 2 and not set(after) & set(before)


def test_cat_blocks_is_a_view_when_the_parts_lie_back_to_back():
    buffer = torch.arange(2 * 3 * 4 + 8, dtype=torch.int16)
    parts = [buffer[0:12].view(3, 4), buffer[12:24].view(3, 4)]
    joined = cat_blocks(parts)
    assert torch.equal(joined, torch.cat(parts)) and joined.data_ptr() == buffer.data_ptr()
    apart = [buffer[0:12].view(3, 4), buffer[16:28].view(3, 4)]  # a gap: copied
    assert torch.equal(cat_blocks(apart), torch.cat(apart)) and cat_blocks(apart).data_ptr() != buffer.data_ptr()
    reversed_parts = parts[::-1]
    assert torch.equal(cat_blocks(reversed_parts), torch.cat(reversed_parts))
    other = [buffer[0:12].view(3, 4), torch.zeros(2, 4, dtype=torch.int16)]
    assert torch.equal(cat_blocks(other), torch.cat(other))


def test_the_early_read_holds_this_slices_one_file_or_nothing(tmp_path):
    """EarlyCacheRead (started at the worker's first line): this rank's single data file, read whole;
    handed over only for that file and size; nothing started without exactly one such file."""
    assert EarlyCacheRead.start(tmp_path, 0, 1) is None  # no cache folder yet
    folder = tmp_path / "packed"
    folder.mkdir()
    data = os.urandom(5 * (2 << 20) + 12345)  # parts of whole huge pages, and a tail
    (folder / "tp0of1-0123.bin").write_bytes(data)
    (folder / "tp0of1-0123.json").write_text("{}")
    (folder / "tp1of2-4567.bin").write_bytes(b"y" * 300)
    read = EarlyCacheRead.start(tmp_path, 0, 1, num_threads=3)
    assert read is not None and read.path == folder / "tp0of1-0123.bin"
    buffer = read.take(folder / "tp0of1-0123.bin", len(data))
    assert buffer is not None and bytes(buffer) == data
    other = EarlyCacheRead.start(tmp_path, 1, 2)
    assert other.take(folder / "tp1of2-9999.bin", 300) is None and other.buffer.closed  # another key: freed
    wrong_size = EarlyCacheRead.start(tmp_path, 1, 2)
    assert wrong_size.take(folder / "tp1of2-4567.bin", 301) is None and wrong_size.buffer.closed
    (folder / "tp0of1-89ab.bin").write_bytes(b"z" * 10)
    assert EarlyCacheRead.start(tmp_path, 0, 1) is None  # two keys: the runner reads the one it wants itself


@needs_gguf_pack
def test_the_cache_read_early_gives_the_same_logits(gguf_dir):
    """The worker's path: the cache file read while the model is built, then handed to PackedCache."""
    model_dir, gguf_file = gguf_dir
    reference = logits_and_cache(model_dir, "on")  # writes the cache
    early = EarlyCacheRead.start(model_dir, 0, 1)
    assert early is not None
    runner = make_runner(model_dir, page_size=4, kv_cache_tokens=256, device="cpu", dtype="bfloat16",
                         quantization="gguf", packed_cache="on", early_cache_read=early)
    assert early.buffer.closed is False  # handed over, not freed: the weights are views of it
    driver = GreedyDriver(runner)
    batch = driver.build_batch([driver.add(random_prompt(n, seed=n), 1) for n in (3, 11)])
    assert torch.equal(runner.last_logits(batch), reference)
    unused = EarlyCacheRead.start(model_dir, 0, 1)
    make_runner(model_dir, page_size=4, kv_cache_tokens=256, device="cpu", dtype="bfloat16", quantization="gguf",
                packed_cache="off", early_cache_read=unused)
    assert unused.buffer.closed  # --packed-cache off (or no cache read): the early read is freed
