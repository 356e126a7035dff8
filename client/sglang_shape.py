"""SGLang's shapes shared by its /generate route (http_proc/apis/sglang/protocol.py) and zserve.Engine's SGLang form:
its sampling names (`max_new_tokens`, ...) and the result of one request, `{"text", "output_ids", "meta_info"}`."""

from __future__ import annotations

from typing import Any

from zserve.client.types import GenerateResult

# SGLang's sampling_params names that zserve spells otherwise; top_k -1 (SGLang's "off") is 0 here
RENAMED_SAMPLING = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed"}


def native_sampling(params: dict[str, Any]) -> dict[str, Any]:
    """SGLang's sampling_params in zserve's names; every other field as it is (the server refuses one it does
    not know)."""
    return {RENAMED_SAMPLING.get(k, k): 0 if k == "top_k" and v == -1 else v for k, v in params.items()}


def sglang_output(result: GenerateResult) -> dict[str, Any]:
    """SGLang's response for `result` so far: the whole text and ids, with meta_info (e2e_latency once it
    finished, in seconds from the send, as SGLang measures it from its arrival)."""
    usage = result.usage
    meta: dict[str, Any] = {
        "id": str(result.req_id),
        "finish_reason": finish_reason(result),
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
    }
    if result.logprobs is not None:  # SGLang's (logprob, token id, text) triples; text only when asked, here never
        meta["output_token_logprobs"] = [
            [lp, tid, None] for lp, tid in zip(result.logprobs, result.output_ids, strict=False)
        ]
    if result.top_logprobs is not None:
        meta["output_top_logprobs"] = [[[lp, tid, None] for tid, lp in top] for top in result.top_logprobs]
    if result.finish_reason is not None and result.latency_s is not None:
        meta["e2e_latency"] = result.latency_s
    return {"text": result.text, "output_ids": list(result.output_ids), "meta_info": meta}


def finish_reason(result: GenerateResult) -> dict[str, Any] | None:
    if result.finish_reason is None:
        return None
    if result.finish_reason == "length":
        return {"type": "length", "length": result.usage.completion_tokens}
    if result.finish_reason == "stop":
        return {"type": "stop", "matched": None}  # which EOS id or stop string matched is not reported here
    return {"type": result.finish_reason, "message": None}
