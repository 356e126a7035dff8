"""The batch format between the scheduler and the model worker(s).

The scheduler owns KV *bookkeeping*; the worker owns the KV *tensors*. A `ForwardBatch` says,
per request, which pages hold its sequence and how many of its tokens are already there, so
the worker needs no state of its own about requests.

One request's view (page_size = 4, cached_len = 6, extend_len = 3):

    positions      0 1 2 3 | 4 5 6 7 | 8
    page_table     [  p0   |   p1    | p2 ]   (this request's slice of `page_ids`)
    tokens         c c c c   c c n n   n      c = K/V already in the pool, n = computed now
                               ^cached_len      input_ids holds the 3 `n` tokens

    slot(pos) = page_table[pos // page_size] * page_size + pos % page_size

A request's pages cover `cached_len + extend_len` tokens after the step:
`num_pages = ceil((cached_len + extend_len) / page_size)`. Prefill, a chunk that continues
earlier chunks, a prefill after a prefix hit, and decode (extend_len = 1) are all the same
shape, so one forward serves any mix of them.

These are wire messages (common/wire.py): ForwardBatch (scheduler -> worker, and rank 0 -> the
other ranks) and StepResult (worker -> scheduler), with SamplingArrays nested in ForwardBatch.
Every array travels as raw little-endian bytes, not a msgpack list: a 4096-id list costs ~0.2 ms
to pack, raw bytes ~1 us. A decoded array is a read-only view of the frame.

Rows. Every per-request array of ForwardBatch and StepResult has one entry per request, in
batch order (decode requests first, then prefill): request i is *row* i everywhere, in the
scheduler, the worker and the sampler (the sampler's logits are float32[num_reqs, vocab]). A
subset of the requests is a bool mask over rows (`is_sampled`, `is_computed`) or an ascending
int32 array of rows (the `rows` of PenaltyArrays, GrammarMasks, PromptLogprobRows). The arrays
not indexed by row are concatenations, in row order: `input_ids` (the computed rows' new tokens),
`page_ids` (every row's page table), the CSR payloads of the subsets, and StepResult's prompt
logprobs. A row that is not sampled (the ChunkedReq) gets next_token_id NO_TOKEN.

KV sharing: identical prompts admitted in one round are computed once. The first is the *KV
source*; each other one takes its K/V from it (`kv_source[i] = j`, the source's row, `j < i`;
`kv_source[i] = i` for a computed row): it has the source's cached_len and extend_len, sends no
input_ids, and is not computed. After the forward the worker copies the K/V the source wrote
this step into the sharing row's own slots (positions cached_len .. cached_len + extend_len - 1,
a partial last page included), and the row samples its first token, with its own parameters
and seed, from the source's last-position logits:

    request     r0 (KV source)   r1 (kv_source = 0)      cached_len 8, extend_len 5, page_size 4
    pages       [a b | p q ]     [a b | s t ]            a b: the shared prefix (radix cache hit)
    this step   p q computed     p q --slot copy--> s t  r1's logits row = r0's

Drafts (speculative decoding): a decoding row with `d = draft_lens[i] > 0` computes its last
sampled token and then d draft tokens guessed by the scheduler, so `extend_len = 1 + d` and its
pages cover all of them. The worker scores the row at each of those 1 + d positions, accepts the
longest prefix of drafts the model agrees with (greedy: equal to the argmax; sampled: the
speculative-sampling rule, which leaves the distribution unchanged) and samples one more token
after it. StepResult then says, per row, `num_accepted[i]` (0..d) and `next_token_ids[i]` (the
token after the accepted drafts): the row's new tokens are `drafts[:num_accepted] +
[next_token_id]`. The K/V written at the rejected positions is garbage the scheduler gives back
(it shortens the row's sequence to cached_len + 1 + num_accepted). A row with drafts is
sampled, computed (no kv_source), already past its prompt (cached_len > 0), and asks for no
logprobs, top logprobs, penalties, grammar or prompt logprobs.

    row i: cached_len 7, last sampled t, drafts a b c      input_ids (row i) = t a b c
    positions scored    7   8   9   10                      argmax      a   b   x   .
    accepted: a b (num_accepted 2); next_token_id x; new tokens a b x; K/V of 9 and 10 dropped

Future tokens (overlap scheduling, --enable-overlap-schedule): the scheduler sends step N+1 while
the worker still runs step N, so a request decoding in both feeds step N+1 the token step N
samples, which the scheduler does not know yet. Its input id in step N+1 is then
`future_token(r) = -(1 + r)`: "the token step N sampled at row r". The worker keeps its last
step's sampled ids and fills them in (model_proc/future_tokens.py); step ids count up by one, so
step N is step_id - 1. Only a plain decoding row is fed a future token (no drafts, penalties or
grammar: those rows wait for step N's result).

    step N      rows  [ a  b  c ]  sampled  [ 17  4  9 ]
    step N+1    input_ids [ -2  -1  55 ]  ->  [ 4  17  55 ]   (b and a still decoding; 55 a new prompt)
"""

