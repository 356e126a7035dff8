"""FakeModel: a stand-in model worker for scheduler tests and benchmarks (no torch, no weights).

Its "KV pool" holds the token id written at each slot. The next token of a request is a hash of
the whole sequence it reads back through its page table, so a request whose pages were freed,
reused or mixed up gets a different token than its true sequence implies -- the test harness
recomputes `next_token(prompt + output so far)` and compares. Freed pages can be poisoned
(`poison`), and reading a poisoned slot fails at once.

A request sharing an identical prompt's K/V (`ForwardBatch.kv_source`) is not computed: its
slots for this step get its source's, and its token is the source's sequence's -- after checking
that the sequence read back through its own pages is the source's, so a wrong page table still
shows.

Drafts (speculative decoding, `ForwardBatch.draft_lens`) are verified as the worker does under
greedy sampling: the true next token at each of the row's positions is `true_next_token` of the
sequence up to there; drafts are accepted while equal, and the row's token is the true one after
the accepted ones. The slots of the rejected positions are poisoned, so a scheduler that counts
them as computed later reads a poisoned slot and fails at once.

`echo_period` (0 = off) makes the stream repetitive, so n-gram drafts get accepted: the true next
token repeats the token `echo_period` back, except where a hash of the sequence says to break
the pattern (one position in `echo_break`, then the plain hash token). Off, the tokens are the
hash's, which no n-gram predicts (acceptance ~0).
"""

from __future__ import annotations

import numpy as np

from zserve.common.forward_batch import NO_TOKEN, ForwardBatch, StepResult

POISON = -1


