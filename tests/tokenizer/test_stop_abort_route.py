"""A stop string's abort and a reuse of its id reach the scheduler in that order, whatever the timing.

The detokenizer matches stop strings: it ends the request's output there and the scheduler must stop
decoding it (an AbortReq, STOP). The id is free for its client once the final answer is out, and the
client may send a new request with it at once. The scheduler's inbox takes messages from several
pipes in no fixed order (ZMQ fair-queues them), so the abort must travel the frontend's pipe, ahead of
anything the frontend passes on after the answer: the scheduler then lets go of the old request before
it sees the new one. Here the three loops run in-process on their real code (the frontend on inproc
sockets, the detokenizer's loop, the scheduler loop's message handling on the scheduler core), and the
scheduler reads each pipe whole in turn, the frontend's first: the worst order ZMQ may pick."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from testing.outbox import Outbox
from testing.scheduler_harness import make_scheduler
from testing.tokenizer_fixtures import build_byte_level_bpe
from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.messages import (
    CLIENT_TO_FRONTEND,
    DETOK_INBOX,
    FRONTEND_INBOX,
    FRONTEND_TO_CLIENT,
    SCHEDULER_INBOX,
    AbortReq,
    DetokRegister,
    FailAll,
    GenerateReq,
    ReqOutput,
    TokenizedReq,
    TokenOut,
    TokenOutBatch,
)
from zserve.common.transport import pull, push
from zserve.detokenizer_proc.detokenizer_process import DetokenizerLoop
from zserve.scheduler_proc.scheduler_process import SchedulerLoop
from zserve.scheduler_proc.stats_logger import StatsLogger
from zserve.tokenizer_proc.client_registry import ClientRegistry
from zserve.tokenizer_proc.frontend import Frontend
from zserve.tokenizer_proc.request_validator import RequestValidator
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

REQ_ID = 4242
TEXT = "The cat sat on the mat. The dog ran far away."
STOP = "dog"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    return TextTokenizer.from_model_dir(build_byte_level_bpe(tmp_path_factory.mktemp("bpe")))


class Pipeline:
    """Client -> frontend -> scheduler (core and message handling) -> detokenizer -> frontend -> client,
    each pipe into the scheduler an Outbox that the test empties when it chooses."""

    def __init__(self, tokenizer: TextTokenizer):
        self.ctx = zmq.Context()
        router = self.ctx.socket(zmq.ROUTER)
        router.bind("inproc://clients")
        inbox = pull(self.ctx, "inproc://frontend-inbox", FRONTEND_INBOX)
        self.frontend_pipe = Outbox(SCHEDULER_INBOX)  # frontend -> scheduler
        self.frontend = Frontend(RequestValidator(tokenizer, 256), router, inbox, self.frontend_pipe,
                                 ClientRegistry(client_timeout_s=60.0))
        self.detok = DetokenizerLoop(tokenizer, inbox=None,
                                     to_frontend=push(self.ctx, "inproc://frontend-inbox", FRONTEND_INBOX))
        self.to_detok = Outbox(DETOK_INBOX)
        self.scheduler = make_scheduler(num_pages=64, page_size=4, context_len=256, eos_token_ids=[])
        self.scheduler_loop = SchedulerLoop(self.scheduler, None, None, None, self.to_detok,
                                            StatsLogger(interval_s=0.0, num_pages=64))
        self.client = self.ctx.socket(zmq.DEALER)
        self.client.connect("inproc://clients")

    def client_sends(self, msg) -> None:
        self.client.send(CLIENT_TO_FRONTEND.encode(msg))
        assert self.frontend.router.poll(1000)
        self.frontend.drain_clients()

    def client_reads(self) -> list[ReqOutput]:
        got = []
        while self.client.poll(50):
            got.append(FRONTEND_TO_CLIENT.decode(self.client.recv()))
        return got

    def scheduler_reads(self, pipes: list[Outbox]) -> None:
        """The scheduler handles every message waiting in `pipes`, each pipe whole in turn."""
        for pipe in pipes:
            msgs, pipe.sent = pipe.sent, []
            for msg in msgs:
                self.scheduler_loop.handle(msg)

    def detok_reads(self) -> None:
        """The detokenizer handles what the scheduler sent it; the frontend then routes what came out."""
        msgs, self.to_detok.sent = self.to_detok.sent, []
        for msg in msgs:
            if isinstance(msg, DetokRegister):
                self.detok.register(msg)
            elif isinstance(msg, TokenOutBatch):
                for out in msg.outs:
                    self.detok.on_tokens(out)
            else:
                self.detok.to_frontend.send(msg)
        while self.frontend.inbox.socket.poll(50):
            self.frontend.drain_inbox()

    def close(self) -> None:
        self.ctx.destroy(linger=0)


@pytest.fixture()
def pipeline(tokenizer):
    p = Pipeline(tokenizer)
    yield p
    p.close()


def generate_req() -> GenerateReq:
    sampling = {"max_tokens": 64, "stop": [STOP], "ignore_eos": True}
    return GenerateReq(req_id=REQ_ID, client_id="a", body={"prompt": "Hello", "sampling": sampling})


@pytest.mark.parametrize("scheduler_done", [False, True], ids=["still-decoding", "finished-on-its-own"])
def test_an_id_reused_after_a_stop_string_answer_is_taken_and_untouched_by_the_old_abort(
    pipeline, tokenizer, scheduler_done,
):
    """`scheduler_done`: the scheduler had ended the old request on its own (max_tokens in a step after
    the stop string's), so the abort finds nothing of it; otherwise it still decodes it."""
    pipeline.client_sends(generate_req())
    pipeline.scheduler_reads([pipeline.frontend_pipe])
    pipeline.detok_reads()  # its DetokRegister
    if scheduler_done:
        pipeline.scheduler.abort(REQ_ID, FinishReason.LENGTH)
        pipeline.to_detok.sent.clear()  # its last update would be dropped by the detokenizer: the stop ended it
    ids = tokenizer.encode(TEXT)
    pipeline.to_detok.send(TokenOutBatch(outs=[TokenOut(req_id=REQ_ID, token_ids=np.array(ids, np.int32))]))
    pipeline.detok_reads()  # the stop string matches: the answer goes out
    [final] = pipeline.client_reads()
    assert (final.finish_reason, final.text) == (FinishReason.STOP, TEXT[: TEXT.index(STOP)])
    pipeline.client_sends(generate_req())  # the client reuses its id at once
    pipeline.scheduler_reads([pipeline.frontend_pipe])  # the only pipe into it that carries aborts
    pipeline.detok_reads()
    assert pipeline.client_reads() == []  # no refusal, and no late end of the new request
    assert pipeline.detok.states.keys() == {REQ_ID} and pipeline.frontend.registry.owns("a", REQ_ID)
    stats = pipeline.scheduler.stats()
    assert (stats.num_waiting, stats.num_refused) == (1, 0), stats  # the new request waits for its prefill
    pipeline.scheduler.check_integrity()


def test_the_abort_goes_to_the_scheduler_before_the_answer_frees_the_id(pipeline, tokenizer):
    pipeline.client_sends(generate_req())
    pipeline.scheduler_reads([pipeline.frontend_pipe])
    pipeline.detok_reads()
    ids = tokenizer.encode(TEXT)
    pipeline.to_detok.send(TokenOutBatch(outs=[TokenOut(req_id=REQ_ID, token_ids=np.array(ids, np.int32))]))
    pipeline.detok_reads()
    assert pipeline.frontend_pipe.sent == [AbortReq(req_id=REQ_ID, finish_reason=FinishReason.STOP)]
    assert pipeline.frontend.registry.num_in_flight == 0 and pipeline.detok.states == {}
    pipeline.client_sends(generate_req())
    assert [type(m) for m in pipeline.frontend_pipe.sent] == [AbortReq, TokenizedReq]


def test_an_abort_for_an_id_no_longer_in_flight_here_is_dropped(pipeline):
    """FailAll ended the request already (and told the scheduler): the id may be another request's now."""
    pipeline.detok.to_frontend.send(AbortReq(req_id=REQ_ID, finish_reason=FinishReason.STOP))
    while pipeline.frontend.inbox.socket.poll(50):
        pipeline.frontend.drain_inbox()
    assert pipeline.frontend_pipe.sent == []


@pytest.mark.parametrize("code", [None, ErrorCode.GONE], ids=["shutdown", "process-died"])
def test_after_fail_all_no_request_is_admitted_so_no_late_output_finds_a_reused_id(pipeline, code):
    """FailAll ends every request at once, freeing its id while its last outputs may still be on their way: a client
    reusing the id is refused (the server is stopping), and the old request's late output reaches no one."""
    pipeline.client_sends(generate_req())
    pipeline.scheduler_reads([pipeline.frontend_pipe])
    pipeline.detok_reads()
    reason = FinishReason.ABORT if code is None else FinishReason.ERROR
    pipeline.detok.to_frontend.send(FailAll(finish_reason=reason, code=code, error=None if code is None else "x died"))
    while pipeline.frontend.inbox.socket.poll(50):
        pipeline.frontend.drain_inbox()
    [ended] = pipeline.client_reads()
    assert ended.req_id == REQ_ID and ended.finish_reason == reason
    assert pipeline.frontend_pipe.sent == [AbortReq(req_id=REQ_ID)]
    pipeline.frontend_pipe.sent = []
    pipeline.client_sends(generate_req())  # the same id, free again at its client
    [refused] = pipeline.client_reads()
    assert refused.req_id == REQ_ID and refused.code == (code or ErrorCode.SHUTTING_DOWN)
    assert "server stopping" in refused.error
    assert pipeline.frontend_pipe.sent == [] and pipeline.frontend.registry.num_in_flight == 0
    late = ReqOutput(req_id=REQ_ID, text="late", token_ids=np.array([7], np.int32))  # the old request's last words
    pipeline.detok.to_frontend.send(late)
    while pipeline.frontend.inbox.socket.poll(50):
        pipeline.frontend.drain_inbox()
    assert pipeline.client_reads() == []