from __future__ import annotations

import numpy as np

from zserve.common.wire import BoolArray, Float32Array, Int32Array, Int64Array, Message

# Sampling defaults that mean "off".
GREEDY_TEMPERATURE = 0.0
TOP_K_OFF = 0
TOP_P_OFF = 1.0
MIN_P_OFF = 0.0

NO_TOKEN = -1  # StepResult.next_token_ids of a row that is not sampled


def future_token(row: int) -> int:
    """The input id that stands for the token the step before sampled at `row` (Future tokens above)."""
    return -1 - row


def future_row(token_id: np.ndarray | int):
    """The inverse of future_token: the previous step's row a future token names."""
    return -1 - token_id


class SamplingArrays(Message):
    """Per-request sampling parameters of one batch, one entry per request in batch order.

    `temperature == 0` means greedy. `seed` is always set: the scheduler draws one for a request
    that asked for none, so a request's draws depend only on (seed, position), never on which
    other requests share its batch.
    """

    temperature: Float32Array  # [num_reqs]
    top_k: Int32Array  # [num_reqs], 0 = off
    top_p: Float32Array  # [num_reqs], 1.0 = off
    min_p: Float32Array  # [num_reqs], 0.0 = off
    seed: Int64Array  # [num_reqs]

    @staticmethod
    def greedy(num_reqs: int) -> SamplingArrays:
        return SamplingArrays(
            temperature=np.zeros(num_reqs, np.float32),
            top_k=np.zeros(num_reqs, np.int32),
            top_p=np.ones(num_reqs, np.float32),
            min_p=np.zeros(num_reqs, np.float32),
            seed=np.zeros(num_reqs, np.int64),
        )

    def select(self, mask: np.ndarray) -> SamplingArrays:
        """The rows where `mask` is True (e.g. the sampler's non-greedy rows)."""
        return SamplingArrays(
            self.temperature[mask], self.top_k[mask], self.top_p[mask], self.min_p[mask], self.seed[mask],
        )

    @property
    def all_greedy(self) -> bool:
        return bool((self.temperature == GREEDY_TEMPERATURE).all())


class PenaltyArrays(Message):
    """What adjusts the logits of the batch's requests that asked for it (most batches: None).

    `rows`: the batch rows (sampled ones) that asked. Each has a CSR slice of the tokens
    of its prompt and output (`token_ids`, with `output_counts`: times each is in the output,
    0 for one only in the prompt), of its logit bias, and of the stop tokens `min_tokens` still
    bans. The sampler applies, in this order (vLLM's): the repetition penalty (prompt and
    output tokens: logit / p if positive, * p if not), the frequency and presence penalties
    (output tokens: logit -= count * frequency + presence), the bias (added), the bans (-inf).
    """

    rows: Int32Array  # [m]: batch rows, ascending
    repetition: Float32Array  # [m]
    frequency: Float32Array  # [m]
    presence: Float32Array  # [m]
    token_offsets: Int32Array  # [m + 1]
    token_ids: Int32Array
    output_counts: Int32Array
    bias_offsets: Int32Array  # [m + 1]
    bias_ids: Int32Array
    bias_values: Float32Array
    banned_offsets: Int32Array  # [m + 1]
    banned_ids: Int32Array


class GrammarMasks(Message):
    """Structured output: for the sampled rows under a grammar (`rows`), the tokens the grammar
    allows next, as xgrammar's packed bitmask (bit j of word w allows token 32 w + j). The sampler
    gives every other token -inf."""

    rows: Int32Array  # [m]: batch rows, ascending
    words_per_row: int
    bitmask: Int32Array  # [m * words_per_row]


