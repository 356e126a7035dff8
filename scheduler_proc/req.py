"""Request state, one class per stage of a request's life in the scheduler:

    submit -> PendingReq --admit--> Req (+ ChunkedReq while prompt is left) --finish/abort--> gone
                  ^                  |
                  +---- retract -----+   (back to the head of the queue, prompt + output as its prompt)

`PendingReq` holds nothing. A `Req` holds a row of the ReqTable, KV pages and (maybe) a lock on a
radix-cache node; the Scheduler owns and mutates it. A request does no I/O and makes no policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from zserve.common.finish_reason import FinishReason
from zserve.common.lora_modules import NO_ADAPTER
from zserve.common.messages import PromptLogprobs
from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.radix_cache import RadixNode


@dataclass(slots=True, eq=False)
class PendingReq:
    """A request waiting for admission: validated, seeded, holding no resources. A retracted
    request waits as one too: its `input_ids` are the client's prompt + its output so far, and it
    keeps what the client must keep seeing (output count, reported prefix hit, admission order)."""

    req_id: int
    input_ids: np.ndarray  # int32[num_prompt_tokens]: what its admission prefills
    num_prompt_tokens: int
    params: SamplingParams
    max_tokens: int  # output tokens in all (params.max_tokens, or what the context leaves)
    seed: int
    stop_ids: frozenset[int]  # EOS ids (unless ignore_eos) and params.stop_token_ids
    max_num_pages: int  # KV pages the request can ever need: ceil((prompt + max_tokens - 1) / page_size)
    output_ids: list[int] = field(default_factory=list)  # non-empty only after a retraction: the tail of input_ids
    num_cached_tokens: int | None = None  # after a retraction: the prefix hit of its first admission (reported)
    admit_seq: int | None = None  # after a retraction: its place in the order of first admission
    lora_idx: int = NO_ADAPTER  # the LoRA adapter computing it (its index in --lora-modules); also its cache namespace

    @property
    def is_retracted(self) -> bool:
        return self.admit_seq is not None

    @property
    def num_orig_prompt_tokens(self) -> int:
        """The client's prompt (usage), without the output a retraction folded into input_ids."""
        return self.num_prompt_tokens - len(self.output_ids)

    @property
    def num_kv_tokens(self) -> int:
        """KV tokens it may write in all: its last sampled token is never fed back."""
        return self.num_orig_prompt_tokens + self.max_tokens - 1


