"""zserve.LLM: vLLM's offline entry point in vLLM's names, on zserve.Engine (the same server underneath).

    from zserve import LLM, SamplingParams

    llm = LLM(model="/path/to/model", tensor_parallel_size=1, max_model_len=2048)
    outputs = llm.generate(["Hello", "The capital of France is"],
                           [SamplingParams(max_tokens=4), SamplingParams(max_tokens=7)])
    print(outputs[1].outputs[0].text, outputs[1].prompt_token_ids)

The keywords are the launch_server flags in any spelling (zserve/engine_keywords.py: vLLM's
`tensor_parallel_size`, `max_model_len`, `gpu_memory_utilization`, `max_num_seqs`,
`max_num_batched_tokens`, `enable_prefix_caching`, `seed`, `tokenizer`, `trust_remote_code` (accepted,
ignored, as the CLI does), `dtype`); one vLLM does not share with the CLI (`cpu_offload_gb`, ...) is a
TypeError. `generate` and `chat` return one RequestOutput per prompt or conversation, in their order,
with `n` CompletionOutputs each (zserve/request_output.py). No sampling_params: zserve's defaults
(greedy, 128 new tokens), not vLLM's (temperature 1, 16 tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zserve.common.choices import num_choices
from zserve.engine import Engine, Samplings
from zserve.engine_keywords import config_values
from zserve.request_output import RequestOutput, request_output
from zserve.sampling_params import request_options

# vLLM's prompt: a string, a dict {"prompt": str} or {"prompt_token_ids": [...]}, or a list of ids
Prompt = str | dict[str, Any] | Sequence[int]


class LLM:
    def __init__(self, model: str = "", *, echo_logs: bool = True, startup_timeout_s: float = 600.0, **engine_args):
        config_values(engine_args, "LLM()", {"model": "model"} if model else None)  # the TypeError names LLM()
        self.engine = Engine(model, echo_logs=echo_logs, startup_timeout_s=startup_timeout_s, **engine_args)

    def generate(
        self, prompts: Prompt | Sequence[Prompt], sampling_params: Samplings = None, *, use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in their order. `sampling_params`: None, one SamplingParams (or
        dict) for every prompt, or a list of one per prompt (another length: ValueError)."""
        items = [prompts] if isinstance(prompts, (str, dict)) or _is_ids(prompts) else list(prompts)
        texts = [_text_or_ids(p) for p in items]
        results = self.engine.generate(texts, sampling_params, use_tqdm=use_tqdm)
        prompt_ids = [self.engine.tokenize(t) if isinstance(t, str) else list(t) for t in texts]
        return _grouped([t if isinstance(t, str) else None for t in texts], prompt_ids, results, sampling_params)

    def chat(
        self, messages: list[dict] | Sequence[list[dict]], sampling_params: Samplings = None, *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """One RequestOutput per conversation (`messages`: one conversation, or a list of them), the prompt
        being the conversation in the model's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        results = self.engine.generate(messages=conversations, sampling=sampling_params, use_tqdm=use_tqdm)
        prompt_ids = [self.engine.tokenize(messages=c) for c in conversations]
        prompts = [self.engine.detokenize(ids) for ids in prompt_ids]
        return _grouped(prompts, prompt_ids, results, sampling_params)

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _is_ids(prompt: Any) -> bool:
    return isinstance(prompt, Sequence) and bool(prompt) and isinstance(prompt[0], int)


def _text_or_ids(prompt: Prompt) -> str | list[int]:
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return prompt["prompt"]
        raise ValueError(f"a prompt dict has 'prompt' or 'prompt_token_ids', got the keys {sorted(prompt)}")
    return prompt if isinstance(prompt, str) else list(prompt)


def _grouped(
    prompts: list[str | None], prompt_ids: list[list[int]], results: list, sampling_params: Samplings,
) -> list[RequestOutput]:
    """The flat results (prompt p's n choices in turn) as one RequestOutput per prompt."""
    per_prompt = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(prompts)
    outputs: list[RequestOutput] = []
    start = 0
    for prompt, ids, sampling in zip(prompts, prompt_ids, per_prompt, strict=True):
        n = num_choices(request_options(sampling)) or 1
        outputs.append(request_output(prompt, ids, results[start : start + n]))
        start += n
    return outputs