class PromptLogprobRows(Message):
    """Prompt logprobs (echo): the prefill rows whose chunk's prompt tokens get their logprob.
    Position p of a chunk scores the prompt token after it: the chunk's own next token, and for
    its last position `next_ids` (the first token of the next chunk; -1 when the chunk ends the
    prompt, whose last position predicts the output instead)."""

    rows: Int32Array  # [m]: batch rows, ascending; computed prefill rows (never a KV-sharing one)
    next_ids: Int32Array  # [m]
    num_top: int  # K: the most likely tokens to report per position (0 = none)

    def num_scored(self, extend_lens: np.ndarray) -> np.ndarray:
        """int[m]: prompt tokens scored per row this step."""
        return extend_lens[self.rows] - 1 + (self.next_ids >= 0)


class ForwardBatch(Message, tag=1):
    """One step's work for the model worker: per-request arrays by row (see Rows above)."""

    step_id: int
    input_ids: Int32Array  # [sum(extend_lens[is_computed])]: the computed rows' new tokens, row after row
    cached_lens: Int32Array  # [num_reqs]: tokens whose K/V are already in the pool
    extend_lens: Int32Array  # [num_reqs]: tokens computed this step (1 for decode)
    page_ids: Int32Array  # [sum(num_pages)]: the rows' page tables, row after row
    num_pages: Int32Array  # [num_reqs]
    is_sampled: BoolArray  # [num_reqs]: False for a ChunkedReq (prompt left after this step)
    return_logprob: BoolArray  # [num_reqs]
    sampling: SamplingArrays  # [num_reqs] each
    # [num_reqs]: i for a computed row, j < i for a row taking its K/V from row j; None: every row computed (most steps)
    kv_source: Int32Array | None = None
    penalties: PenaltyArrays | None = None  # penalties, logit bias, min_tokens bans; None: nobody asked
    top_logprobs: Int32Array | None = None  # [num_reqs]: most likely tokens to report (0 = none); None: nobody asked
    grammar: GrammarMasks | None = None  # structured output's allowed tokens; None: no request under a grammar
    prompt_logprobs: PromptLogprobRows | None = None  # rows scoring their prompt (echo); None: nobody asked
    # [num_reqs]: speculative draft tokens at the end of each row's new tokens (0 = none; see Drafts above);
    # None: no drafts
    draft_lens: Int32Array | None = None
    # an embedding server's (--task embed) pooling mode, common/pooling.py: every row also gets its chunk's
    # vector in StepResult.pooled; None: a generating server
    pooling: str | None = None
    # [num_reqs]: the LoRA adapter computing each row (its index in --lora-modules; -1 the base model; a KV-sharing
    # row's is its source's); None: no row has one (every step of a server without adapters)
    lora_ids: Int32Array | None = None

    @property
    def num_reqs(self) -> int:
        return int(self.extend_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        """Tokens computed this step (a KV-sharing row's are not)."""
        return int(self.input_ids.shape[0])

    @property
    def is_computed(self) -> np.ndarray:
        """bool[num_reqs]: False for a row taking its K/V from its KV source."""
        if self.kv_source is None:
            return np.ones(self.num_reqs, np.bool_)
        return self.kv_source == np.arange(self.num_reqs)

    def token_starts(self) -> np.ndarray:
        """int64[num_reqs]: where each row's new tokens start in `input_ids` (and in the forward's
        hidden states); a KV-sharing row's are its source's."""
        extend = np.where(self.is_computed, self.extend_lens, 0) if self.kv_source is not None else self.extend_lens
        starts = np.cumsum(extend, dtype=np.int64) - extend
        return starts if self.kv_source is None else starts[self.kv_source]

    def computed_part(self) -> ForwardBatch:
        """What the forward runs: a batch of its own holding the computed rows, renumbered 0..
        (only attention sees it). The batch itself when every row is computed."""
        if self.kv_source is None:
            return self
        keep = self.is_computed
        page_starts = np.cumsum(self.num_pages) - self.num_pages
        kept_pages = [self.page_ids[s : s + n] for s, n in zip(page_starts[keep], self.num_pages[keep], strict=True)]
        return ForwardBatch(
            step_id=self.step_id,
            input_ids=self.input_ids,
            cached_lens=self.cached_lens[keep],
            extend_lens=self.extend_lens[keep],
            page_ids=np.concatenate(kept_pages),
            num_pages=self.num_pages[keep],
            is_sampled=self.is_sampled[keep],
            return_logprob=self.return_logprob[keep],
            sampling=self.sampling.select(keep),
        )

    def shared_kv_slots(self, page_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(source slots, destination slots), int64: where each KV-sharing row's K/V for this
        step's positions come from and go to. Empty when every row is computed."""
        if self.kv_source is None:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        page_starts = np.cumsum(self.num_pages, dtype=np.int64) - self.num_pages
        sharing = np.flatnonzero(~self.is_computed)
        sources = self.kv_source[sharing].astype(np.int64)
        extend = self.extend_lens[sharing].astype(np.int64)
        # positions cached_len .. cached_len + extend_len - 1 of every sharing row, row after row
        which = np.repeat(np.arange(sharing.size), extend)
        positions = (
            self.cached_lens[sharing][which] + np.arange(int(extend.sum())) - (np.cumsum(extend) - extend)[which]
        )

        def slots(rows: np.ndarray) -> np.ndarray:
            pages = self.page_ids[page_starts[rows][which] + positions // page_size].astype(np.int64)
            return pages * page_size + positions % page_size

        return slots(sources), slots(sharing)

    @property
    def is_decode_only(self) -> bool:
        return bool((self.extend_lens == 1).all()) and bool((self.cached_lens > 0).all())

    def validate(self, page_size: int, num_pages_total: int) -> None:
        """Raise ValueError naming what is wrong; the worker calls this before touching tensors."""
        n = self.num_reqs
        for name in ("cached_lens", "num_pages", "is_sampled", "return_logprob"):
            if getattr(self, name).shape[0] != n:
                raise ValueError(
                    f"ForwardBatch {self.step_id}: {name} has {getattr(self, name).shape[0]} entries, expected {n}"
                )
        if (self.extend_lens < 1).any() or (self.cached_lens < 0).any():
            raise ValueError(f"ForwardBatch {self.step_id}: extend_lens must be >= 1 and cached_lens >= 0")
        if self.kv_source is not None:
            self._validate_kv_sources()
        num_computed = int(self.extend_lens[self.is_computed].sum())
        if num_computed != self.num_tokens:
            raise ValueError(
                f"ForwardBatch {self.step_id}: sum(extend_lens) of the computed requests={num_computed} "
                f"!= len(input_ids)={self.num_tokens}"
            )
        need = -(-(self.cached_lens.astype(np.int64) + self.extend_lens) // page_size)
        if not np.array_equal(need, self.num_pages):
            i = int(np.nonzero(need != self.num_pages)[0][0])
            raise ValueError(
                f"ForwardBatch {self.step_id}: request {i} has {int(self.num_pages[i])} pages for "
                f"{int(self.cached_lens[i] + self.extend_lens[i])} tokens at page_size {page_size} "
                f"(needs {int(need[i])})"
            )
        if int(self.num_pages.sum()) != self.page_ids.shape[0]:
            raise ValueError(f"ForwardBatch {self.step_id}: sum(num_pages) != len(page_ids)")
        bad = (self.page_ids < 0) | (self.page_ids >= num_pages_total)
        if bad.any():
            j = int(np.nonzero(bad)[0][0])
            raise ValueError(
                f"ForwardBatch {self.step_id}: page id {int(self.page_ids[j])} (slots "
                f"{int(self.page_ids[j]) * page_size}..{(int(self.page_ids[j]) + 1) * page_size - 1}) "
                "is outside the KV pool "
                f"of {num_pages_total} pages"
            )
        for name in ("penalties", "grammar", "prompt_logprobs"):
            part = getattr(self, name)
            if part is not None and part.rows.size and (
                part.rows[0] < 0 or part.rows[-1] >= n or (part.rows[1:] <= part.rows[:-1]).any()
            ):
                raise ValueError(f"ForwardBatch {self.step_id}: {name}.rows must be ascending rows of the batch's {n}")
        if self.draft_lens is not None:
            self._validate_drafts()
        if self.lora_ids is not None:
            if self.lora_ids.shape[0] != n:
                raise ValueError(
                    f"ForwardBatch {self.step_id}: lora_ids has {self.lora_ids.shape[0]} entries, expected {n}"
                )
            if self.kv_source is not None and (self.lora_ids != self.lora_ids[self.kv_source]).any():
                raise ValueError(f"ForwardBatch {self.step_id}: a row takes its K/V from a row of another LoRA adapter")

    def token_lora_ids(self) -> np.ndarray | None:
        """int32[num_tokens]: the LoRA adapter of each computed token (-1 none), or None when no row has one."""
        if self.lora_ids is None:
            return None
        computed = self.is_computed
        return np.repeat(self.lora_ids[computed], self.extend_lens[computed]).astype(np.int32, copy=False)

    def _validate_drafts(self) -> None:
        drafts, n = self.draft_lens, self.num_reqs
        if drafts.shape[0] != n:
            raise ValueError(f"ForwardBatch {self.step_id}: draft_lens has {drafts.shape[0]} entries, expected {n}")
        if (drafts < 0).any() or (drafts > self.extend_lens - 1).any():
            raise ValueError(f"ForwardBatch {self.step_id}: draft_lens must be in 0 .. extend_len - 1")
        has = drafts > 0
        if not has.any():
            return
        barred = ~self.is_sampled | ~self.is_computed | (self.cached_lens == 0) | self.return_logprob
        if self.top_logprobs is not None:
            barred |= self.top_logprobs > 0
        for name in ("penalties", "grammar", "prompt_logprobs"):
            part = getattr(self, name)
            if part is not None:
                barred[part.rows] = True
        if (has & barred).any():
            i = int(np.flatnonzero(has & barred)[0])
            raise ValueError(
                f"ForwardBatch {self.step_id}: request {i} has drafts but is not a plain decoding row "
                "(unsampled, KV-sharing, prefilling, or asks for logprobs, penalties, a grammar or prompt logprobs)"
            )

    def _validate_kv_sources(self) -> None:
        kv_source, n = self.kv_source, self.num_reqs
        if kv_source.shape[0] != n:
            raise ValueError(f"ForwardBatch {self.step_id}: kv_source has {kv_source.shape[0]} entries, expected {n}")
        bad = (kv_source < 0) | (kv_source > np.arange(n))
        if bad.any():
            i = int(np.nonzero(bad)[0][0])
            raise ValueError(
                f"ForwardBatch {self.step_id}: request {i} takes its K/V from {int(kv_source[i])}, "
                "not an earlier request"
            )
        for i in np.flatnonzero(kv_source != np.arange(n)).tolist():
            j = int(kv_source[i])
            if kv_source[j] != j:
                raise ValueError(
                    f"ForwardBatch {self.step_id}: request {i} takes its K/V from {j}, which is not computed"
                )
            if self.cached_lens[i] != self.cached_lens[j] or self.extend_lens[i] != self.extend_lens[j]:
                raise ValueError(
                    f"ForwardBatch {self.step_id}: request {i} takes its K/V from {j}, "
                    "with other cached_len or extend_len"
                )
            if not (self.is_sampled[i] and self.is_sampled[j]):
                raise ValueError(
                    f"ForwardBatch {self.step_id}: request {i} takes its K/V from {j}, but both must be sampled"
                )


class StepResult(Message, tag=2):
    """What rank 0 returns for a ForwardBatch: one entry per row, like the batch's arrays."""

    step_id: int
    next_token_ids: Int32Array  # [num_reqs]; NO_TOKEN where the row is not sampled
    logprobs: Float32Array  # [num_reqs]; NaN where the row is not sampled or did not ask
    forward_ms: float = 0.0
    num_top: int = 0  # K: the most top_logprobs any row asked for (0 = none)
    top_ids: Int32Array | None = None  # [num_reqs * K], row by row, most likely first (meaningless where not sampled)
    top_logprobs: Float32Array | None = None  # [num_reqs * K]
    # ForwardBatch.prompt_logprobs: the scored prompt tokens' logprobs, row after row (num_scored each)
    prompt_logprobs: Float32Array | None = None
    prompt_top_ids: Int32Array | None = None  # [len(prompt_logprobs) * K], K = prompt_logprobs.num_top
    prompt_top_logprobs: Float32Array | None = None
    # [num_reqs]: drafts accepted per row (0 .. ForwardBatch.draft_lens); None when the batch had no drafts.
    # A row's new tokens are its first num_accepted drafts, then next_token_ids[row] (see Drafts above).
    num_accepted: Int32Array | None = None
    # ForwardBatch.pooling: float32[num_reqs * hidden_size], each row's chunk vector (model_proc/chunk_pooler.py)
    pooled: Float32Array | None = None
