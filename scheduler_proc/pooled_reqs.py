"""PoolingReqs: an embedding server's part of the scheduler core (--task embed, common/task.py), the
owner of every request's pooled vector, called by the Scheduler alone:

    start     prefix_cache: off under pooling (a hit would skip positions that mean and CLS pooling read)
    step      mode: the ForwardBatch's pooling, so the worker returns one vector per row (model_proc/chunk_pooler.py)
    result    on_result: fold each row's chunk vector into its request (`Req.pooled`, Pooling.combine);
              a prompt's last chunk ends it with its embedding (Pooling.finish), no token sampled
    end       release: finish or abort through the core's own calls; the vector goes with the request

Every request is a prompt only: it is prefilled in chunks by the token budget and never decodes, so
a step carries prefill rows only and nothing is ever retracted. On a generating server (no pooling)
the owner is off and the core samples as usual.

Another kind of work (classify, score) is one more owner like this one, plus its route in http_proc.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from zserve.common.finish_reason import FinishReason
from zserve.common.forward_batch import StepResult
from zserve.common.messages import NO_TOKEN_IDS, TokenOut
from zserve.common.pooling import Pooling
from zserve.scheduler_proc.req import PendingReq, Req
from zserve.scheduler_proc.scheduled_batch import ScheduledBatch


class PoolingReqs:
    def __init__(self, pooling: Pooling | None):
        """`pooling` None: a generating server, the owner is off."""
        self.pooling = pooling

    @property
    def is_on(self) -> bool:
        return self.pooling is not None

    @property
    def mode(self) -> str | None:
        """The ForwardBatch's `pooling` (None: the worker samples)."""
        return None if self.pooling is None else self.pooling.mode

    def prefix_cache(self, enabled: bool) -> bool:
        """Whether the radix cache shares prefixes (--disable-radix-cache or not): never under pooling."""
        return enabled and self.pooling is None

    def on_result(
        self, batch: ScheduledBatch, result: StepResult, release: Callable[[Req], None],
        finish: Callable[[Req, FinishReason], None],
    ) -> list[TokenOut]:
        """An embedding server's step (prefill rows only): fold each row's chunk vector into its
        request; a prompt's last chunk ends it (`finish`) with its embedding. A request aborted in
        flight is freed (`release`): its abort update is sent."""
        pooling = self.pooling
        assert pooling is not None and not batch.decode_reqs, f"step {batch.step_id}: decode rows while pooling"
        assert result.pooled is not None, f"step {batch.step_id}: no pooled vectors from an embedding worker"
        vectors = result.pooled.reshape(len(batch.reqs), -1)
        updates = []
        prefilled = zip(batch.prefill_reqs, batch.prefill_extend_lens, batch.prefill_is_sampled, strict=True)
        for row, (req, extend_len, is_last_chunk) in enumerate(prefilled):
            req.in_flight -= 1
            req.cached_len += extend_len
            if req.is_aborted:
                release(req)
                continue
            req.pooled = pooling.combine(req.pooled, vectors[row])
            if not is_last_chunk:
                continue
            embedding = pooling.finish(req.pooled, req.num_orig_prompt_tokens)
            updates.append(TokenOut(
                req_id=req.req_id, token_ids=NO_TOKEN_IDS, finish_reason=FinishReason.STOP, embedding=embedding,
            ))
            finish(req, FinishReason.STOP)
        return updates

    def check_integrity(self, live: Mapping[int, PendingReq | Req], num_running: int) -> None:
        """Off: no request holds a pooled vector. On: nobody decodes, and only a request part-way
        through its prompt holds one (its earlier chunks', folded)."""
        for entry in live.values():
            if not isinstance(entry, Req):
                continue
            assert entry.pooled is None or (self.is_on and entry.cached_len > 0), (
                f"request {entry.req_id} holds a pooled vector {'before its first chunk' if self.is_on else 'unpooled'}"
            )
        assert not self.is_on or num_running == 0, f"{num_running} requests decode on an embedding server"
