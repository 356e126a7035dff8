"""Wire form of ForwardBatch / StepResult (scheduler <-> model worker)."""

from __future__ import annotations

from typing import Any

import numpy as np

from common.array_codec import pack_array, unpack_array
from common.forward_batch import ForwardBatch, SamplingArrays, StepResult


class ForwardBatchMsg:
    TAG = 1

    def __init__(self, batch: ForwardBatch):
        self.batch = batch

    def to_wire(self) -> list[Any]:
        b, s = self.batch, self.batch.sampling
        return [
            b.step_id,
            pack_array(b.input_ids, np.int32),
            pack_array(b.cached_lens, np.int32),
            pack_array(b.extend_lens, np.int32),
            pack_array(b.page_ids, np.int32),
            pack_array(b.num_pages, np.int32),
            pack_array(b.is_sampled, np.bool_),
            pack_array(b.return_logprob, np.bool_),
            pack_array(s.temperature, np.float32),
            pack_array(s.top_k, np.int32),
            pack_array(s.top_p, np.float32),
            pack_array(s.min_p, np.float32),
            pack_array(s.seed, np.int64),
        ]

    @classmethod
    def from_wire(cls, f: list[Any]) -> ForwardBatchMsg:
        sampling = SamplingArrays(
            temperature=unpack_array(f[8], np.float32),
            top_k=unpack_array(f[9], np.int32),
            top_p=unpack_array(f[10], np.float32),
            min_p=unpack_array(f[11], np.float32),
            seed=unpack_array(f[12], np.int64),
        )
        batch = ForwardBatch(
            step_id=int(f[0]),
            input_ids=unpack_array(f[1], np.int32),
            cached_lens=unpack_array(f[2], np.int32),
            extend_lens=unpack_array(f[3], np.int32),
            page_ids=unpack_array(f[4], np.int32),
            num_pages=unpack_array(f[5], np.int32),
            is_sampled=unpack_array(f[6], np.bool_),
            return_logprob=unpack_array(f[7], np.bool_),
            sampling=sampling,
        )
        return cls(batch)


class StepResultMsg:
    TAG = 2

    def __init__(self, result: StepResult):
        self.result = result

    def to_wire(self) -> list[Any]:
        r = self.result
        return [r.step_id, pack_array(r.next_token_ids, np.int32), pack_array(r.logprobs, np.float32), r.forward_ms]

    @classmethod
    def from_wire(cls, f: list[Any]) -> StepResultMsg:
        return cls(
            StepResult(
                step_id=int(f[0]),
                next_token_ids=unpack_array(f[1], np.int32),
                logprobs=unpack_array(f[2], np.float32),
                forward_ms=float(f[3]),
            )
        )
