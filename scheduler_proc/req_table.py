"""ReqTable: the fixed table of request rows (`--max-running-requests` of them).

A row is held by one admitted request from admission to its end (chunked prefill included), so
the number of rows caps how many requests hold KV at once. (Not to be confused with a KV *slot*,
one token's place in the pool.)
"""

from __future__ import annotations


class ReqTable:
    def __init__(self, num_rows: int):
        assert num_rows >= 1, num_rows
        self.num_rows = num_rows
        self._owner: list[int | None] = [None] * num_rows  # req_id per row
        self._free_rows = list(range(num_rows - 1, -1, -1))  # a stack: row 0 is handed out first

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc(self, req_id: int) -> int | None:
        """A free row now owned by `req_id`, or None when all rows are taken."""
        if not self._free_rows:
            return None
        row_idx = self._free_rows.pop()
        self._owner[row_idx] = req_id
        return row_idx

    def free(self, row_idx: int, req_id: int) -> None:
        assert self._owner[row_idx] == req_id, f"row {row_idx} is owned by {self._owner[row_idx]}, not request {req_id}"
        self._owner[row_idx] = None
        self._free_rows.append(row_idx)

    def owner(self, row_idx: int) -> int | None:
        return self._owner[row_idx]

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
                assert live_rows.get(row_idx) == owner, f"row {row_idx} is owned by request {owner}, which does not hold it"
        assert len(live_rows) + len(self._free_rows) == self.num_rows, "live requests and free rows do not add up to the table"
