"""A grammar that starts after a marker (SamplingParams.grammar_after: a reasoning model's
`</think>`), in the scheduler core with a FakeGrammarSource: the thinking is sampled free (no mask,
no accept), the tokens after the marker under the grammar, which then ends the text; a retraction
before or after the marker resumes on the same side of it.

The fake model is deterministic, so the marker is taken from the request's own free output: two
tokens of it (a marker split over several tokens), which the constrained run then writes too."""

import pytest

from testing.fake_grammar import FakeGrammar, FakeGrammarSource
from testing.fake_model import FakeModel
from testing.scheduler_harness import SchedulerHarness
from zserve.common.finish_reason import FinishReason
from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.constrained_reqs import MAX_LEAD_WHITESPACE_TOKENS

VOCAB = 64
EOS = 1
DIGITS = frozenset(range(40, 44))
PROMPT = [3, 4, 5, 6, 7]


def make(num_tokens: int = 4, whitespace: frozenset[int] = frozenset(), **knobs) -> SchedulerHarness:
    source = FakeGrammarSource({"digits": FakeGrammar(DIGITS, num_tokens=num_tokens)}, frozenset({EOS}), VOCAB,
                               whitespace=whitespace)
    knobs = {"num_pages": 64, "page_size": 4, "context_len": 128, **knobs}
    model = FakeModel(knobs.pop("num_pages"), knobs.pop("page_size"), VOCAB)
    return SchedulerHarness(model, eos_token_ids=[EOS], grammar_source=source, **knobs)


def free_output(prompt: list[int], num_tokens: int) -> list[int]:
    output: list[int] = []
    for _ in range(num_tokens):
        output.append(FakeModel.next_token(prompt + output, VOCAB))
    return output


def marker_ending_at(prompt: list[int], end: int) -> tuple[int, ...]:
    """Two tokens of the free output ending at `end`, which appear nowhere earlier in it."""
    free = free_output(prompt, end)
    marker = tuple(free[end - 2 : end])
    assert EOS not in free and all(tuple(free[i - 2 : i]) != marker for i in range(2, end)), free
    return marker


def test_the_thinking_is_free_and_the_grammar_constrains_what_follows_the_marker():
    h = make()
    marker = marker_ending_at(PROMPT, 5)
    h.submit(1, PROMPT, SamplingParams(regex="digits", grammar_after=marker, max_tokens=30))
    h.run()
    h.assert_drained()
    out = h.outputs[1]  # the harness checked each token: free up to the marker, the masked pick after it
    assert out[:5] == free_output(PROMPT, 5) and tuple(out[3:5]) == marker
    assert set(out[5:9]) <= DIGITS and out[9:] == [EOS], out
    assert h.final[1].finish_reason is FinishReason.STOP
    assert free_output(PROMPT, 9)[5:9] != out[5:9], "the fake model picks these anyway: the mask was not tested"
    masked = [b.grammar is not None for b in h.batches]
    assert masked == [False] * 5 + [True] * 5, masked  # the prefill's token and four more are free
    assert h.grammar_source.released == [1]


def test_without_the_marker_the_output_stays_free_and_the_grammar_is_released():
    h = make()
    h.submit(1, PROMPT, SamplingParams(regex="digits", grammar_after=(EOS + 1, EOS + 1, EOS + 1), max_tokens=12))
    h.run()
    h.assert_drained()
    assert h.outputs[1] == free_output(PROMPT, 12) and h.final[1].finish_reason is FinishReason.LENGTH
    assert all(b.grammar is None for b in h.batches) and h.grammar_source.released == [1]


def test_a_free_request_and_a_thinking_one_leave_the_mask_to_the_one_past_its_marker():
    h = make(num_tokens=20)
    marker = marker_ending_at(PROMPT, 2)
    h.submit(1, PROMPT, SamplingParams(regex="digits", grammar_after=marker, max_tokens=8))
    h.submit(2, [9, 8, 7], SamplingParams(regex="digits", grammar_after=(63, 63, 63), max_tokens=8))
    h.submit(3, [9, 9, 9], SamplingParams(max_tokens=8))
    h.run()
    h.assert_drained()
    rows = {tuple(b.grammar.rows.tolist()) for b in h.batches if b.grammar is not None}
    assert len(rows) == 1 and len(next(iter(rows))) == 1, rows  # one row: request 1's, once past its marker


