"""Every message on every zserve socket, and the set each socket carries.

Messages are msgspec Structs declared as `class X(Message, tag=N)` (common/wire.py holds the
base class, the field types it understands and the Codec); `ForwardBatch` and `StepResult` are
declared in common/forward_batch.py, `SamplingParams` in common/sampling_params.py. Token ids
travel as `Int32Array` (raw int32 bytes). Each socket decodes with its own `Codec` listing
exactly the messages it carries (bottom of this file).

Sockets (all PUSH/PULL over ipc:// in a private runtime directory, except the client port):

    client  <-> frontend     ROUTER (tcp, --host/--port)  GenerateReq AbortReq Heartbeat StatsReq TokenizeReq |
                                                          ReqOutput StatsOut HeartbeatAck TokenizeOut
                             (GenerateReq, Heartbeat, StatsReq and TokenizeReq carry the --api-key; an AbortReq
                             only stops a request its own connection sent)
    frontend -> scheduler    inbox                        TokenizedReq AbortReq StatsReq
    scheduler -> detok                                    DetokRegister TokenOutBatch ReqOutput (a refusal) StatsOut
    detok   -> frontend                                   ReqOutput StatsOut AbortReq (the detokenizer ended the
                                                          request: the frontend passes it to the scheduler, then the
                                                          final ReqOutput behind it frees the id)
    scheduler <-> worker                                  ForwardBatch | StepResult WorkerReady WorkerError
    rank 0  -> other TP ranks  XPUB/SUB (ipc, or tcp     ForwardBatch (the scheduler's frame, re-sent)
                               across nodes)              RankHeartbeat RankStop
    children -> launcher     control                      ProcReady DrainDone (frontend)
    launcher -> frontend     control                      FailAll Drain
"""

from __future__ import annotations

from typing import Any

import numpy as np
from msgspec import field
from msgspec.structs import asdict

from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.forward_batch import ForwardBatch, StepResult
from zserve.common.histogram import Histogram
from zserve.common.sampling_params import SamplingParams
from zserve.common.scheduler_stats import SchedulerStats
from zserve.common.weight_memory import WeightMemory
from zserve.common.wire import Codec, Float32Array, Int32Array, Message

NO_TOKEN_IDS = np.frombuffer(b"", np.int32)  # read-only, so one shared empty array is safe
PROBE_CLIENT_PREFIX = "zserve-probe-"  # a client id so named sends health probes: not user traffic (metrics, INFO logs)


# ---- client <-> frontend -------------------------------------------------------------------


class GenerateReq(Message, tag=10):
    """`body` is the client's request exactly as sent: untrusted JSON-like values (str keys; str,
    int, float, bool, None, lists and maps of those), meant to hold exactly one of prompt /
    input_ids / messages plus `sampling` (SamplingParams fields). The frontend's RequestValidator
    is the only reader: it checks every value before anything else sees the request."""

    req_id: int
    client_id: str
    body: dict[str, Any]
    api_key: str = ""  # checked by the frontend when the server has an API key (ErrorCode.UNAUTHORIZED)


class AbortReq(Message, tag=11):
    """Stop a request. `finish_reason` is ABORT, or STOP when the detokenizer matched a stop string
    (a normal finish; ERROR when detokenizing failed); the frontend forwards a client's abort as ABORT
    whatever it said. The detokenizer's goes to the frontend, ahead of the request's final output, and
    the frontend sends it on to the scheduler before that output frees the id: the one ordered pipe
    into the scheduler carries it ahead of any new request reusing the id."""

    req_id: int
    finish_reason: FinishReason = FinishReason.ABORT


class Heartbeat(Message, tag=12):
    """Keeps the client's requests alive; with a wrong API key it is acknowledged but keeps nothing alive."""

    client_id: str
    api_key: str = ""


class HeartbeatAck(Message, tag=13):
    client_id: str


class StatsReq(Message, tag=14):
    req_id: int
    api_key: str = ""  # the frontend checks it and does not forward it


class FrontendStats(Message):
    """The frontend's part of StatsOut: what is in flight, and how every request ended (any door)."""

    num_in_flight: int
    is_draining: bool
    num_finished: dict[FinishReason, int]  # requests ended, by finish reason
    num_errors: dict[ErrorCode, int]  # of the ERROR ones, by code


