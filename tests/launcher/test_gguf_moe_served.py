"""`launch_server --model file.gguf` on a mixture-of-experts GGUF: the tiny qwen3_moe fixture
written as an F32 `qwen3moe` file (its tokenizer in the metadata), served: token-id prompts of mixed
lengths in one batch, one twice (a radix hit), answer transformers' greedy tokens on the source
safetensors. A `qwen2moe` file (no GGUF reader here) is refused in one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import write_gguf
from testing.model_fixtures import HfReference, make_tiny_checkpoint, random_prompt
from testing.paths import REPO_ROOT
from testing.server_process import start_server
from zserve.client import Client

FLAGS = ("--page-size", "4", "--kv-cache-tokens", "2048", "--num-threads", "1", "--dtype", "float32",
         "--chunked-prefill-size", "8")
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe-gguf")
    hf_dir = make_tiny_checkpoint(root / "hf", "qwen3_moe", with_tokenizer=True)
    return hf_dir, write_gguf(hf_dir, root / "tiny-qwen3-moe.F32.gguf", "F32"), root


def test_served_qwen3moe_gguf_matches_transformers(moe_gguf):
    hf_dir, gguf_file, root = moe_gguf
    prompts = [random_prompt(n, seed=n) for n in (3, 13, 29)]
    handle = start_server(gguf_file, *FLAGS, env={"ZSERVE_CACHE_DIR": str(private_cache_dir(root / "cache"))},
                          timeout_s=300)
    try:
        with Client(handle.port, timeout_s=120) as c:
            bodies = [{"input_ids": p} for p in prompts]
            first = c.results(c.submit_all(bodies, max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))
            again = c.generate(input_ids=prompts[2], max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    finally:
        assert handle.stop() == 0, handle.log()
    reference = HfReference(hf_dir)
    expected = [reference.generate(p, NEW_TOKENS) for p in prompts]
    assert [r.output_ids for r in first] == expected
    assert again.output_ids == expected[2]


def test_a_qwen2moe_gguf_is_refused_at_start(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "q2moe.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2moe")
    writer.add_block_count(1)
    writer.add_expert_count(8)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), ZSERVE_CACHE_DIR=str(private_cache_dir(tmp_path / "cache")))
    proc = subprocess.run([sys.executable, "-m", "zserve.launcher", "--port", "0", "--zmq-port", "0", "--model", str(path)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if not line.split()[1:2] == ["launcher"]]  # less INFO logs
    assert len(errors) == 1 and errors[0].startswith("launch_server: error: "), proc.stderr
    assert "GGUF architecture 'qwen2moe' is not supported" in errors[0] and "Traceback" not in proc.stderr
