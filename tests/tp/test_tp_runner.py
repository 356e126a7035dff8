"""The worker's side of tensor parallelism without the server: each rank reads only its shard of
the checkpoint; ranks joined by `tp_group` size a memory-based KV pool identically, refuse to run
with different settings, and give a single rank's last-position logits (architectures that
tests/test_model_tp.py does not cover: tied embeddings, a head_dim apart from hidden / heads)."""

from __future__ import annotations

import json

import numpy as np
import torch
import torch.multiprocessing as mp

from testing.model_fixtures import GreedyDriver, make_runner, make_tiny_checkpoint, random_prompt
from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.model_runner import ModelRunner
from zserve.model_proc.tp_group import check_same_on_all_ranks, settings_fingerprint, tp_group

KINDS = ("llama_tied", "mistral")


def bytes_read_by_rank(model_dir, tp_rank: int, tp_size: int, monkeypatch) -> int:
    total = 0
    original = Checkpoint.read

    def counting_read(self, *args, **kwargs):
        nonlocal total
        tensor = original(self, *args, **kwargs)
        total += tensor.numel() * tensor.element_size()
        return tensor

    monkeypatch.setattr(Checkpoint, "read", counting_read)
    make_runner(model_dir, device="cpu", kv_cache_tokens=64, num_threads=1, tp_rank=tp_rank, tp_size=tp_size)
    monkeypatch.undo()
    return total


def test_each_rank_reads_only_its_shard(tmp_path, monkeypatch):
    model_dir = make_tiny_checkpoint(tmp_path / "m", "llama", num_shards=2)
    whole = bytes_read_by_rank(model_dir, 0, 1, monkeypatch)
    # one process stands for rank 1 of 2: loading needs the group to exist, not its peers
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        shard = bytes_read_by_rank(model_dir, 1, 2, monkeypatch)
    finally:
        torch.distributed.destroy_process_group()
    # every matrix is split in two; only norm weights (a few KB) are read whole by both ranks
    assert 0.5 * whole <= shard < 0.52 * whole, (shard, whole)


def last_logits(runner: ModelRunner) -> list:
    driver = GreedyDriver(runner)
    seqs = [driver.add(random_prompt(n, seed=n), 4, chunk_size=8) for n in (7, 19)]
    driver.generate(seqs)
    return runner.last_logits(driver.build_batch(seqs + [driver.add(random_prompt(5, seed=5), 1)])).tolist()


def rank_main(rank: int, model_dirs: dict[str, str], store: str, out_path: str) -> None:
    torch.set_num_threads(1)
    record: dict = {}
    with tp_group(f"file://{store}", rank, 2, torch.device("cpu"), timeout_s=120):
        for kind, model_dir in model_dirs.items():
            runner = make_runner(model_dir, device="cpu", dtype="float32", page_size=4, kv_memory_fraction=0.001, num_threads=1, tp_rank=rank, tp_size=2)
            record[kind] = {"num_pages": runner.num_pages_total, "logits": last_logits(runner)}
        try:
            check_same_on_all_ranks(1000 + rank, torch.device("cpu"), "settings")  # rank 1 differs
        except ValueError as exc:
            record["mismatch"] = str(exc)
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(record, f)


def test_joined_ranks_agree_on_the_pool_and_match_one_rank(tmp_path):
    model_dirs = {kind: str(make_tiny_checkpoint(tmp_path / kind, kind)) for kind in KINDS}
    out_path = tmp_path / "rank.json"
    mp.start_processes(rank_main, args=(model_dirs, str(tmp_path / "store"), str(out_path)), nprocs=2, start_method="spawn")
    ranks = [json.loads((tmp_path / f"rank.json.{r}").read_text()) for r in (0, 1)]
    for kind in KINDS:
        assert ranks[0][kind]["num_pages"] == ranks[1][kind]["num_pages"], kind  # min over the ranks' free memory
        single = make_runner(model_dirs[kind], device="cpu", dtype="float32", page_size=4, kv_cache_tokens=512, num_threads=1)
        expected = np.array(last_logits(single))
        for rank in ranks:
            np.testing.assert_allclose(np.array(rank[kind]["logits"]), expected, atol=1e-4, rtol=0, err_msg=kind)
    for rank in ranks:
        assert "started with different settings" in rank["mismatch"]


def test_settings_fingerprint_depends_on_model_and_settings(tmp_path):
    model_dir = make_tiny_checkpoint(tmp_path / "m", "llama")
    base = settings_fingerprint(str(model_dir), page_size=16, dtype="auto")
    assert base == settings_fingerprint(str(model_dir), dtype="auto", page_size=16)
    assert base != settings_fingerprint(str(model_dir), page_size=4, dtype="auto")
    assert 0 <= base < 2**63