class StatsOut(Message, tag=15):
    """The answer to a StatsReq, filled on its way: the scheduler's record, then the
    detokenizer's count, then the frontend's record, histograms and info."""

    req_id: int
    scheduler: SchedulerStats | None = None  # None when the frontend refused the StatsReq (`code` says why)
    num_detokenizer_states: int = 0  # requests the detokenizer holds state for
    frontend: FrontendStats | None = None
    code: ErrorCode | None = None  # set (with `error`, and no stats) when the frontend refused the StatsReq
    error: str | None = None
    # the scheduler's queue time, the frontend's latencies
    histograms: dict[str, Histogram] = field(default_factory=dict)
    # the frontend's: model_path (benchmarks build prompts with its tokenizer)
    info: dict[str, str] = field(default_factory=dict)
    memory: WeightMemory | None = None  # the model worker's (WorkerReady), filled by the scheduler

    def as_dict(self) -> dict[str, Any]:
        """What `stats()` returns, one flat dict: the SchedulerStats fields, `detokenizer_states`,
        `frontend_in_flight`, `frontend_draining`, `requests_finished_<reason>` and
        `requests_error_<code>`, the info, and `histograms` as plain dicts."""
        out: dict[str, Any] = {} if self.scheduler is None else asdict(self.scheduler)
        if self.scheduler is not None:
            out["detokenizer_states"] = self.num_detokenizer_states
        if self.frontend is not None:
            out["frontend_in_flight"] = self.frontend.num_in_flight
            out["frontend_draining"] = int(self.frontend.is_draining)
            out.update({f"requests_finished_{reason.text}": n for reason, n in self.frontend.num_finished.items()})
            out.update({f"requests_error_{code.text}": n for code, n in self.frontend.num_errors.items()})
        if self.memory is not None:
            out["memory"] = self.memory.as_dict()
        return {**out, **self.info, "histograms": {name: h.to_dict() for name, h in self.histograms.items()}}


class TokenizeReq(Message, tag=17):
    """POST /tokenize and /detokenize: the frontend's tokenizer and chat template, nothing scheduled.
    `body` is what to encode ({"prompt": str} or {"messages": [...]} with a chat's rendering options,
    tokenizer_proc/chat_options.py) or to decode ({"input_ids": [...]}); `return_token_strs: true` adds
    each id's vocabulary string."""

    req_id: int
    body: dict[str, Any]
    add_special_tokens: bool = True  # with a prompt: the tokenizer's BOS (and such), as vLLM's field says
    api_key: str = ""


class TokenizeOut(Message, tag=18):
    """The answer to a TokenizeReq: the prompt's ids, or the ids' text; `code` and `error` when refused."""

    req_id: int
    input_ids: list[int] = field(default_factory=list)
    text: str | None = None
    code: ErrorCode | None = None
    error: str | None = None
    token_strs: list[str] | None = None  # each id's vocabulary string, when the body asked (return_token_strs)


class PromptLogprobs(Message):
    """A prompt's tokens and the logprob of each but the first (nothing predicts it), with the K
    most likely tokens at each of those positions (K = the request's prompt_logprobs)."""

    token_ids: Int32Array  # [P]
    logprobs: Float32Array  # [P - 1]: of token_ids[1:]
    top_ids: Int32Array  # [(P - 1) * K], position after position, most likely first
    top_logprobs: Float32Array  # [(P - 1) * K]
    token_texts: list[str] | None = None  # [P]: each token's own text, attached by the detokenizer
    top_texts: list[str] | None = None  # [(P - 1) * K]: the text of each of top_ids (detokenizer)


class ReqOutput(Message, tag=16):
    """One streamed piece of a request's result. The last one has `finish_reason` set; when it
    is ERROR, `code` says whose fault it is and `error` is the message for people."""

    req_id: int
    text: str
    token_ids: Int32Array  # the tokens behind `text` and any held-back text
    finish_reason: FinishReason | None = None
    code: ErrorCode | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[float] | None = None
    top_logprob_ids: list[int] | None = None  # K per token (the request's top_logprobs), most likely first
    top_logprobs: list[float] | None = None
    prompt: PromptLogprobs | None = None  # in the first output, when the request asked for prompt_logprobs
    # token text, decoded by the detokenizer (the one process that turns ids into text) so that no client needs a
    # tokenizer:
    token_texts: list[str] | None = None  # with logprobs: each of token_ids' own text (its decoding alone)
    top_logprob_texts: list[str] | None = None  # the text of each of top_logprob_ids
    prompt_text: str | None = None  # in the first output, when the request asked for return_prompt_text (echo)
    embedding: Float32Array | None = None  # an embedding request's pooled vector (float32 bytes), in its final output

    @staticmethod
    def final(
        req_id: int, finish_reason: FinishReason, code: ErrorCode | None = None, error: str | None = None,
        prompt_tokens: int = 0,
    ) -> ReqOutput:
        """The only output of a request that ends without producing anything (refused, or ended by FailAll)."""
        return ReqOutput(
            req_id=req_id, text="", token_ids=NO_TOKEN_IDS, finish_reason=finish_reason, code=code, error=error,
            prompt_tokens=prompt_tokens,
        )


# ---- frontend -> scheduler -----------------------------------------------------------------


class TokenizedReq(Message, tag=20):
    req_id: int
    input_ids: Int32Array
    params: SamplingParams  # validated by the frontend (RequestValidator); the scheduler trusts it
    num_copies: int = 1  # n choices of one prompt: requests req_id .. req_id + n - 1, copy i seeded seed + i


