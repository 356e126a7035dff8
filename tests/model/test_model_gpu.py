"""The same parity on CUDA in bf16, with tolerances (bf16 keeps ~3 significant digits); int8
weights (int8_torch) and draft verification on CUDA in fp32, token for token. Skipped where no GPU
is present."""

from __future__ import annotations

import pytest
import torch

from testing.draft_driver import DraftDriver
from testing.int8_oracle import dequantized_copy
from testing.model_fixtures import GreedyDriver, HfReference, make_runner, make_tiny_checkpoint, random_prompt

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
BF16_LOGITS_ATOL = 0.1  # logits of the tiny fixtures are O(1)
NEW_TOKENS = 16


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "gpt2", "llama3_rope", "mistral_window", "qwen2_window"])
def test_cuda_bf16_close_to_transformers_fp32(tmp_path, kind):
    model_dir = make_tiny_checkpoint(tmp_path / kind, kind)
    ref = HfReference(model_dir)
    runner = make_runner(model_dir, device="cuda", page_size=16, kv_cache_tokens=4096)
    assert runner.dtype == torch.bfloat16
    driver = GreedyDriver(runner)
    # mixed phases in one batch: a chunked prompt, a whole prompt, and (after one step) decodes
    seqs = [driver.add(random_prompt(n, seed=n), NEW_TOKENS, chunk_size=c) for n, c in ((40, 16), (7, None), (23, 5))]
    for _ in range(3):
        batch = driver.build_batch(seqs)
        ours = runner.last_logits(batch).cpu()
        for i, seq in enumerate(seqs):
            seq.cached_len += int(batch.extend_lens[i])
            theirs = ref.last_logits(seq.tokens[: seq.cached_len])
            torch.testing.assert_close(ours[i], theirs, atol=BF16_LOGITS_ATOL, rtol=0)
            if seq.cached_len == len(seq.tokens):
                seq.tokens.append(int(theirs.argmax()))  # follow the reference's path


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_cuda_bf16_greedy_starts_like_transformers(tmp_path, kind):
    """bf16 rounding may flip a near-tie late in a run; the first tokens must agree."""
    model_dir = make_tiny_checkpoint(tmp_path / kind, kind)
    ref = HfReference(model_dir)
    driver = GreedyDriver(make_runner(model_dir, device="cuda", page_size=16, kv_cache_tokens=4096))
    prompts = [random_prompt(n, seed=n) for n in (5, 17, 40)]
    outputs = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts])
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out[:4] == ref.generate(prompt, NEW_TOKENS)[:4]


def test_cuda_identical_prompts_share_the_kv_and_logits_of_the_first(tmp_path):
    """The slot copy and the shared logits row on CUDA (the varlen path where flash-attn is installed)."""
    model_dir = make_tiny_checkpoint(tmp_path / "llama", "llama")
    ref = HfReference(model_dir)
    runner = make_runner(model_dir, device="cuda", page_size=16, kv_cache_tokens=4096)
    driver = GreedyDriver(runner)
    prompt = random_prompt(37, seed=4)
    source = driver.add(prompt, NEW_TOKENS)
    seqs = [source, *(driver.add(prompt, NEW_TOKENS, kv_source=source) for _ in range(2))]
    batch = driver.step(seqs)
    assert batch.kv_source.tolist() == [0, 0, 0]
    src_slots, dst_slots = (torch.from_numpy(s).cuda() for s in batch.shared_kv_slots(16))
    for cache in (*runner.kv_pool.k, *runner.kv_pool.v):
        assert torch.equal(cache[:, dst_slots], cache[:, src_slots])
    outputs = driver.generate(seqs)  # bf16 rounding may flip a near-tie late in a run: the first tokens agree
    expected = ref.generate(prompt, NEW_TOKENS)[:4]
    assert [out[:4] for out in outputs] == [expected] * 3


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_cuda_int8_greedy_equals_transformers_on_the_dequantized_weights(tmp_path, kind):
    """--quantization int8 on CUDA (int8_torch: dequantized on the fly for torch.mm), fp32 compute."""
    model_dir = make_tiny_checkpoint(tmp_path / "model", kind)
    oracle = HfReference(dequantized_copy(model_dir, tmp_path / "dequantized"))
    runner = make_runner(model_dir, device="cuda", dtype="float32", page_size=16, kv_cache_tokens=4096, quantization="int8")
    assert runner.gemm_backend == "int8_torch"
    driver = GreedyDriver(runner)
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 23)]
    outputs = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts])
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out == oracle.generate(prompt, NEW_TOKENS), f"{kind}: prompt of {len(prompt)} tokens"


def test_cuda_drafts_of_the_true_text_are_accepted_and_a_wrong_one_stops_them(tmp_path):
    """Draft verification (model_proc/draft_verifier.py) on CUDA, fp32: drafts copied from
    transformers' greedy text are all accepted, a wrong draft at j accepts exactly j, and the text
    stays transformers' greedy text, plain decoding included."""
    model_dir = make_tiny_checkpoint(tmp_path / "llama", "llama")
    prompt = random_prompt(9, seed=21)
    truth = HfReference(model_dir).generate(prompt, 48)
    driver = DraftDriver(make_runner(model_dir, device="cuda", dtype="float32", page_size=16, kv_cache_tokens=4096))
    seq = driver.add(prompt, 40)
    driver.step([seq])
    for d, j in ((4, 4), (1, 1), (5, 2), (3, 0), (6, 6), (2, 1)):  # j == d: every draft right
        done = len(seq.output_ids)
        draft = truth[done : done + d]
        if j < d:
            draft[j] = (draft[j] + 1) % 600  # not the model's token
        _, result = driver.step_drafted([seq], [draft])
        assert result.num_accepted.tolist() == [j]
        assert seq.output_ids == truth[: len(seq.output_ids)]
    driver.generate([seq])
    assert seq.output_ids == truth[: len(seq.output_ids)]
