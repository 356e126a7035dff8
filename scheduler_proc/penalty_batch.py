"""The PenaltyArrays of one batch: what the sampler needs to apply the penalties, logit bias and
min_tokens bans of the requests that asked (common/forward_batch.py has the formulas).

The scheduler holds every request's prompt and output, so it sends them here, per step, for the
penalized requests only: the worker stays free of per-request state, and a retracted request
resumes with its counts intact (its output is still its output). Cost: a sort of the request's
tokens per step, for those requests alone.
"""

from __future__ import annotations

import numpy as np

from zserve.common.forward_batch import PenaltyArrays
from zserve.scheduler_proc.req import Req


def penalty_arrays(reqs: list[Req], is_sampled: np.ndarray) -> PenaltyArrays | None:
    """None when no sampled request asks for any adjustment (the usual batch). `reqs` and
    `is_sampled` are the batch's rows, which PenaltyArrays.rows names."""
    picked = [(i, r) for i, r in enumerate(reqs) if is_sampled[i] and r.params.has_penalties]
    if not picked:
        return None
    tokens, counts, biases, bias_values, banned = [], [], [], [], []
    for _, req in picked:
        p = req.params
        output = np.asarray(req.output_ids, np.int32)
        out_ids, out_counts = np.unique(output, return_counts=True)
        if p.repetition_penalty != 1:
            ids = np.union1d(req.input_ids[: req.num_orig_prompt_tokens], out_ids).astype(np.int32)
            row_counts = np.zeros(ids.size, np.int64)
            row_counts[np.searchsorted(ids, out_ids)] = out_counts  # every output id is in `ids`
        elif p.presence_penalty or p.frequency_penalty:
            ids, row_counts = out_ids.astype(np.int32), out_counts
        else:
            ids, row_counts = np.zeros(0, np.int32), np.zeros(0, np.int64)
        tokens.append(ids)
        counts.append(row_counts.astype(np.int32))
        biases.append(np.fromiter((int(t) for t in p.logit_bias), np.int32, len(p.logit_bias)))
        bias_values.append(np.fromiter(p.logit_bias.values(), np.float32, len(p.logit_bias)))
        banned.append(
            np.array(sorted(req.stop_ids), np.int32) if len(req.output_ids) < p.min_tokens else np.zeros(0, np.int32)
        )
    return PenaltyArrays(
        rows=np.array([i for i, _ in picked], np.int32),
        repetition=np.array([r.params.repetition_penalty for _, r in picked], np.float32),
        frequency=np.array([r.params.frequency_penalty for _, r in picked], np.float32),
        presence=np.array([r.params.presence_penalty for _, r in picked], np.float32),
        token_offsets=_offsets(tokens), token_ids=_concat(tokens, np.int32), output_counts=_concat(counts, np.int32),
        bias_offsets=_offsets(biases), bias_ids=_concat(biases, np.int32), bias_values=_concat(bias_values, np.float32),
        banned_offsets=_offsets(banned), banned_ids=_concat(banned, np.int32),
    )


def _offsets(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([p.size for p in parts])]).astype(np.int32)


def _concat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
