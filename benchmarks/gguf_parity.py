"""Greedy parity of zserve's GGUF loading against transformers' own GGUF loader, on a real file
(the suite's tests use tiny generated GGUF files; this checks one made by llama.cpp's converter):

    bash ../shared/peers/llama_cpp_setup.sh        # writes ~/.cache/zserve-peer-llamacpp/smollm2-f16.gguf
    .venv/bin/python benchmarks/gguf_parity.py ~/.cache/zserve-peer-llamacpp/smollm2-f16.gguf

Both run in fp32 on the CPU; chat prompts from the file's own tokenizer and template; prints each
answer and how many of the prompts gave identical token ids (exit status 1 if any differs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testing.model_fixtures import GreedyDriver, make_runner  # noqa: E402
from zserve.launcher.demo_model import _load_gguf_model  # noqa: E402
from zserve.launcher.gguf_model_dir import gguf_model_dir  # noqa: E402

QUESTIONS = ("What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
             "Explain gravity to a child.", "Translate 'good morning' to Spanish.")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gguf", type=Path)
    p.add_argument("--max-tokens", type=int, default=24)
    args = p.parse_args()
    from transformers import AutoTokenizer

    model_dir = gguf_model_dir(args.gguf, with_tokenizer=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_dict=True)["input_ids"]
               for q in QUESTIONS]
    driver = GreedyDriver(make_runner(model_dir, page_size=16, kv_cache_tokens=4096, device="cpu", dtype="float32"))
    ours = driver.generate([driver.add(prompt, args.max_tokens) for prompt in prompts])
    reference = _load_gguf_model(args.gguf)
    num_same = 0
    for question, prompt, out in zip(QUESTIONS, prompts, ours, strict=True):
        ref = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                                 eos_token_id=None, pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
        same = ref[0, len(prompt):].tolist() == out
        num_same += same
        print(f"{question!r}: {'identical' if same else 'DIFFERENT'}: {tokenizer.decode(out)!r}")
    print(f"{args.gguf.name}: {num_same}/{len(QUESTIONS)} prompts with identical greedy tokens ({args.max_tokens} each)")
    return 0 if num_same == len(QUESTIONS) else 1


if __name__ == "__main__":
    sys.exit(main())
