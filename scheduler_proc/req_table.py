"""ReqTable: the fixed table of request rows (`--max-running-requests` of them).

A row is held by one admitted request from admission to its end (chunked prefill included), so
the number of rows caps how many requests hold KV at once. (Not to be confused with a KV *slot*,
one token's place in the pool.) A row also stores its request's sampling parameters as numpy
columns, so a batch gathers them with one fancy index per column instead of a pass per request.
"""

from __future__ import annotations

import numpy as np

from zserve.common.forward_batch import SamplingArrays
from zserve.common.sampling_params import SamplingParams


class ReqTable:
    def __init__(self, num_rows: int):
        assert num_rows >= 1, num_rows
        self.num_rows = num_rows
        self._owner: list[int | None] = [None] * num_rows  # req_id per row
        self._free_rows = list(range(num_rows - 1, -1, -1))  # a stack: row 0 is handed out first
        self._sampling = SamplingArrays.greedy(num_rows)  # per row, valid while the row is owned
        self._return_logprob = np.zeros(num_rows, np.bool_)

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc(self, req_id: int, params: SamplingParams, seed: int) -> int | None:
        """A free row now owned by `req_id`, holding its sampling parameters; None when all rows
        are taken."""
        if not self._free_rows:
            return None
        row_idx = self._free_rows.pop()
        self._owner[row_idx] = req_id
        s = self._sampling
        s.temperature[row_idx], s.top_k[row_idx], s.top_p[row_idx], s.min_p[row_idx] = (
            params.temperature, params.top_k, params.top_p, params.min_p,
        )
        s.seed[row_idx] = seed
        self._return_logprob[row_idx] = params.return_logprob
        return row_idx

    def free(self, row_idx: int, req_id: int) -> None:
        assert self._owner[row_idx] == req_id, f"row {row_idx} is owned by {self._owner[row_idx]}, not request {req_id}"
        self._owner[row_idx] = None
        self._free_rows.append(row_idx)

    def owner(self, row_idx: int) -> int | None:
        return self._owner[row_idx]

    def sampling_columns(self, row_idxs: np.ndarray) -> tuple[SamplingArrays, np.ndarray]:
        """Sampling arrays and return_logprob flags of these rows, in this order."""
        return self._sampling.select(row_idxs), self._return_logprob[row_idxs]

    def check_integrity(self, live_rows: dict[int, int]) -> None:
        """`live_rows` maps every live request's row to its req_id: each row is free or owned by
        exactly that request."""
        free_rows = set(self._free_rows)
        assert len(free_rows) == len(self._free_rows), "a row is on the free list twice"
        for row_idx in range(self.num_rows):
            owner = self._owner[row_idx]
            if owner is None:
                assert row_idx in free_rows and row_idx not in live_rows, f"row {row_idx} is neither free nor owned"
            else:
                assert row_idx not in free_rows, f"row {row_idx} is both free and owned by request {owner}"
                assert live_rows.get(row_idx) == owner, (
                    f"row {row_idx} is owned by request {owner}, which does not hold it"
                )
        assert len(live_rows) + len(self._free_rows) == self.num_rows, (
            "live requests and free rows do not add up to the table"
        )
