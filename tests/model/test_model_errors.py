"""Bad model directories and bad batches fail with errors that name the culprit."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from testing.model_fixtures import make_runner, make_tiny_checkpoint
from zserve.common.forward_batch import ForwardBatch, SamplingArrays


@pytest.fixture(scope="module")
def runner(llama_dir):
    return make_runner(llama_dir, device="cpu", page_size=4, kv_cache_tokens=64)  # 16 pages


def copy_checkpoint(src, dst, edit):
    dst.mkdir()
    for name in ("config.json", "generation_config.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def batch(input_ids, cached_lens, page_ids, num_pages, page_size=4) -> ForwardBatch:
    n = len(cached_lens)
    extend = [len(input_ids)] if n == 1 else [1] * n
    return ForwardBatch(
        step_id=7, input_ids=np.asarray(input_ids, np.int32), cached_lens=np.asarray(cached_lens, np.int32),
        extend_lens=np.asarray(extend, np.int32), page_ids=np.asarray(page_ids, np.int32),
        num_pages=np.asarray(num_pages, np.int32), is_sampled=np.ones(n, bool), return_logprob=np.zeros(n, bool),
        sampling=SamplingArrays.greedy(n),
    )


def test_missing_model_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_runner(tmp_path / "absent", device="cpu", kv_cache_tokens=64)


def test_no_weights(tmp_path, llama_dir):
    (tmp_path / "config.json").write_bytes((llama_dir / "config.json").read_bytes())
    with pytest.raises(FileNotFoundError, match="expected model.safetensors or model.safetensors.index.json"):
        make_runner(tmp_path, device="cpu", kv_cache_tokens=64)


def test_corrupt_weights_file(tmp_path, llama_dir):
    (tmp_path / "config.json").write_bytes((llama_dir / "config.json").read_bytes())
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!")
    with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors file"):
        make_runner(tmp_path, device="cpu", kv_cache_tokens=64)


def test_unsupported_architecture(tmp_path, llama_dir):
    text = (llama_dir / "config.json").read_text().replace("LlamaForCausalLM", "FalconForCausalLM")
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match="'FalconForCausalLM' is not supported; supported: .*LlamaForCausalLM"):
        make_runner(tmp_path, device="cpu", kv_cache_tokens=64)


def test_weight_with_wrong_shape_is_named(tmp_path, llama_dir):
    name = "model.layers.1.self_attn.k_proj.weight"

    def shrink(tensors):
        tensors[name] = tensors[name][:16].clone()

    bad = copy_checkpoint(llama_dir, tmp_path / "bad", shrink)
    with pytest.raises(ValueError, match=rf"tensor '{name}' in .*model.safetensors has shape \[16, 64\], but config.json implies \[32, 64\]"):
        make_runner(bad, device="cpu", kv_cache_tokens=64)


def test_missing_weight_is_named(tmp_path, llama_dir):
    bad = copy_checkpoint(llama_dir, tmp_path / "bad", lambda t: t.pop("model.layers.0.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match="tensor 'model.layers.0.mlp.up_proj.weight' is missing"):
        make_runner(bad, device="cpu", kv_cache_tokens=64)


def test_sharded_index_pointing_at_missing_file(tmp_path):
    model_dir = make_tiny_checkpoint(tmp_path / "m", "llama", num_shards=2)
    shard = sorted(model_dir.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=f"{shard.name} is listed in .*index.json but missing"):
        make_runner(model_dir, device="cpu", kv_cache_tokens=64)


def test_page_outside_pool_names_the_slots(runner):
    assert runner.num_pages_total == 16
    with pytest.raises(ValueError, match=r"page id 16 \(slots 64..67\) is outside the KV pool of 16 pages"):
        runner.run(batch([5, 6, 7, 8, 9], [0], [3, 16], [2]))
    with pytest.raises(ValueError, match="page id -1"):
        runner.run(batch([5], [4], [0, -1], [2]))


def test_inconsistent_batch(runner):
    with pytest.raises(ValueError, match="request 0 has 1 pages for 5 tokens"):
        runner.run(batch([5, 6, 7, 8, 9], [0], [3], [1]))


def test_past_context_and_vocab(runner):
    ctx = runner.config.context_len
    with pytest.raises(ValueError, match=f"past the model's context of {ctx}"):
        runner.run(batch([5], [ctx], (list(range(16)) * 5)[:65], [65]))
    with pytest.raises(ValueError, match="token id 600 is outside the vocabulary of 600"):
        runner.run(batch([5, 600], [0], [0], [1]))


def test_bad_runner_arguments(llama_dir):
    with pytest.raises(ValueError, match="needs torch.distributed"):
        make_runner(llama_dir, device="cpu", kv_cache_tokens=64, tp_size=2)
    with pytest.raises(ValueError, match="dtype 'int8'"):
        make_runner(llama_dir, device="cpu", dtype="int8", kv_cache_tokens=64)
