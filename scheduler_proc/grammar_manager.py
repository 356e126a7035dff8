"""GrammarManager: structured output's state in the scheduler process, with xgrammar.

    submit:  a request under a grammar (json_object, json_schema, regex, ebnf) is compiled in a
             background thread (compiled grammars cached by their spec), and queued only once it
             is ready; a spec xgrammar refuses fails the request (INVALID, naming its message)
    step:    for the sampled requests under a grammar, the bitmask of tokens allowed next
             (GrammarMasks in the ForwardBatch; the sampler gives the others -inf)
    result:  each new token is accepted by its request's matcher; a finished grammar allows only
             the stop tokens, so the request ends; the matcher goes with the request's end

The matcher lives here because the scheduler sees every request's tokens in order: a retracted
request keeps its matcher (its output is still its output), an aborted one drops it. xgrammar
(and transformers, for the tokenizer's vocabulary) are imported in the background thread,
which `warm_up` starts at startup; `--grammar-backend none` builds no GrammarManager at all.
"""

from __future__ import annotations

import logging
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zserve.common.forward_batch import GrammarMasks

logger = logging.getLogger("scheduler_proc")


class GrammarError(ValueError):
    """The grammar spec cannot be compiled (the message is xgrammar's, fit for the client)."""


@dataclass
class GrammarManager:
    model_dir: str
    vocab_size: int
    stop_token_ids: list[int]
    matchers: dict[int, Any] = field(default_factory=dict)  # req_id -> xgrammar.GrammarMatcher
    _executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="grammar"))
    _compiled: dict[tuple[str, str], Future] = field(default_factory=dict)
    _compiler: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def warm_up(self) -> None:
        """Import xgrammar and index the vocabulary in the background now, so the first
        constrained request does not wait for it (a failure is logged; requests then fail with it)."""
        self._executor.submit(self._get_compiler).add_done_callback(self._log_warm_up)

    @staticmethod
    def _log_warm_up(future: Future) -> None:
        if future.exception() is not None:
            logger.error("structured output unavailable: %s: %s", type(future.exception()).__name__, future.exception())

    def compile(self, key: tuple[str, str]) -> Future:
        """The compiled grammar of (kind, spec), in the background; cached by the spec."""
        future = self._compiled.get(key)
        if future is None:
            future = self._compiled[key] = self._executor.submit(self._compile, key)
        return future

    def start(self, req_id: int, compiled: Any) -> None:
        import xgrammar

        self.matchers[req_id] = xgrammar.GrammarMatcher(compiled)

    def masks(self, sampled_req_ids: list[int]) -> GrammarMasks | None:
        """The allowed-token bitmask of each sampled request under a grammar (rows index `sampled_req_ids`)."""
        rows = [i for i, req_id in enumerate(sampled_req_ids) if req_id in self.matchers]
        if not rows:
            return None
        import xgrammar

        bitmask = xgrammar.allocate_token_bitmask(len(rows), self.vocab_size)
        for j, i in enumerate(rows):
            self.matchers[sampled_req_ids[i]].fill_next_token_bitmask(bitmask, j)
        words = bitmask.numpy().astype(np.int32, copy=False)
        return GrammarMasks(rows=np.array(rows, np.int32), words_per_row=int(words.shape[1]), bitmask=words.reshape(-1))

    def accept(self, req_id: int, token_ids: list[int], finished: bool) -> None:
        matcher = self.matchers.get(req_id)
        if matcher is None:
            return
        for token_id in token_ids:
            if not matcher.is_terminated() and not matcher.accept_token(token_id):
                logger.warning("req %d: the grammar refused token %d it allowed", req_id, token_id)
        if finished:
            del self.matchers[req_id]

    def drop(self, req_id: int) -> None:
        self.matchers.pop(req_id, None)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

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
                info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids)
                self._compiler = xgrammar.GrammarCompiler(info)
                logger.info("structured output ready (xgrammar, vocabulary %d)", self.vocab_size)
            return self._compiler