# ---- scheduler -> detokenizer --------------------------------------------------------------


class DetokRegister(Message, tag=30):
    """Sent when the scheduler accepts a request, before any of its tokens (same socket, so
    ordered). A refused request is never registered: its one ReqOutput goes through the
    detokenizer as it is, with its prompt count."""

    req_id: int
    stop: list[str]
    num_prompt_tokens: int
    prompt_ids: Int32Array | None = None  # the prompt, when the request asked for its text (return_prompt_text)
    skip_special_tokens: bool = True  # the request's SamplingParams' (the text leaves special tokens out)
    no_stop_trim: bool = False  # the request's SamplingParams' (the text keeps the stop string that ended it)


class TokenOut(Message):
    """What happened to one request in one step: the scheduler makes one per request per step in
    which something happened to it. A request's last TokenOut is the only one with
    `finish_reason` set, and nothing follows it.

    finish_reason: STOP (an EOS id or a stop token id; that token is the last of `token_ids`),
    LENGTH (max_tokens, or the context limit), ABORT, or ERROR (with `code` and `error`).
    """

    req_id: int
    token_ids: Int32Array  # the new tokens: one per step, none in an update that only ends the request
    finish_reason: FinishReason | None = None
    code: ErrorCode | None = None
    error: str | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the radix cache
    logprobs: list[float] | None = None  # one per new token, when the request asked
    top_logprob_ids: list[int] | None = None  # params.top_logprobs per new token, most likely first
    top_logprobs: list[float] | None = None  # their logprobs
    prompt: PromptLogprobs | None = None  # with the first token, when the request asked for prompt_logprobs
    embedding: Float32Array | None = None  # an embedding server's (--task embed) answer, in the final update


class TokenOutBatch(Message, tag=31):
    """Every TokenOut of one scheduler step (or of one submit / abort), in one frame.

    A list of records, not columns: the detokenizer handles requests one by one anyway, most
    fields are empty for most records, and a record is what the scheduler core hands its tests."""

    outs: list[TokenOut]


# ---- model worker -> scheduler --------------------------------------------------------------


class WorkerReady(Message, tag=40):
    num_pages: int
    page_size: int
    context_len: int
    eos_token_ids: list[int]
    vocab_size: int
    device_type: str = "cpu"  # where the worker computes (torch.device.type): what --overlap-schedule auto goes by
    memory: WeightMemory | None = None  # rank 0's weights and KV pool (the scheduler hands it out with StatsOut)


class WorkerError(Message, tag=41):
    step_id: int
    message: str


# ---- rank 0 -> other tensor-parallel ranks ---------------------------------------------------


class RankHeartbeat(Message, tag=60):
    """Rank 0 is alive and idle; a follower that hears nothing for a while exits."""

    step_id: int  # the last step rank 0 broadcast (0 before the first)


class RankStop(Message, tag=61):
    """Rank 0 is stopping: followers exit, with code 0 when `error` is None (the server stopped)."""

    error: str | None = None


# ---- control -------------------------------------------------------------------------------


class ProcReady(Message, tag=50):
    name: str
    pid: int
    info: dict[str, int | str | list[int]]  # what the launcher reports or needs: ports, url, the KV pool
    start_phases: dict[str, float] = {}  # seconds by phase of this process's start (common/start_phases.py), in order


class FailAll(Message, tag=51):
    """Launcher -> frontend: end every in-flight request with this outcome (ABORT on shutdown,
    ERROR with code GONE when a process died)."""

    finish_reason: FinishReason
    code: ErrorCode | None = None
    error: str | None = None


class Drain(Message, tag=52):
    """Launcher -> frontend: stop admitting (new requests get SHUTTING_DOWN) and say DrainDone
    once nothing is in flight."""

    timeout_s: float  # how long the launcher waits, for the log


class DrainDone(Message, tag=53):
    """Frontend -> launcher: the drain is complete, nothing is in flight."""

    num_drained: int  # requests that were in flight when the drain began


CLIENT_TO_FRONTEND = Codec(GenerateReq, AbortReq, Heartbeat, StatsReq, TokenizeReq)
FRONTEND_TO_CLIENT = Codec(ReqOutput, StatsOut, HeartbeatAck, TokenizeOut)
SCHEDULER_INBOX = Codec(TokenizedReq, AbortReq, StatsReq)
DETOK_INBOX = Codec(DetokRegister, TokenOutBatch, ReqOutput, StatsOut)
FRONTEND_INBOX = Codec(ReqOutput, StatsOut, AbortReq, FailAll, Drain)
WORKER_INBOX = Codec(ForwardBatch)
WORKER_TO_SCHEDULER = Codec(StepResult, WorkerReady, WorkerError)
RANK_BROADCAST = Codec(ForwardBatch, RankHeartbeat, RankStop)
LAUNCHER_INBOX = Codec(ProcReady, DrainDone)
