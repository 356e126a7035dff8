"""Every architecture through the whole server equals transformers' greedy tokens (fp32).

One server per architecture (a tiny random checkpoint written by transformers, with the byte-level
tokenizer), chunked prefill at 16 tokens, 4-token pages. Over ZMQ: a batch of concurrent prompts of
mixed lengths (most of them chunked), then a prompt that shares a long prefix with an earlier one
(a radix hit, checked in the stats). Over HTTP: /v1/completions on one prompt. Every answer is
compared with transformers' own greedy continuation of the same token ids.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

from testing.model_fixtures import make_tiny_checkpoint
from testing.server_process import free_port, start_server
from zserve.client import Client

FLAGS = ("--dtype", "float32", "--chunked-prefill-size", "16", "--page-size", "4", "--kv-cache-tokens", "2048",
         "--num-threads", "1")  # fmt: skip
# the architectures the model-level parity tests do not already serve end to end (tests/tp serves llama,
# qwen3 and gpt2); sliding-window kinds have windows shorter than the long prompts here
KINDS = ["mistral", "qwen2", "gemma2", "gemma3_mm", "qwen2_moe"]  # qwen3_moe, mixtral: test_moe_served.py
PREFIX = "The quick brown fox jumps over the lazy dog, and the dog did not mind at all. " * 2
BATCH_PROMPTS = ["Hello, world!", PREFIX + "Then it slept.", "你好，世界！ 🙂", "A", PREFIX[:50]]
HIT_PROMPT = PREFIX + "And then it ran away."
MAX_TOKENS = 12


class Reference:
    """transformers on the checkpoint: greedy continuation of the server's token ids."""

    def __init__(self, model_dir):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)

    @torch.no_grad()
    def greedy(self, prompt: str) -> list[int]:
        ids = list(self.tokenizer(prompt)["input_ids"])
        out: list[int] = []
        for _ in range(MAX_TOKENS):  # full recompute, no EOS rule (the server ignores EOS here too)
            out.append(int(self.model(torch.tensor([ids + out])).logits[0, -1].argmax()))
        return out


@pytest.fixture(scope="module", params=KINDS)
def served(request, tmp_path_factory):
    kind = request.param
    model_dir = make_tiny_checkpoint(tmp_path_factory.mktemp(f"served-{kind}"), kind, with_tokenizer=True)
    http_port = free_port()
    handle = start_server(model_dir, *FLAGS, "--http-port", str(http_port), timeout_s=240)
    handle.http_port = http_port
    try:
        yield kind, handle, Reference(model_dir)
    finally:
        code = handle.stop()
    assert code == 0, handle.log_tail()


def test_zmq_batch_chunks_and_radix_hit_equal_transformers(served):
    kind, handle, ref = served
    with Client(handle.port, timeout_s=120) as c:
        req_ids = [c.submit(p, max_tokens=MAX_TOKENS, ignore_eos=True) for p in BATCH_PROMPTS]
        results = [c.result(r) for r in req_ids]
        results.append(c.generate(HIT_PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True))
        stats = c.stats()
    for prompt, result in zip([*BATCH_PROMPTS, HIT_PROMPT], results, strict=True):
        assert result.output_ids == ref.greedy(prompt), f"{kind}: {prompt!r}"
    assert stats["num_prefix_hit_tokens"] > 0, stats


def test_http_completion_equals_transformers(served):
    kind, handle, ref = served
    prompt = PREFIX + "Once more:"
    body = json.dumps({"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{handle.http_port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer = json.load(resp)
    want = ref.tokenizer.decode(ref.greedy(prompt), skip_special_tokens=True)
    assert answer["choices"][0]["text"] == want, kind
