"""XGrammarSource, the server's GrammarSource, against the tiny model's real tokenizer: the
contract the core relies on (built in the background, a mask per row, accept, terminate, release;
a spec xgrammar refuses is INVALID with its reason)."""

import json
import time

import numpy as np
import pytest

from zserve.common.error_code import ErrorCode
from zserve.scheduler_proc.xgrammar_source import XGrammarSource

pytest.importorskip("xgrammar")


def wait_built(source: XGrammarSource, req_id: int) -> bool:
    deadline = time.monotonic() + 60
    while not source.is_ready(req_id) and source.failure(req_id) is None:
        assert time.monotonic() < deadline, "the grammar was never built"
        time.sleep(0.01)
    return source.is_ready(req_id)


def allowed_ids(bitmask: np.ndarray, row: int, vocab_size: int) -> list[int]:
    bits = np.unpackbits(bitmask[row].view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits).tolist()


@pytest.fixture
def source(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    source = XGrammarSource(str(model_dir), config["vocab_size"], [config["eos_token_id"]])
    yield source
    source.close()


def test_a_regex_masks_each_row_then_allows_only_the_stop_token(source, model_dir):
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
    eos = source.stop_token_ids[0]
    source.start(7, ("regex", "ab"))
    source.start(8, ("regex", "ab"))  # the same spec: compiled once, its own matcher
    assert wait_built(source, 7) and wait_built(source, 8)
    bitmask = np.zeros((2, -(-source.vocab_size // 32)), np.int32)
    source.fill_bitmask(8, bitmask, 1)
    allowed = allowed_ids(bitmask, 1, source.vocab_size)
    assert allowed and not bitmask[0].any()  # only row 1 written
    assert all("ab".startswith(tokenizer.decode([t])) for t in allowed), [tokenizer.decode([t]) for t in allowed]
    for token_id in tokenizer.encode("ab", add_special_tokens=False):
        source.accept(8, token_id)
    source.fill_bitmask(8, bitmask, 0)
    assert allowed_ids(bitmask, 0, source.vocab_size) == [eos]
    assert not source.is_terminated(8)
    source.accept(8, eos)
    assert source.is_terminated(8) and not source.is_terminated(7)
    assert source.held_req_ids() == {7, 8}
    source.release(7)
    source.release(8)
    source.release(8)  # unknown ids are ignored
    assert source.held_req_ids() == set()


def test_a_spec_xgrammar_refuses_fails_as_invalid_with_its_reason(source):
    source.start(3, ("regex", "[abc"))
    assert not wait_built(source, 3)
    code, error = source.failure(3)
    assert code is ErrorCode.INVALID and error.startswith("regex cannot be used:"), error
    source.release(3)
    assert source.held_req_ids() == set()


def test_whitespace_ids_are_the_tokens_that_decode_to_whitespace_only(source, model_dir):
    from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

    source.start(1, ("regex", "[0-9]+"))
    assert wait_built(source, 1)
    tokenizer = TextTokenizer.from_model_dir(model_dir)
    texts = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
    expected = {i for i, text in enumerate(texts) if text and not text.strip(" \t\r\n")}  # JSON's whitespace
    assert expected and source.whitespace_ids() == expected
    assert tokenizer.encode("\n", False)[0] in source.whitespace_ids()
    source.release(1)


def test_the_grammar_thread_imports_xgrammar_first_and_runs_below_the_process(model_dir, monkeypatch):
    import os
    import threading

    from zserve.scheduler_proc import xgrammar_source
    from zserve.scheduler_proc.xgrammar_source import GRAMMAR_THREAD_NICE, grammar_thread

    ran = []  # (what, thread name, its niceness) in the order the grammar thread ran them

    def on_this_thread(what: str) -> None:
        tid = threading.get_native_id()
        ran.append((what, threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, tid)))

    imports = xgrammar_source.import_grammar_modules
    monkeypatch.setattr(xgrammar_source, "import_grammar_modules", lambda: (on_this_thread("import"), imports()))
    executor = grammar_thread()
    try:
        executor.submit(on_this_thread, "probe").result(60)
        nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + GRAMMAR_THREAD_NICE)
        assert [what for what, _, _ in ran] == ["import", "probe"]  # the import was the thread's first work
        assert all(name.startswith("grammar") and thread_nice == nice for _, name, thread_nice in ran), ran
        config = json.loads((model_dir / "config.json").read_text())
        source = XGrammarSource(str(model_dir), config["vocab_size"], [config["eos_token_id"]], executor=executor)
        source.warm_up()  # the vocabulary indexed on the thread handed over
        assert executor.submit(lambda: source._compiler is not None).result(60)
    finally:
        executor.shutdown(wait=True)
