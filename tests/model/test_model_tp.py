"""Tensor parallelism on CPU: two gloo ranks, each loading only its shard, give the logits and
greedy tokens of a single rank."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import write_gguf
from testing.model_fixtures import GreedyDriver, make_runner, make_tiny_checkpoint, random_prompt
from testing.server_process import free_port
from zserve.launcher.gguf_model_dir import gguf_model_dir
from zserve.model_proc.model_runner import ModelRunner

TP_SIZE = 2
PROMPT_LENS = (9, 21)
NEW_TOKENS = 12



def run_and_record(runner: ModelRunner) -> dict:
    """Greedy tokens for two prompts run together, and the last logits of a mixed batch; then an
    identical prompt twice, the second taking its K/V from the first (every rank copies its K/V shard)."""
    driver = GreedyDriver(runner)
    seqs = [driver.add(random_prompt(n, seed=n), NEW_TOKENS, chunk_size=8) for n in PROMPT_LENS]
    outputs = driver.generate(seqs)
    fresh = driver.add(random_prompt(6, seed=99), 1)
    logits = runner.last_logits(driver.build_batch(seqs + [fresh]))
    source = driver.add(random_prompt(7, seed=5), NEW_TOKENS)
    shared_outputs = driver.generate([source, driver.add(source.prompt, NEW_TOKENS, kv_source=source)])
    return {"outputs": outputs + shared_outputs, "logits": logits.tolist()}


# gpt2, gemma3: an odd vocab, padded on the last rank (gemma3 tied to its embedding); the MoE kinds split every
# expert's intermediate dimension
KINDS = {
    "llama": {}, "gpt2": {"vocab_size": 601}, "qwen3": {}, "gemma2": {}, "gemma3": {"vocab_size": 601},
    "qwen3_moe": {}, "mixtral": {}, "qwen2_moe": {}, "phi4_partial": {},  # phi4_partial: fused qkv, gate_up split per rank
}
GGUF_KINDS = {"llama": "F16", "qwen3_moe": "Q8_0"}  # kind -> the GGUF weight type of its file (dequantized)


def expert_columns(model: torch.nn.Module) -> int:
    """The first expert's gate_up columns on this rank (0: no experts)."""
    from zserve.model_proc.layers.fused_experts import ExpertMLP

    expert = next((m for m in model.modules() if isinstance(m, ExpertMLP)), None)
    return 0 if expert is None else expert.gate_up_proj.weight_shape[1]


def rank_main(rank: int, model_dirs: dict[str, str], port: int, out_path: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=TP_SIZE)
    try:
        records = {}
        for kind, model_dir in model_dirs.items():
            runner = make_runner(model_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=512, num_threads=1, tp_rank=rank, tp_size=TP_SIZE)
            head = runner.model.lm_head
            records[kind] = {**run_and_record(runner), "shard_rows": head.shard_size}  # vocab / tp
            records[kind]["expert_cols"] = expert_columns(runner.model)
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(records, f)
    finally:
        torch.distributed.destroy_process_group()


def test_two_ranks_match_one(tmp_path, monkeypatch):
    """One pair of rank processes runs every kind (process start-up dominates the cost), and the llama
    as an F16 GGUF file and the qwen3_moe as a Q8_0 one (each rank dequantizes whole tensors, or
    expert slices, and keeps its rows)."""
    model_dirs = {kind: str(make_tiny_checkpoint(tmp_path / kind, kind, **overrides)) for kind, overrides in KINDS.items()}
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "cache")))  # the kernels' build shared
    for kind, weight_type in GGUF_KINDS.items():  # each expert slice of a stacked MoE tensor split too
        gguf_file = write_gguf(model_dirs[kind], tmp_path / f"{kind}.gguf", weight_type)
        model_dirs[f"{kind}_gguf"] = str(gguf_model_dir(gguf_file, with_tokenizer=False))
    out_path = tmp_path / "rank0.json"
    mp.start_processes(rank_main, args=(model_dirs, free_port(), str(out_path)), nprocs=TP_SIZE, start_method="spawn")
    sharded = json.loads(out_path.read_text())
    for kind, overrides in KINDS.items():
        single_runner = make_runner(model_dirs[kind], device="cpu", dtype="float32", page_size=4, kv_cache_tokens=512)
        assert sharded[kind]["expert_cols"] * TP_SIZE == expert_columns(single_runner.model), kind
        single = run_and_record(single_runner)
        vocab = overrides.get("vocab_size", 600)
        assert sharded[kind]["shard_rows"] == -(-vocab // TP_SIZE), kind  # each rank holds half the vocab
        assert sharded[kind]["outputs"] == single["outputs"], kind
        assert single["outputs"][-1] == single["outputs"][-2], kind  # the KV-sharing one decodes as its source
        np.testing.assert_allclose(np.array(sharded[kind]["logits"]), np.array(single["logits"]), atol=1e-4, rtol=0, err_msg=kind)
    for name in (f"{kind}_gguf" for kind in GGUF_KINDS):
        single = run_and_record(make_runner(model_dirs[name], device="cpu", dtype="float32", page_size=4, kv_cache_tokens=512))
        assert sharded[name]["outputs"] == single["outputs"], name
        np.testing.assert_allclose(np.array(sharded[name]["logits"]), np.array(single["logits"]), atol=1e-4, rtol=0, err_msg=name)


def test_heads_must_split(tmp_path):
    model_dir = make_tiny_checkpoint(tmp_path / "q2", "qwen2")  # one KV head
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="1 KV heads do not split across 2 tensor-parallel ranks"):
            make_runner(model_dir, device="cpu", kv_cache_tokens=64, tp_rank=0, tp_size=2)
    finally:
        torch.distributed.destroy_process_group()
