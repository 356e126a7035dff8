"""The detokenizer process: token ids from the scheduler -> text deltas for the frontend.

    loop:
        DetokRegister -> start a request's incremental state (stop strings, kept or trimmed; special
                         tokens skipped or not)
        TokenOutBatch -> per request: text delta; a matched stop string finishes it here, and an
                         AbortReq (STOP) ahead of its final output asks the frontend to stop the
                         scheduler decoding it (several tokens of one step, from speculative
                         drafts, end at the one completing it); a finish flushes held-back text;
                         with logprobs, each token's own text (TokenTexts), and the prompt's text
                         in the first output when the request asked (echo)
        ReqOutput     -> pass through (a request the scheduler refused: never registered)
        StatsOut      -> pass through

Per-request state lives from DetokRegister to the request's last output, never longer. This is the
one process that turns token ids into text: clients (the HTTP process too) load no tokenizer.

A request this process ends (a stop string, or detokenizing failed) is still live in the scheduler.
The AbortReq that ends it there goes to the frontend, on the pipe its final output takes, and the
frontend passes it on to the scheduler before it frees the id: a client reusing the id at once is
then behind the abort on the frontend's one ordered pipe into the scheduler. (Sent straight to the
scheduler, the abort raced such a reuse on the scheduler's inbox, where pipes are read in no fixed
order: the new request was refused as a duplicate, or ended by the late abort.)
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import zmq
from msgspec.structs import replace

from zserve.common.config_sections import ModelSection
from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.messages import (
    DETOK_INBOX,
    FRONTEND_INBOX,
    LAUNCHER_INBOX,
    AbortReq,
    DetokRegister,
    ProcReady,
    ReqOutput,
    StatsOut,
    TokenOut,
    TokenOutBatch,
)
from zserve.common.proc_runtime import child_args, child_setup
from zserve.common.transport import Addresses, Endpoint, pull, push
from zserve.detokenizer_proc.incremental_detokenizer import IncrementalDetokenizer
from zserve.detokenizer_proc.token_texts import TokenTexts
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

logger = logging.getLogger("detokenizer_proc")


@dataclass(slots=True)
class DetokState:
    detok: IncrementalDetokenizer
    num_prompt_tokens: int
    num_output_tokens: int = 0
    prompt_text: str | None = None  # sent with the request's first output, then None
    # special tokens shown (skip_special_tokens false) but the stop token that ends the request not
    # (no_stop_trim false), as SGLang does: a chat's text does not end in EOS
    trims_stop_token: bool = False


class DetokenizerLoop:
    def __init__(self, tokenizer: TextTokenizer, inbox: Endpoint, to_frontend: Endpoint):
        self.tokenizer = tokenizer
        self.token_texts = TokenTexts(tokenizer)
        self.inbox = inbox
        self.to_frontend = to_frontend
        self.states: dict[int, DetokState] = {}

    def run_forever(self) -> None:
        while True:
            msg = self.inbox.recv()
            if isinstance(msg, DetokRegister):
                self.contained(msg.req_id, self.register, msg)
            elif isinstance(msg, TokenOutBatch):
                for out in msg.outs:
                    self.contained(out.req_id, self.on_tokens, out)
            elif isinstance(msg, ReqOutput):
                self.to_frontend.send(msg)
            elif isinstance(msg, StatsOut):
                msg.num_detokenizer_states = len(self.states)
                self.to_frontend.send(msg)

    def contained(self, req_id: int, handle, msg) -> None:
        """Run `handle(msg)`; if it raises, only request `req_id` fails (an error to its client, an
        abort to the scheduler through the frontend, ahead of it) and this process serves on."""
        try:
            handle(msg)
        except Exception as exc:
            logger.exception("req %d: detokenizing failed", req_id)
            state = self.states.pop(req_id, None)
            self.to_frontend.send(AbortReq(req_id=req_id, finish_reason=FinishReason.ERROR))
            self.to_frontend.send(ReqOutput.final(
                req_id, FinishReason.ERROR, code=ErrorCode.INTERNAL,
                error=f"detokenizing failed: {type(exc).__name__}: {exc}",
                prompt_tokens=0 if state is None else state.num_prompt_tokens,
            ))

    def register(self, msg: DetokRegister) -> None:
        prompt_text = None if msg.prompt_ids is None else self.token_texts.prompt_text(msg.prompt_ids.tolist())
        detok = IncrementalDetokenizer(self.tokenizer, stop=msg.stop, skip_special_tokens=msg.skip_special_tokens,
                                       keep_stop=msg.no_stop_trim)
        self.states[msg.req_id] = DetokState(detok, msg.num_prompt_tokens, prompt_text=prompt_text,
                                             trims_stop_token=not msg.skip_special_tokens and not msg.no_stop_trim)

    def ends_on_special_stop(self, out: TokenOut, token_ids: list[int]) -> bool:
        """Whether the request ended on a stop token (EOS, stop_token_ids) that is a special token (a visible
        stop token id stays in the text, vLLM's way)."""
        if out.finish_reason is not FinishReason.STOP or not token_ids:
            return False
        last = token_ids[-1:]
        return self.tokenizer.decode(last, skip_special_tokens=True) == "" and self.tokenizer.decode(last) != ""

    def on_tokens(self, out: TokenOut) -> None:
        state = self.states.get(out.req_id)
        if state is None:
            return  # already finished here (stop string matched while a step was in flight)
        token_ids = out.token_ids.tolist()
        shown_ids = (
            token_ids[:-1] if state.trims_stop_token and self.ends_on_special_stop(out, token_ids) else token_ids
        )
        text, num_taken = state.detok.add_tokens_until_stop(shown_ids)
        if num_taken < len(shown_ids):  # a stop string ended inside a step's several tokens: drop those after it
            out = _first_tokens(out, num_taken)
            token_ids = token_ids[:num_taken]
        state.num_output_tokens += len(token_ids)
        finish_reason, code, error = out.finish_reason, out.code, out.error
        if state.detok.stopped:
            self.to_frontend.send(AbortReq(req_id=out.req_id, finish_reason=FinishReason.STOP))  # ahead of the final
            finish_reason, code, error = FinishReason.STOP, None, None
        elif finish_reason is not None:
            text += state.detok.flush()
            # the stop string completed in held-back text
            if state.detok.stopped and finish_reason is not FinishReason.ERROR:
                finish_reason = FinishReason.STOP
        if not text and finish_reason is None and not len(out.token_ids):
            return
        texts = self.token_texts
        self.to_frontend.send(ReqOutput(
            req_id=out.req_id, text=text, token_ids=out.token_ids, finish_reason=finish_reason, code=code, error=error,
            prompt_tokens=state.num_prompt_tokens, completion_tokens=state.num_output_tokens,
            cached_tokens=out.num_cached_tokens, logprobs=out.logprobs,
            top_logprob_ids=out.top_logprob_ids, top_logprobs=out.top_logprobs,
            prompt=None if out.prompt is None else texts.with_texts(out.prompt),
            token_texts=None if out.logprobs is None else texts.texts(token_ids),
            top_logprob_texts=None if out.top_logprob_ids is None else texts.texts(out.top_logprob_ids),
            prompt_text=state.prompt_text, embedding=out.embedding,
        ))
        state.prompt_text = None
        if finish_reason is not None:
            del self.states[out.req_id]


def _first_tokens(out: TokenOut, num_tokens: int) -> TokenOut:
    """`out` with its first `num_tokens` tokens only (and their logprobs)."""
    k = len(out.top_logprob_ids) // len(out.token_ids) if out.top_logprob_ids is not None else 0
    return replace(
        out, token_ids=out.token_ids[:num_tokens],
        logprobs=None if out.logprobs is None else out.logprobs[:num_tokens],
        top_logprob_ids=None if out.top_logprob_ids is None else out.top_logprob_ids[: k * num_tokens],
        top_logprobs=None if out.top_logprobs is None else out.top_logprobs[: k * num_tokens],
    )


def serve(model: ModelSection, addrs: Addresses) -> None:
    tokenizer = TextTokenizer.from_model_dir(model.tokenizer_dir)
    ctx = zmq.Context()
    try:
        inbox = pull(ctx, addrs.detok_inbox, DETOK_INBOX)
        to_frontend = push(ctx, addrs.frontend_inbox, FRONTEND_INBOX)
        # kept open: a closed LINGER=0 socket drops its queue
        launcher = push(ctx, addrs.launcher_inbox, LAUNCHER_INBOX)
        launcher.send(ProcReady(name="detokenizer", pid=os.getpid(), info={}))
        logger.info("detokenizer ready")
        DetokenizerLoop(tokenizer, inbox, to_frontend).run_forever()
    finally:
        ctx.destroy(linger=0)


def main() -> None:
    cfg, addrs, _ = child_args()
    child_setup("detok", cfg.log_level)
    serve(cfg.section(ModelSection), addrs)
