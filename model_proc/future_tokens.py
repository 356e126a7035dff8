"""FutureTokens: the worker's memory of its last step's sampled ids, for overlap scheduling.

Under --enable-overlap-schedule the scheduler sends step N+1 before step N's result is back; a
request decoding in both is fed `future_token(row)` in step N+1 (common/forward_batch.py, Future
tokens): the id step N sampled at that row. Rank 0 fills those in before the forward (and before
it re-broadcasts the batch to the other ranks, so every rank computes the same ids). Numpy only:
the scheduler tests' fake worker uses it as the real worker does.
"""

from __future__ import annotations

import numpy as np
from msgspec.structs import replace

from zserve.common.forward_batch import NO_TOKEN, ForwardBatch, StepResult, future_row


class FutureTokens:
    def __init__(self) -> None:
        self._step_id: int | None = None  # the last step this worker answered
        self._token_ids: np.ndarray | None = None  # its next_token_ids

    def remember(self, result: StepResult) -> None:
        """The step just answered: its sampled ids are what the next step's future tokens name."""
        self._step_id, self._token_ids = result.step_id, result.next_token_ids

    def forget(self) -> None:
        """A step was refused: nothing can follow it."""
        self._step_id = self._token_ids = None

    def fill(self, batch: ForwardBatch) -> ForwardBatch:
        """`batch` with its future tokens replaced by the ids they name (the batch itself when it has
        none). ValueError when they name a step other than the one just answered, a row outside it, or
        a row that was not sampled."""
        ids = batch.input_ids
        if not ids.size or int(ids.min()) >= 0:
            return batch
        if self._step_id != batch.step_id - 1 or self._token_ids is None:
            raise ValueError(
                f"ForwardBatch {batch.step_id} feeds tokens of step {batch.step_id - 1}, "
                f"but the last step this worker ran is {self._step_id}"
            )
        future = ids < 0
        rows = future_row(ids[future]).astype(np.int64)
        if int(rows.max()) >= self._token_ids.shape[0]:
            raise ValueError(
                f"ForwardBatch {batch.step_id} feeds the token of row {int(rows.max())} of step {self._step_id}, "
                f"which had {self._token_ids.shape[0]} rows"
            )
        filled = ids.copy()
        filled[future] = self._token_ids[rows]
        if (filled[future] == NO_TOKEN).any():
            raise ValueError(
                f"ForwardBatch {batch.step_id} feeds the token of a row step {self._step_id} did not sample"
            )
        return replace(batch, input_ids=filled)
