"""HfStaticBatcher: the transformers baseline of the offline benchmark.

Static batching as a plain transformers user would do it: requests in arrival order, `batch_size`
at a time, prompts left-padded to the batch's longest, `generate` (greedy, KV cache on) for the
batch's longest output, EOS suppressed (`min_new_tokens`), like `--ignore-eos` on the server.
Only the tokens each request asked for count as output; the rest of a short request's row is
the price of static batching and is reported separately (`num_padded_output_tokens`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from benchmarks.workloads import BenchRequest


@dataclass(frozen=True, slots=True)
class HfRun:
    batch_size: int
    num_requests: int
    duration_s: float
    num_prompt_tokens: int
    num_output_tokens: int  # asked for: sum of max_tokens
    num_padded_output_tokens: int  # generated beyond a request's max_tokens to finish its batch

    @property
    def output_throughput(self) -> float:
        return self.num_output_tokens / self.duration_s

    @property
    def total_throughput(self) -> float:
        return (self.num_prompt_tokens + self.num_output_tokens) / self.duration_s

    def to_json(self) -> dict:
        return {
            "batch_size": self.batch_size, "num_requests": self.num_requests, "duration_s": self.duration_s,
            "num_prompt_tokens": self.num_prompt_tokens, "num_output_tokens": self.num_output_tokens,
            "num_padded_output_tokens": self.num_padded_output_tokens,
            "output_throughput": self.output_throughput, "total_throughput": self.total_throughput,
        }


class HfStaticBatcher:
    def __init__(self, model_dir: str | Path, num_threads: int, dtype: str = "float32"):
        """`dtype`: the weights' (float32, bfloat16, float16), as zserve's --dtype in the same comparison."""
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(num_threads)
        self.num_threads = num_threads
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
        config = self.model.config
        eos = config.eos_token_id
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos or 0)

    def run(self, requests: list[BenchRequest], batch_size: int, show_progress: bool = True, desc: str = "transformers") -> HfRun:
        if any(r.input_ids is None for r in requests):
            raise ValueError("the transformers baseline takes token-id requests only")
        batches = [requests[i:i + batch_size] for i in range(0, len(requests), batch_size)]
        num_tokens = sum(len(r.input_ids) + r.max_tokens for r in requests)
        bar = tqdm(total=num_tokens, desc=desc, file=sys.stderr, disable=not show_progress, mininterval=1.0,
                   unit="tok", unit_scale=True, dynamic_ncols=True)
        padded = 0
        t0 = time.perf_counter()
        for batch in batches:
            padded += self.generate_batch(batch)
            bar.update(sum(len(r.input_ids) + r.max_tokens for r in batch))
        duration_s = time.perf_counter() - t0
        bar.close()
        return HfRun(batch_size, len(requests), duration_s, sum(len(r.input_ids) for r in requests),
                     sum(r.max_tokens for r in requests), padded)

    def generate_batch(self, batch: list[BenchRequest]) -> int:
        """Generate one static batch; returns the tokens generated beyond what requests asked for."""
        import torch

        max_in = max(len(r.input_ids) for r in batch)
        max_new = max(r.max_tokens for r in batch)
        input_ids = torch.full((len(batch), max_in), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), max_in), dtype=torch.long)
        for row, r in enumerate(batch):  # left padding: every row's last prompt token is at the end
            input_ids[row, max_in - len(r.input_ids):] = torch.tensor(r.input_ids)
            attention_mask[row, max_in - len(r.input_ids):] = 1
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new, min_new_tokens=max_new,
                do_sample=False, pad_token_id=self.pad_id, use_cache=True,
            )
        assert out.shape[1] == max_in + max_new, f"generate returned {out.shape[1] - max_in} new tokens, asked {max_new}"
        return sum(max_new - r.max_tokens for r in batch)