@dataclass(slots=True, eq=False)
class Req:
    """An admitted request. Its page table is preallocated to the most pages it can ever need (an
    index array; what is *reserved* for it is the KvReservation's to say):

        page_table  [ tree-owned (locked via cache_node) | own pages     | unused       ]
                    0                      num_tree_pages            num_pages   max_num_pages

    Tree-owned pages belong to the radix cache and are shared; own pages belong to this request
    alone and are freed or handed to the tree when it ends.

    Its sequence is `input_ids` followed by the output not already in them:

        tokens  [ client's prompt | output folded in by a retraction | output since admission ]
                0      num_orig_prompt_tokens              num_prompt_tokens                seq_len
        output_ids                [ every output token, the folded ones first                 ]
    """

    req_id: int
    input_ids: np.ndarray  # what this admission prefills
    num_prompt_tokens: int  # len(input_ids)
    num_orig_prompt_tokens: int  # the client's prompt (usage); < num_prompt_tokens after a retraction
    params: SamplingParams
    max_tokens: int  # counts every output token, the folded ones too
    seed: int
    stop_ids: frozenset[int]
    row_idx: int
    page_table: np.ndarray  # int32[max_num_pages]
    num_pages: int
    num_tree_pages: int
    cache_node: RadixNode  # the locked end of the tree-owned prefix (the root when none)
    cached_len: int  # tokens whose K/V are in the pool, counting only steps that have returned
    num_cached_tokens: int  # prompt tokens served by the radix cache at its first admission (reported)
    admit_seq: int  # order of first admission (kept across retractions): retraction takes the newest
    output_ids: list[int] = field(default_factory=list)
    in_flight: int = 0  # batches in flight holding it: 0, 1, or 2 under overlap scheduling (OverlapRows)
    # ended while in flight (aborted; or finished with a step after fed its last token, under overlap): its final
    # update is sent; the on_result of its last batch in flight frees it, and nothing more is sent
    is_aborted: bool = False
    prompt_scores: PromptScores | None = None  # prompt logprobs asked and not yet sent (until its first output token)
    # speculative draft tokens of the decode step in flight (SpeculativeReqs), after its last token
    drafts: Sequence[int] = ()
    pooled: np.ndarray | None = None  # an embedding server's: its chunks' vectors folded so far (Pooling.combine)
    lora_idx: int = NO_ADAPTER  # the LoRA adapter computing it: its K/V is cached under this adapter only

    @property
    def seq_len(self) -> int:
        return self.num_orig_prompt_tokens + len(self.output_ids)

    @property
    def num_kv_tokens(self) -> int:
        """KV tokens it may write in all: its last sampled token is never fed back."""
        return self.num_orig_prompt_tokens + self.max_tokens - 1

    @property
    def max_num_pages(self) -> int:
        return len(self.page_table)

    @property
    def is_prefilling(self) -> bool:
        return self.cached_len < self.num_prompt_tokens

    def finish_reason(self) -> FinishReason | None:
        """Why it ends with the token just appended to its output, or None. The context limit is
        already in max_tokens (what the context leaves, when the request gave none)."""
        if self.output_ids[-1] in self.stop_ids:
            return FinishReason.STOP
        if len(self.output_ids) >= self.max_tokens:
            return FinishReason.LENGTH
        return None

    def token_ids(self, num_tokens: int) -> np.ndarray:
        """The first `num_tokens` tokens of its sequence (prompt, then output)."""
        if num_tokens <= self.num_prompt_tokens:
            return self.input_ids[:num_tokens]
        start = self.num_prompt_tokens - self.num_orig_prompt_tokens  # output already in input_ids
        tail = self.output_ids[start : start + num_tokens - self.num_prompt_tokens]
        return np.concatenate([self.input_ids, np.asarray(tail, np.int32)])

    def retracted(self) -> PendingReq:
        """What waits in the queue after a retraction: its whole sequence as the prompt (the next
        admission computes it, and samples the next token from its last position), with the
        output, reported prefix hit, seed and admission order kept."""
        input_ids = self.token_ids(self.seq_len)
        return PendingReq(
            self.req_id, input_ids, len(input_ids), self.params, self.max_tokens, self.seed, self.stop_ids,
            self.max_num_pages, list(self.output_ids), self.num_cached_tokens, self.admit_seq, self.lora_idx,
        )


@dataclass(slots=True, eq=False)
class PromptScores:
    """Prompt logprobs (echo), gathered chunk by chunk from the worker's StepResults until the
    prompt's last chunk sends them with the first token. A request asking for them is computed
    whole (no prefix-cache hit, no KV source): cached or shared tokens have no logits."""

    num_top: int  # K most likely tokens per position
    logprobs: list[np.ndarray] = field(default_factory=list)  # float32, chunk after chunk
    top_ids: list[np.ndarray] = field(default_factory=list)  # int32, K per position
    top_logprobs: list[np.ndarray] = field(default_factory=list)

    def add(self, logprobs: np.ndarray, top_ids: np.ndarray | None, top_logprobs: np.ndarray | None) -> None:
        self.logprobs.append(logprobs)
        if self.num_top:
            self.top_ids.append(top_ids)
            self.top_logprobs.append(top_logprobs)

    def message(self, prompt_ids: np.ndarray) -> PromptLogprobs:
        def joined(parts: list[np.ndarray], dtype) -> np.ndarray:
            return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

        return PromptLogprobs(
            token_ids=prompt_ids.astype(np.int32, copy=False), logprobs=joined(self.logprobs, np.float32),
            top_ids=joined(self.top_ids, np.int32), top_logprobs=joined(self.top_logprobs, np.float32),
        )


@dataclass(slots=True, eq=False)
class ChunkedReq:
    """A Req whose prompt is not all prefilled after the step it was scheduled in. It is not
    sampled, and waits at the front of the pending list, keeping its row, pages and cache lock,
    so its next chunk goes before any newer request."""

    req: Req
