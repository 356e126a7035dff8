"""SGLang's output options, per request: `no_stop_trim` keeps the stop string that ended the text (and a
special stop token such as EOS), `skip_special_tokens: false` shows special tokens, except the special
stop token that ended the request (SGLang trims it unless no_stop_trim)."""

from __future__ import annotations

import numpy as np
import pytest

from testing.outbox import Outbox
from testing.tokenizer_fixtures import build_byte_level_bpe
from zserve.common.finish_reason import FinishReason
from zserve.common.messages import DetokRegister, ReqOutput, TokenOut
from zserve.detokenizer_proc.detokenizer_process import DetokenizerLoop
from zserve.detokenizer_proc.stop_matcher import StopMatcher
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

TEXT = "The cat sat on the mat. The dog ran far away."
EOS = "<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    return TextTokenizer.from_model_dir(build_byte_level_bpe(tmp_path_factory.mktemp("bpe")))


def run(tokenizer, ids: list[int], finish: FinishReason | None = None, **register) -> tuple[str, FinishReason | None]:
    """The text the frontend gets for `ids` sent one token per step (the last with `finish`)."""
    to_frontend = Outbox()
    loop = DetokenizerLoop(tokenizer, inbox=None, to_frontend=to_frontend)
    loop.register(DetokRegister(req_id=1, num_prompt_tokens=2, **{"stop": [], **register}))
    for k, token_id in enumerate(ids):
        last = k == len(ids) - 1
        loop.on_tokens(TokenOut(req_id=1, token_ids=np.array([token_id], np.int32), finish_reason=finish if last else None))
        if 1 not in loop.states:
            break
    outs = [m for m in to_frontend.sent if isinstance(m, ReqOutput)]
    return "".join(o.text for o in outs), outs[-1].finish_reason


@pytest.mark.parametrize("keep", [False, True])
def test_stop_matcher_ends_before_or_after_the_stop_string(keep):
    matcher = StopMatcher(["dog", "far"], keep_stop=keep)
    out = matcher.push("The do") + matcher.push("g ran far")
    assert out == ("The dog" if keep else "The ") and matcher.matched == "dog"
    assert matcher.push("more") == "" and matcher.flush() == ""


@pytest.mark.parametrize("no_stop_trim", [False, True])
def test_no_stop_trim_keeps_the_stop_string_and_nothing_after_it(tokenizer, no_stop_trim):
    ids = tokenizer.encode(TEXT)
    text, finish = run(tokenizer, ids, stop=["dog"], no_stop_trim=no_stop_trim)
    end = TEXT.index("dog") + (len("dog") if no_stop_trim else 0)
    assert (text, finish) == (TEXT[:end], FinishReason.STOP)


def test_special_tokens_are_shown_only_when_not_skipped(tokenizer):
    ids = tokenizer.encode("Hi " + EOS + " there", add_special_tokens=False)
    assert EOS in tokenizer.decode(ids) and EOS not in tokenizer.decode(ids, skip_special_tokens=True)
    assert run(tokenizer, ids, FinishReason.LENGTH)[0] == tokenizer.decode(ids, skip_special_tokens=True)
    assert run(tokenizer, ids, FinishReason.LENGTH, skip_special_tokens=False)[0] == "Hi " + EOS + " there"


@pytest.mark.parametrize(("skip", "no_stop_trim", "expected"), [
    (True, False, "Hi there"), (True, True, "Hi there"),  # skipped either way: EOS is special
    (False, False, "Hi there"),  # shown specials, but not the EOS that ended the text (SGLang trims it)
    (False, True, "Hi there" + EOS),
])
def test_the_eos_that_ends_a_request_shows_only_with_no_stop_trim(tokenizer, skip, no_stop_trim, expected):
    ids = tokenizer.encode("Hi there", add_special_tokens=False) + tokenizer.encode(EOS, add_special_tokens=False)
    text, finish = run(tokenizer, ids, FinishReason.STOP, skip_special_tokens=skip, no_stop_trim=no_stop_trim)
    assert (text, finish) == (expected, FinishReason.STOP)


def test_a_visible_stop_token_id_stays_in_the_text(tokenizer):
    """stop_token_ids naming an ordinary token: its text stays (vLLM's rule), whatever the options."""
    ids = tokenizer.encode("Hi there.", add_special_tokens=False)
    assert run(tokenizer, ids, FinishReason.STOP, skip_special_tokens=False)[0] == "Hi there."
