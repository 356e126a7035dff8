"""CudaGraphBuckets: the batch sizes a decode step is captured at (SGLang's: 1, 2, 4, 8, then every 8 up to
--cuda-graph-max-bs), and which one a batch replays in: the smallest bucket holding its rows, or None (the eager
forward) when the batch is larger than the largest or is not a plain decode step.

A plain decode step: every row computes one token after a cached prefix (ForwardBatch.is_decode_only), and none
needs more than the logits at its one token: no KV-sharing rows (their logits are gathered), no drafts (several
tokens a row), no prompt logprobs and no pooling (they read every token's hidden state). Penalties, grammars,
top-logprobs and sampling are applied to the logits after the replay, eagerly, so they do not bar a batch.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from zserve.common.forward_batch import ForwardBatch

SMALL_BUCKETS = (1, 2, 4)  # below the first step of 8
BUCKET_STEP = 8


@dataclass(frozen=True, slots=True)
class CudaGraphBuckets:
    sizes: tuple[int, ...]  # ascending batch sizes (rows), each captured once it is first used

    @staticmethod
    def up_to(max_bs: int) -> CudaGraphBuckets:
        """1, 2, 4, 8, 16, ... up to max_bs, and max_bs itself when it is not a multiple of 8."""
        if max_bs < 1:
            raise ValueError(f"--cuda-graph-max-bs must be >= 1, got {max_bs}")
        sizes = [b for b in SMALL_BUCKETS if b <= max_bs] + list(range(BUCKET_STEP, max_bs + 1, BUCKET_STEP))
        if sizes[-1] != max_bs:
            sizes.append(max_bs)
        return CudaGraphBuckets(tuple(sizes))

    @property
    def max_bs(self) -> int:
        return self.sizes[-1]

    def size_for(self, num_rows: int) -> int | None:
        """The smallest bucket >= num_rows; None when none is (the batch runs eagerly)."""
        i = bisect.bisect_left(self.sizes, num_rows)
        return self.sizes[i] if i < len(self.sizes) else None

    def choose(self, batch: ForwardBatch) -> int | None:
        """The bucket `batch` replays in, or None: the eager forward (see the module docstring)."""
        if not replayable(batch):
            return None
        return self.size_for(batch.num_reqs)


def replayable(batch: ForwardBatch) -> bool:
    """Whether a captured decode graph computes what the eager forward would for `batch`."""
    needs_more = (batch.kv_source, batch.draft_lens, batch.prompt_logprobs, batch.pooling)
    return batch.num_reqs > 0 and batch.is_decode_only and all(part is None for part in needs_more)