class FakeModel:
    def __init__(self, num_pages: int, page_size: int, vocab_size: int = 64, echo_period: int = 0, echo_break: int = 16):
        self.num_pages = num_pages
        self.page_size = page_size
        self.vocab_size = vocab_size
        self.echo_period = echo_period
        self.echo_break = echo_break
        self.pool = np.full(num_pages * page_size, POISON, np.int64)  # token id per slot

    @staticmethod
    def next_token(seq: np.ndarray | list[int], vocab_size: int) -> int:
        seq = np.asarray(seq, np.int64) % 65521
        weights = (np.arange(1, len(seq) + 1, dtype=np.int64) * 40503) % 65521
        return int((seq * weights).sum() % 1_000_003) % vocab_size

    def true_next_token(self, seq: np.ndarray | list[int]) -> int:
        """The token this model puts after `seq` (what the harness checks every token against)."""
        if self.echo_period and len(seq) >= self.echo_period:
            raw = FakeModel.next_token(seq, 1_000_003)
            if (raw // 7) % self.echo_break:
                return int(seq[len(seq) - self.echo_period])
            return raw % self.vocab_size
        return self.next_token(seq, self.vocab_size)

    def poison(self, page_ids: np.ndarray) -> None:
        """Mark freed pages: a later read of them before a write is a use-after-free."""
        ps = self.page_size
        slots = (np.asarray(page_ids, np.int64)[:, None] * ps + np.arange(ps)).reshape(-1)
        self.pool[slots] = POISON

    def forward(self, batch: ForwardBatch) -> StepResult:
        batch.validate(self.page_size, self.num_pages)
        ps = self.page_size
        is_computed = batch.is_computed
        page_starts = np.concatenate([[0], np.cumsum(batch.num_pages)])
        token_starts = batch.token_starts()
        slots, reads, writes, seqs = [], [], [], []
        for i in range(batch.num_reqs):
            cached, total = int(batch.cached_lens[i]), int(batch.cached_lens[i] + batch.extend_lens[i])
            pages = batch.page_ids[page_starts[i] : page_starts[i + 1]].astype(np.int64)
            positions = np.arange(total)
            slots.append(pages[positions // ps] * ps + positions % ps)
            cached_ids = self.pool[slots[i][:cached]]
            assert (cached_ids != POISON).all(), f"step {batch.step_id}: request {i} reads a freed or never-written slot"
            reads.append(slots[i][:cached])
            writes.append(slots[i][cached:])
            new_ids = batch.input_ids[token_starts[i] : token_starts[i] + total - cached] if is_computed[i] else []
            seqs.append(np.concatenate([cached_ids, np.asarray(new_ids, np.int64)]))
        written = np.concatenate(writes)
        assert len(np.unique(written)) == len(written), f"step {batch.step_id}: two requests write the same slot"
        assert not np.intersect1d(written, np.concatenate(reads)).size, f"step {batch.step_id}: a slot is written while another request reads it"
        self.pool[np.concatenate([w for w, c in zip(writes, is_computed, strict=True) if c])] = batch.input_ids.astype(np.int64)
        src_slots, dst_slots = batch.shared_kv_slots(ps)
        self.pool[dst_slots] = self.pool[src_slots]
        for i in np.flatnonzero(~is_computed):
            source = int(batch.kv_source[i])
            seqs[i] = self.pool[slots[i]]
            assert np.array_equal(seqs[i], seqs[source]), f"step {batch.step_id}: request {i} reads another sequence than its KV source {source}"
        num_accepted = None if batch.draft_lens is None else np.zeros(batch.num_reqs, np.int32)
        for i in np.flatnonzero(batch.draft_lens) if batch.draft_lens is not None else ():
            num_accepted[i] = self._verify(seqs, slots, i, int(batch.cached_lens[i]), int(batch.draft_lens[i]))
        next_ids = np.array(
            [self.true_next_token(seq) if sampled else NO_TOKEN for seq, sampled in zip(seqs, batch.is_sampled, strict=True)],
            np.int32,
        )
        logprobs = np.where(batch.return_logprob & batch.is_sampled, -0.5, np.nan).astype(np.float32)
        return StepResult(batch.step_id, next_ids, logprobs, **self._prompt_scores(batch, seqs), num_accepted=num_accepted)

    def _verify(self, seqs: list[np.ndarray], slots: list[np.ndarray], i: int, cached: int, num_drafts: int) -> int:
        """Row i's accepted drafts; cuts its sequence after them (so its token is the true one there)
        and poisons the slots of the rejected positions."""
        seq = seqs[i]
        num_accepted = 0
        while num_accepted < num_drafts and int(seq[cached + 1 + num_accepted]) == self.true_next_token(seq[: cached + 1 + num_accepted]):
            num_accepted += 1
        end = cached + 1 + num_accepted
        self.pool[slots[i][end:]] = POISON
        seqs[i] = seq[:end]
        return num_accepted

    @staticmethod
    def prompt_logprob(token_id: int, position: int) -> float:
        """The fake logprob of prompt token `token_id` at `position` (echo): tests recompute it."""
        return -(1 + (token_id * 31 + position) % 17) / 8

    def _prompt_scores(self, batch: ForwardBatch, seqs: list[np.ndarray]) -> dict:
        """ForwardBatch.prompt_logprobs: each asking row's chunk tokens after its first, then the next chunk's
        first token where one follows; the K top ids are the token itself, K times."""
        asked = batch.prompt_logprobs
        if asked is None:
            return {}
        values, tokens = [], []
        for row, next_id in zip(asked.rows.tolist(), asked.next_ids.tolist(), strict=True):
            cached, total = int(batch.cached_lens[row]), int(batch.cached_lens[row] + batch.extend_lens[row])
            scored = [(int(seqs[row][j]), j) for j in range(cached + 1, total)] + ([(next_id, total)] if next_id >= 0 else [])
            values += [self.prompt_logprob(t, j) for t, j in scored]
            tokens += [t for t, _ in scored]
        k = asked.num_top
        return {
            "prompt_logprobs": np.array(values, np.float32),
            "prompt_top_ids": np.repeat(np.array(tokens, np.int32), k) if k else None,
            "prompt_top_logprobs": np.repeat(np.array(values, np.float32), k) if k else None,
        }
