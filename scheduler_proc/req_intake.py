"""ReqIntake: a submitted request's way in: its copies (n choices of one prompt), their seeds, and
why one is refused.

`submit` queues copies req_id .. req_id + n - 1 together, so one round admits them and the prompt
is computed once (the PrefillAdder's KV sharing); copy i draws with seed + i. Each copy is refused
on its own: a duplicate id (INTERNAL), what can never run (INVALID), a full queue (BUSY).

The tokenizer process validates requests; the scheduler still refuses what it could never
finish (an empty prompt, prompt + max_tokens beyond the context, more KV than the whole pool)
with a reason at once, instead of letting it wait forever. A max_tokens given is never cut; a
request without one (None) may generate up to the context, or up to what the whole KV pool holds
when that is less (SGLang caps a request at the pool the same way): it then ends with `length`.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

import numpy as np

from zserve.common.context_limit import over_context_error
from zserve.common.error_code import ErrorCode
from zserve.common.int_math import cdiv
from zserve.common.lora_modules import adapter_index, unknown_adapter_error
from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.constrained_reqs import ConstrainedReqs
from zserve.scheduler_proc.pending_list import PendingList
from zserve.scheduler_proc.req import PendingReq


class ReqIntake:
    def __init__(
        self, *, context_len: int, page_size: int, num_pages: int, eos_token_ids: Sequence[int], seed: int,
        pending: PendingList, constrained: ConstrainedReqs, lora_names: tuple[str, ...] = (),
    ):
        self.context_len = context_len
        self.page_size = page_size
        self.num_pages = num_pages
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self._pending = pending
        self._constrained = constrained
        self.lora_names = lora_names  # the adapters a request's lora_path names, by index (the frontend checked it)
        self._rng = np.random.default_rng(seed)  # seeds for requests that give none: reproducible runs

    def submit(
        self, req_id: int, input_ids: Sequence[int] | np.ndarray, params: SamplingParams, num_copies: int,
        live: Container[int],
    ) -> tuple[list[PendingReq], list[tuple[int, ErrorCode, str]]]:
        """Queue the request's copies (their grammars started); returns the queued ones, for the
        Scheduler to make live, and the refused ones with why. `live`: the req_ids in use."""
        input_ids = np.array(input_ids, dtype=np.int32).reshape(-1)
        max_tokens = self.max_tokens(len(input_ids), params)
        queued, refused = [], []
        for copy_idx in range(num_copies):
            copy_id = req_id + copy_idx
            refusal = self._refusal(copy_id, params, len(input_ids), max_tokens, live)
            if refusal is not None:
                refused.append((copy_id, *refusal))
                continue
            pending = self.pending(copy_id, input_ids, params, max_tokens, copy_idx)
            self._constrained.start(copy_id, params)
            self._pending.add(pending)
            queued.append(pending)
        return queued, refused

    def _refusal(
        self, req_id: int, params: SamplingParams, num_prompt_tokens: int, max_tokens: int, live: Container[int],
    ) -> tuple[ErrorCode, str] | None:
        """Why the request is refused now, and whose fault that is; None to queue it."""
        if req_id in live:
            return ErrorCode.INTERNAL, f"duplicate req_id {req_id}: a request with this id is still live"
        error = self.refusal(num_prompt_tokens, max_tokens) or self._constrained.refusal(params)
        if params.lora_path and params.lora_path not in self.lora_names:
            error = unknown_adapter_error(params.lora_path, self.lora_names)
        if error is not None:
            return ErrorCode.INVALID, error
        if self._pending.is_full:
            pending = self._pending
            return ErrorCode.BUSY, (
                f"server busy: {len(pending)} requests waiting (max_queued_requests={pending.max_queued_requests})"
            )
        return None

    def max_tokens(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        """params.max_tokens, or when it is None what the context leaves after the prompt, and
        at most what the pool holds (prompt + max_tokens - 1 tokens of KV)."""
        if params.max_tokens is not None:
            return params.max_tokens
        pool_tokens = self.num_pages * self.page_size
        return max(1, min(self.context_len - num_prompt_tokens, pool_tokens - num_prompt_tokens + 1))

    def max_num_pages(self, num_prompt_tokens: int, max_tokens: int) -> int:
        """KV pages the request can ever need. Its last sampled token is never fed back, so
        never written: prompt + max_tokens - 1 tokens of KV."""
        return cdiv(num_prompt_tokens + max_tokens - 1, self.page_size)

    def refusal(self, num_prompt_tokens: int, max_tokens: int) -> str | None:
        """Why the request can never run on this server (the scheduler refuses it as
        ErrorCode.INVALID: the request's fault, not the server's state), or None."""
        if num_prompt_tokens == 0:
            return "empty prompt"
        if num_prompt_tokens >= self.context_len:
            return (
                f"prompt of {num_prompt_tokens} tokens leaves no room for output in the context of "
                f"{self.context_len} tokens"
            )
        if num_prompt_tokens + max_tokens > self.context_len:
            return over_context_error(self.context_len, num_prompt_tokens, max_tokens)
        num_need_pages = self.max_num_pages(num_prompt_tokens, max_tokens)
        if num_need_pages > self.num_pages:
            return (
                f"prompt of {num_prompt_tokens} tokens plus max_tokens {max_tokens} needs {num_need_pages} KV pages "
                f"of {self.page_size} tokens; the whole pool has {self.num_pages}"
            )
        return None

    def pending(
        self, req_id: int, input_ids: np.ndarray, params: SamplingParams, max_tokens: int, copy_idx: int = 0,
    ) -> PendingReq:
        """Copy `copy_idx` of n choices of one prompt draws with seed + copy_idx (the one place it is
        computed); without a seed, each copy draws its own from the scheduler's generator."""
        num_prompt_tokens = len(input_ids)
        seed = (params.seed + copy_idx) % 2**63 if params.seed is not None else int(self._rng.integers(0, 2**63 - 1))
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids)
        return PendingReq(
            req_id, input_ids, num_prompt_tokens, params, max_tokens, seed, stop_ids,
            self.max_num_pages(num_prompt_tokens, max_tokens),
            lora_idx=adapter_index(self.lora_names, params.lora_path),
        )

