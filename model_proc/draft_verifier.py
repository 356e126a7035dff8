"""DraftVerifier: which of a row's speculative draft tokens the model accepts (ForwardBatch's Drafts).

A drafted row computes its last sampled token t and d drafts; the forward scores all 1 + d
positions. The first d score the drafts, the last one the token after them (the bonus):

    row i: cached_len c, d = 3, input_ids  t  a  b  e
    position read                          c  c+1 c+2 c+3
    token drawn there (Sampler counter)    c+1 c+2 c+3 c+4
    draft it is compared with              a  b   e   -     <- draft_logits rows (the first d)
                                                       ^ the bonus: the batch's ordinary last-position draw

The rule is "draw, then compare": at each draft position, draw the token exactly as
non-speculative decoding would (the Sampler, with the row's parameters, seed and that position
as the counter), accept the draft while the draw equals it, and emit the draw at the first
position where it differs (or the bonus draw when every draft is accepted). Positions past the
first difference are not drawn (sampled rows go position by position) or not looked at (greedy
rows take one argmax over all their positions).

Why this is speculative sampling. The drafter is deterministic (its distribution q is a point
mass on the draft x), so the standard rule accepts x with probability min(1, p(x) / q(x)) =
p(x) and on rejection draws from the residual norm(max(0, p - q)) = p without x, renormalised.
A draw from p equals x with probability p(x), and a draw that is not x is distributed as p
without x, renormalised: the same rule, with one uniform per position instead of two (the accept
test and the residual draw are one inverse-CDF draw). For greedy rows the draw is the argmax, so
a draft is accepted while it equals the argmax, and the token after is the argmax at the first
difference.

What this buys over two separate streams: the emitted tokens are the very tokens non-speculative
decoding draws with the same seed, position by position (given the same logits), so a seeded
request's text does not depend on whether, or how well, the scheduler drafted. Each emitted
token is decided by its own position's uniform alone; a draw past the emitted token (a greedy
row's) is thrown away, and the next step draws that position again from the same (seed,
position), as non-speculative decoding does.
"""

from __future__ import annotations

import numpy as np
import torch

from zserve.common.forward_batch import NO_TOKEN, ForwardBatch
from zserve.model_proc.sampler import MIN_TEMPERATURE, Sampler


class DraftVerifier:
    """Stateless apart from the Sampler it draws with (the ModelRunner's)."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler

    @staticmethod
    def draft_token_idx(batch: ForwardBatch) -> np.ndarray | None:
        """int64[sum(draft_lens)]: into the forward's hidden states, each drafted row's first d
        tokens, row after row (their logits are `verify`'s draft_logits); None without drafts."""
        if batch.draft_lens is None or not batch.draft_lens.any():
            return None
        which, offsets = _draft_layout(batch.draft_lens)
        return batch.token_starts()[which] + offsets

    def verify(self, draft_logits: torch.Tensor | None, batch: ForwardBatch, token_ids: np.ndarray) -> np.ndarray:
        """int32[num_reqs]: drafts accepted per row (0 for a row without drafts).

        draft_logits: float32[sum(draft_lens), vocab], the logits at `draft_token_idx` (None when
        no row has drafts). token_ids: int32[num_reqs], the batch's ordinary draw at every row's
        last position, which for a drafted row is the bonus token; a row that rejects a draft
        gets, in place, the draw at the rejected position instead.
        """
        num_accepted = np.zeros(batch.num_reqs, np.int32)
        if draft_logits is None:
            return num_accepted
        which, offsets = _draft_layout(batch.draft_lens)
        assert draft_logits.shape[0] == which.size, (tuple(draft_logits.shape), which.size)
        drafts = batch.input_ids[batch.token_starts()[which] + offsets + 1]  # draft j + 1 follows input j
        positions = batch.cached_lens[which].astype(np.int64) + offsets + 1  # the token drawn at input j
        drawn = self._draw_until_a_miss(draft_logits, batch, which, offsets, drafts, positions)
        rows = np.flatnonzero(batch.draft_lens)
        lens = batch.draft_lens[rows].astype(np.int64)
        seg_starts = np.cumsum(lens) - lens  # where each drafted row's slice starts
        # Per drafted row, the first j where the draw differs from the draft; d where none does
        # (an undrawn position, NO_TOKEN, only comes after one that differs).
        first_miss = np.minimum.reduceat(np.where(drawn != drafts, offsets, np.repeat(lens, lens)), seg_starts)
        num_accepted[rows] = first_miss
        rejected = first_miss < lens
        token_ids[rows[rejected]] = drawn[(seg_starts + first_miss)[rejected]]
        return num_accepted

    def _draw_until_a_miss(
        self, draft_logits: torch.Tensor, batch: ForwardBatch, which: np.ndarray, offsets: np.ndarray,
        drafts: np.ndarray, positions: np.ndarray,
    ) -> np.ndarray:
        """int32[sum(draft_lens)]: the draw at each draft position, NO_TOKEN past a row's first miss.

        Greedy rows' positions are all drawn at once (one argmax over them: cheaper than picking
        rows out). A sampled draw costs several passes over its row, so sampled rows go position
        by position, and only the rows whose drafts all matched so far draw at the next one."""
        drawn = np.full(which.size, NO_TOKEN, np.int32)
        todo = (batch.sampling.temperature[which] < MIN_TEMPERATURE) | (offsets == 0)
        while todo.any():
            idx = np.flatnonzero(todo)
            logits = (
                draft_logits
                if idx.size == which.size
                else draft_logits.index_select(0, torch.from_numpy(idx).to(draft_logits.device))
            )
            ids, _ = self.sampler.sample(
                logits, batch.sampling.select(which[idx]), torch.from_numpy(positions[idx]).to(draft_logits.device),
                np.zeros(idx.size, np.bool_),
            )
            drawn[idx] = ids.cpu().numpy()
            hit = idx[drawn[idx] == drafts[idx]]
            after = hit[(hit + 1 < which.size)]
            after = after[which[after + 1] == which[after]] + 1  # the same row's next draft position
            todo = np.zeros(which.size, np.bool_)
            todo[after[drawn[after] == NO_TOKEN]] = True
        return drawn


def _draft_layout(draft_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the batch row of each draft, its index j = 0 .. d - 1 among its row's drafts), int64[sum(draft_lens)] each."""
    lens = draft_lens.astype(np.int64)
    which = np.repeat(np.arange(lens.size), lens)
    offsets = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    return which, offsets