@pytest.mark.parametrize("marker_end", [2, 7, 8])
def test_a_retraction_before_or_after_the_marker_resumes_on_the_same_side_of_it(marker_end):
    # as tests/scheduler/test_scheduler_grammar.py's retraction: 10 pages of 2 tokens, two requests of
    # 9 output tokens that need 6 and 7; the newer is retracted after its 7th output token: inside its
    # answer (marker_end 2), just as the marker has ended it (7), or between the marker's two tokens (8)
    h = make(num_tokens=8 - marker_end, num_pages=10, page_size=2, context_len=64, kv_reservation="estimated",
             admission_policy="fifo")
    prompts = {1: [5, 6, 7], 2: [11, 12, 13, 14]}
    for req_id, prompt in prompts.items():
        marker = marker_ending_at(prompt, marker_end)
        h.submit(req_id, prompt, SamplingParams(regex="digits", grammar_after=marker, max_tokens=9))
    retracted_at = []  # the newer request's output length when it was retracted
    while h.scheduler.has_work:
        num_retracted = h.scheduler.stats().num_retracted
        h.step()
        if h.scheduler.stats().num_retracted > num_retracted:
            retracted_at.append(len(h.outputs[2]))
    h.assert_drained()
    assert retracted_at == [7]
    for req_id, prompt in prompts.items():  # the harness checked each token after the output so far
        out = h.outputs[req_id]
        assert out[:marker_end] == free_output(prompt, marker_end)
        assert set(out[marker_end:8]) <= DIGITS and out[8:] == [EOS], out
    assert sorted(h.grammar_source.released) == [1, 2]


@pytest.mark.parametrize("num_model_whitespace", [1, 3])
def test_whitespace_right_after_the_marker_is_a_lead_the_grammar_does_not_see(num_model_whitespace):
    # the model's own next tokens after the marker are declared whitespace: it writes them (the mask
    # allows whitespace there), the grammar is not given them (the fake grammar would refuse them),
    # and past MAX_LEAD_WHITESPACE_TOKENS (2) the grammar alone decides
    free = free_output(PROMPT, 5 + num_model_whitespace)
    lead = free[5:]
    assert not set(lead) & (DIGITS | {EOS}), lead
    whitespace = frozenset(lead) | {62}
    h = make(whitespace=whitespace)
    h.submit(1, PROMPT, SamplingParams(regex="digits", grammar_after=marker_ending_at(PROMPT, 5), max_tokens=30))
    h.run()
    h.assert_drained()
    out = h.outputs[1]
    num_lead = min(num_model_whitespace, MAX_LEAD_WHITESPACE_TOKENS)
    assert out[5 : 5 + num_lead] == lead[:num_lead]  # the model's own whitespace, up to the bound
    answer = out[5 + num_lead :]
    num_more = len(answer) - 5  # whitespace the mask picked in the open lead (the fake sampler's choice)
    assert 0 <= num_more <= MAX_LEAD_WHITESPACE_TOKENS - num_lead and set(answer[:num_more]) <= whitespace
    assert set(answer[num_more:-1]) <= DIGITS and len(answer[num_more:-1]) == 4 and answer[-1] == EOS, out
    masks = [b.grammar for b in h.batches if b.grammar is not None]  # mask i picks out[5 + i]
    for i, mask in enumerate(masks):  # whitespace is allowed while the lead is open, then the grammar alone
        is_open = i < MAX_LEAD_WHITESPACE_TOKENS and set(out[5 : 5 + i]) <= whitespace
        assert (62 in allowed_ids(mask)) == is_open, (i, out)


def allowed_ids(masks) -> set[int]:
    import numpy as np

    words = masks.bitmask.reshape(-1, masks.words_per_row)[0].view(np.uint32)
    return set(np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")).tolist())


def test_grammar_after_needs_a_grammar():
    with pytest.raises(ValueError, match="grammar_after needs structured output"):
        SamplingParams.from_dict({"grammar_after": [5]})
    with pytest.raises(ValueError, match="grammar_after must be at most 16 token ids"):
        SamplingParams.from_dict({"regex": "a", "grammar_after": [-1]})
