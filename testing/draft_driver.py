"""DraftDriver: GreedyDriver (testing/model_fixtures.py) plus decoding rows that carry draft
tokens (ForwardBatch's Drafts), each request advanced as the scheduler advances it: accepted drafts
kept, the rejected positions' pages given back. Used by the worker-side speculation tests on CPU
(tests/model/test_draft_verify.py) and CUDA (tests/model/test_model_gpu.py)."""

from __future__ import annotations

import numpy as np

from testing.model_fixtures import GreedyDriver, Seq
from zserve.common.forward_batch import ForwardBatch, StepResult


class DraftDriver(GreedyDriver):
    """GreedyDriver plus steps whose decoding rows carry drafts, advanced as the scheduler does;
    a seq in `sampling` (by id) samples with those (temperature, top_k, top_p, min_p, seed)."""

    def __init__(self, runner, sampling: dict[int, tuple] | None = None):
        super().__init__(runner)
        self.sampling = sampling or {}

    def build_batch(self, seqs: list[Seq]) -> ForwardBatch:
        batch = super().build_batch(seqs)
        for row, seq in enumerate(seqs):
            if id(seq) in self.sampling:
                s = batch.sampling
                s.temperature[row], s.top_k[row], s.top_p[row], s.min_p[row], s.seed[row] = self.sampling[id(seq)]
        return batch

    def step_drafted(self, seqs: list[Seq], drafts: list[list[int]]) -> tuple[ForwardBatch, StepResult]:
        for seq, draft in zip(seqs, drafts, strict=True):
            assert not draft or seq.cached_len == len(seq.tokens) - 1, "drafts go on a decoding row"
            seq.tokens += draft  # so build_batch computes [last sampled token, *drafts]
        batch = self.build_batch(seqs)
        batch.draft_lens = np.array([len(d) for d in drafts], np.int32)
        result = self.runner.run(batch)
        assert result.num_accepted is not None and result.num_accepted.dtype == np.int32
        for seq, draft, n, sampled, token_id, accepted in zip(
            seqs, drafts, batch.extend_lens.tolist(), batch.is_sampled, result.next_token_ids.tolist(),
            result.num_accepted.tolist(), strict=True,
        ):
            assert 0 <= accepted <= len(draft)
            del seq.tokens[len(seq.tokens) - len(draft) + accepted :]  # keep the accepted drafts
            seq.cached_len += n - len(draft) + accepted  # the rejected positions' K/V is garbage
            seq.page_ids = seq.page_ids[: -(-seq.cached_len // self.page_size)]  # pages past it go back
            if sampled:
                seq.tokens.append(token_id)
        return batch, result
