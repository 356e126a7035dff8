"""XGrammarSource: the GrammarSource of the server, with xgrammar.

    start      the request's grammar (json_object, json_schema, regex, ebnf) is compiled in a
               background thread, compiled grammars cached by their spec
    is_ready   compiled: the request gets its own matcher, at the grammar's start
    failure    a spec xgrammar refuses is INVALID (naming xgrammar's message); anything else INTERNAL
    fill_bitmask / accept / is_terminated / release: the request's matcher

xgrammar (and transformers, for the tokenizer's vocabulary) are imported in the background
thread that `grammar_thread()` starts as the scheduler process starts, so the import (~1.5 s: it
imports torch) overlaps the model worker's load instead of the first requests (the scheduler's loop
shares the GIL with it); `warm_up` then indexes the vocabulary there once the worker has said its
size. `--grammar-backend none` builds no source and starts no thread.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zserve.common.error_code import ErrorCode

logger = logging.getLogger("scheduler_proc")
GRAMMAR_THREAD_NICE = 5  # the grammar thread's niceness above the scheduler's: background work


def lower_this_thread_priority(nice: int) -> None:
    """Make the calling thread `nice` steps nicer (Linux: a thread's own priority); elsewhere, or where the
    system refuses, nothing (the work runs at the process's priority)."""
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except OSError as exc:
        logger.debug("grammar thread keeps its priority: %s", exc)


def import_grammar_modules() -> None:
    """xgrammar and the tokenizer class it indexes (a failure here repeats, and is logged, at the warm-up)."""
    import xgrammar  # noqa: F401
    from transformers import PreTrainedTokenizerFast  # noqa: F401


def grammar_thread() -> ThreadPoolExecutor:
    """The grammar thread, GRAMMAR_THREAD_NICE below the process, its first work the modules' import."""
    executor = ThreadPoolExecutor(
        1, thread_name_prefix="grammar", initializer=lower_this_thread_priority, initargs=(GRAMMAR_THREAD_NICE,)
    )
    executor.submit(import_grammar_modules)
    return executor


class GrammarError(ValueError):
    """The grammar spec cannot be compiled (the message is xgrammar's, fit for the client)."""


@dataclass
class XGrammarSource:
    model_dir: str
    vocab_size: int
    stop_token_ids: list[int]
    _building: dict[int, Future] = field(default_factory=dict)  # req_id -> its compiled grammar, to come
    _matchers: dict[int, Any] = field(default_factory=dict)  # req_id -> xgrammar.GrammarMatcher
    executor: ThreadPoolExecutor = field(default_factory=grammar_thread)  # the scheduler hands over the one it started
    _compiled: dict[tuple[str, str], Future] = field(default_factory=dict)
    _compiler: Any = None
    _whitespace_ids: frozenset[int] | None = None  # from the vocabulary the compiler indexed
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def warm_up(self) -> None:
        """Import xgrammar and index the vocabulary in the background now, so the first
        constrained request does not wait for it (a failure is logged; requests then fail with it).
        The grammar thread runs GRAMMAR_THREAD_NICE below the process, so this second or two of work
        does not slow the first answers on a machine of few cores (the model worker gets them first)."""
        self.executor.submit(self._get_compiler).add_done_callback(self._log_warm_up)

    @staticmethod
    def _log_warm_up(future: Future) -> None:
        if future.exception() is not None:
            logger.error("structured output unavailable: %s: %s", type(future.exception()).__name__, future.exception())

    def start(self, req_id: int, spec: tuple[str, str]) -> None:
        future = self._compiled.get(spec)
        if future is None:
            future = self._compiled[spec] = self.executor.submit(self._compile, spec)
        self._building[req_id] = future

    def is_ready(self, req_id: int) -> bool:
        if req_id in self._matchers:
            return True
        future = self._building[req_id]
        if not future.done() or future.exception() is not None:
            return False
        import xgrammar

        self._matchers[req_id] = xgrammar.GrammarMatcher(future.result())
        del self._building[req_id]
        return True

    def failure(self, req_id: int) -> tuple[ErrorCode, str] | None:
        future = self._building.get(req_id)
        error = future.exception() if future is not None and future.done() else None
        if error is None:
            return None
        return (ErrorCode.INVALID if isinstance(error, GrammarError) else ErrorCode.INTERNAL), str(error)

    def fill_bitmask(self, req_id: int, bitmask: np.ndarray, row: int) -> None:
        self._matchers[req_id].fill_next_token_bitmask(bitmask, row)  # numpy through DLPack: written in place

    def accept(self, req_id: int, token_id: int) -> None:
        if not self._matchers[req_id].accept_token(token_id):
            logger.warning("req %d: the grammar refused token %d it allowed", req_id, token_id)

    def is_terminated(self, req_id: int) -> bool:
        return self._matchers[req_id].is_terminated()

    def release(self, req_id: int) -> None:
        self._building.pop(req_id, None)
        self._matchers.pop(req_id, None)

    def held_req_ids(self) -> set[int]:
        return set(self._building) | set(self._matchers)

    def whitespace_ids(self) -> frozenset[int]:
        if self._whitespace_ids is None:
            self._get_compiler()
        return self._whitespace_ids

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    # ---- in the background thread --------------------------------------------------------------

    def _compile(self, key: tuple[str, str]) -> Any:
        kind, spec = key
        compiler = self._get_compiler()
        try:
            if kind == "json_object":  # OpenAI's JSON mode: an object
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "json_schema":  # compact JSON: a model cannot pad it with whitespace forever
                return compiler.compile_json_schema(spec, any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(spec)
            return compiler.compile_grammar(spec)
        except (RuntimeError, ValueError) as exc:  # xgrammar's refusal of the spec: the client's to fix
            text = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            text = re.sub(r"^\[[^\]]*\]\s*\S+\.cc:\d+:\s*", "", text)  # xgrammar's time and source location
            raise GrammarError(f"{kind} cannot be used: {text}") from None

    def _get_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar
                from transformers import PreTrainedTokenizerFast

                tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(self.model_dir) / "tokenizer.json"))
                info = xgrammar.TokenizerInfo.from_huggingface(
                    tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                self._compiler = xgrammar.GrammarCompiler(info)
                vocab = info.decoded_vocab  # each token's bytes
                self._whitespace_ids = frozenset(i for i, b in enumerate(vocab) if b and not b.strip(b" \t\r\n"))
                logger.info("structured output ready (xgrammar, vocabulary %d)", self.vocab_size)
            return self._compiler
