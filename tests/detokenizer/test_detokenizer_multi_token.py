"""Several tokens in one TokenOut (speculative decoding: accepted drafts + the sampled token): the
text is the same as one token per step, and a stop string completed inside them ends the output at
the token that completes it, as one-token steps would (token ids and completion count included)."""

from __future__ import annotations

import numpy as np
import pytest

from testing.outbox import Outbox
from testing.tokenizer_fixtures import build_byte_level_bpe
from zserve.common.finish_reason import FinishReason
from zserve.common.messages import AbortReq, DetokRegister, ReqOutput, TokenOut
from zserve.detokenizer_proc.detokenizer_process import DetokenizerLoop
from zserve.detokenizer_proc.incremental_detokenizer import IncrementalDetokenizer
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

TEXT = "The cat sat on the mat. The dog ran far away. Then it rained."


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    return TextTokenizer.from_model_dir(build_byte_level_bpe(tmp_path_factory.mktemp("bpe")))


def one_by_one(tokenizer, ids, stop):
    detok = IncrementalDetokenizer(tokenizer, stop=stop)
    text = ""
    for k, t in enumerate(ids):
        text += detok.add_tokens([t])
        if detok.stopped:
            return text, k + 1
    return text + detok.flush(), len(ids)


@pytest.mark.parametrize("stop", [["dog ran"], ["mat. The"], ["rained"], ["never there"]])
@pytest.mark.parametrize("chunk", [2, 3, 5, 64])
def test_chunks_stop_where_single_tokens_stop(tokenizer, stop, chunk):
    ids = tokenizer.encode(TEXT)
    expected_text, expected_taken = one_by_one(tokenizer, ids, stop)
    detok = IncrementalDetokenizer(tokenizer, stop=stop)
    text, taken = "", 0
    for i in range(0, len(ids), chunk):
        piece, num = detok.add_tokens_until_stop(ids[i : i + chunk])
        text += piece
        taken += num
        if detok.stopped:
            break
    else:
        text += detok.flush()
    assert (text, taken) == (expected_text, expected_taken)
    assert detok.stopped == (stop != ["never there"])


def test_the_loop_drops_the_tokens_after_a_stop_string_inside_one_update(tokenizer):
    to_frontend = Outbox()
    loop = DetokenizerLoop(tokenizer, inbox=None, to_frontend=to_frontend)
    ids = tokenizer.encode(TEXT)
    _, expected_taken = one_by_one(tokenizer, ids, ["dog"])
    loop.register(DetokRegister(req_id=5, stop=["dog"], num_prompt_tokens=3))
    loop.on_tokens(TokenOut(req_id=5, token_ids=np.array(ids[:expected_taken + 3], np.int32)))
    abort, out = to_frontend.sent  # the scheduler's abort (through the frontend) first, then the final output
    assert abort == AbortReq(req_id=5, finish_reason=FinishReason.STOP)
    assert isinstance(out, ReqOutput) and out.finish_reason is FinishReason.STOP
    assert out.text == TEXT[: TEXT.index("dog")]
    assert out.token_ids.tolist() == ids[:expected_taken] and out.completion_tokens == expected_taken
