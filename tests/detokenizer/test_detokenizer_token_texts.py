"""The detokenizer attaches token text, so that no client needs a tokenizer: each output token's
own text and each top logprob's with logprobs, the prompt's tokens' with prompt logprobs, and the
prompt's text (echo) in the first output when the request asked for it."""

from __future__ import annotations

import numpy as np
import pytest

from testing.outbox import Outbox
from testing.tokenizer_fixtures import build_byte_level_bpe
from zserve.common.finish_reason import FinishReason
from zserve.common.messages import FRONTEND_INBOX, DetokRegister, PromptLogprobs, ReqOutput, TokenOut
from zserve.detokenizer_proc.detokenizer_process import DetokenizerLoop
from zserve.detokenizer_proc.token_texts import TokenTexts
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    return TextTokenizer.from_model_dir(build_byte_level_bpe(tmp_path_factory.mktemp("bpe")))


def ids(*values: int) -> np.ndarray:
    return np.asarray(values, np.int32)


def loop_for(tokenizer: TextTokenizer) -> tuple[DetokenizerLoop, Outbox]:
    to_frontend = Outbox(FRONTEND_INBOX)
    return DetokenizerLoop(tokenizer, inbox=None, to_frontend=to_frontend), to_frontend


def test_logprob_outputs_carry_each_token_and_top_token_text(tokenizer):
    text_ids = tokenizer.encode("héllo wörld 🙂", add_special_tokens=False)
    loop, sent = loop_for(tokenizer)
    loop.register(DetokRegister(req_id=7, stop=[], num_prompt_tokens=3))
    for j, token_id in enumerate(text_ids):
        tops = [token_id, text_ids[0]]
        loop.on_tokens(TokenOut(
            req_id=7, token_ids=ids(token_id), logprobs=[-0.5], top_logprob_ids=tops, top_logprobs=[-0.5, -2.0],
            finish_reason=FinishReason.LENGTH if j == len(text_ids) - 1 else None,
        ))
    outs: list[ReqOutput] = sent.sent
    assert [t for o in outs for t in o.token_texts] == [tokenizer.decode([t]) for t in text_ids]
    assert any("\ufffd" in t for o in outs for t in o.token_texts)  # a piece of a character is its own text, not merged
    for out in outs:
        assert out.top_logprob_texts == [tokenizer.decode([t]) for t in out.top_logprob_ids]
        assert out.prompt_text is None  # not asked
    assert "".join(o.text for o in outs) == "héllo wörld 🙂"


def test_without_logprobs_no_text_is_attached(tokenizer):
    loop, sent = loop_for(tokenizer)
    loop.register(DetokRegister(req_id=1, stop=[], num_prompt_tokens=2))
    loop.on_tokens(TokenOut(req_id=1, token_ids=ids(*tokenizer.encode("hi", add_special_tokens=False)), finish_reason=FinishReason.STOP))
    [out] = sent.sent
    assert out.token_texts is None and out.top_logprob_texts is None and out.prompt_text is None and out.text == "hi"


def test_prompt_text_comes_once_and_prompt_logprobs_carry_texts(tokenizer):
    prompt_ids = tokenizer.encode("Zürich café", add_special_tokens=False)
    top_ids = [prompt_ids[0], prompt_ids[-1]] * (len(prompt_ids) - 1)  # K = 2
    prompt = PromptLogprobs(
        token_ids=ids(*prompt_ids), logprobs=np.zeros(len(prompt_ids) - 1, np.float32),
        top_ids=ids(*top_ids), top_logprobs=np.zeros(len(top_ids), np.float32),
    )
    loop, sent = loop_for(tokenizer)
    loop.register(DetokRegister(req_id=3, stop=[], num_prompt_tokens=len(prompt_ids), prompt_ids=ids(*prompt_ids)))
    a, b = tokenizer.encode(" ok", add_special_tokens=False)[:1] * 2
    loop.on_tokens(TokenOut(req_id=3, token_ids=ids(a), logprobs=[-1.0], prompt=prompt))
    loop.on_tokens(TokenOut(req_id=3, token_ids=ids(b), logprobs=[-1.0], finish_reason=FinishReason.LENGTH))
    first, last = sent.sent
    assert first.prompt_text == tokenizer.decode(prompt_ids) == "Zürich café"
    assert last.prompt_text is None
    assert first.prompt.token_texts == [tokenizer.decode([t]) for t in prompt_ids]
    assert first.prompt.top_texts == [tokenizer.decode([t]) for t in top_ids]
    assert not loop.states  # state dropped at the end


def test_token_texts_decode_each_id_once(tokenizer):
    calls = []

    class CountingDecoder:
        invalid_byte_token_id = None

        def decode(self, token_ids, skip_special_tokens=False):
            calls.append(list(token_ids))
            return tokenizer.decode(token_ids, skip_special_tokens)

    texts = TokenTexts(CountingDecoder())
    some = tokenizer.encode("the the the cat", add_special_tokens=False)
    assert texts.texts(some) == texts.texts(some) == [tokenizer.decode([t]) for t in some]
    assert len(calls) == len(set(some))
