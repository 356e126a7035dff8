"""Constrained (structured-output) requests in the scheduler core, with a FakeGrammarSource: a
request waits in the queue until its grammar is built, is sampled under its mask, ends with its
error when the grammar fails to build, and its grammar goes with it however it ends."""

from testing.fake_grammar import FakeGrammar, FakeGrammarSource
from testing.fake_model import FakeModel
from testing.scheduler_harness import SchedulerHarness
from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.constrained_reqs import GRAMMAR_OFF

VOCAB = 64
EOS = 1
DIGITS = frozenset(range(40, 44))


def make(grammars: dict[str, FakeGrammar], num_pages=64, page_size=4, context_len=128, **knobs) -> SchedulerHarness:
    source = FakeGrammarSource(grammars, stop_ids=frozenset({EOS}), vocab_size=VOCAB)
    return SchedulerHarness(
        FakeModel(num_pages, page_size, VOCAB), context_len=context_len, eos_token_ids=[EOS], grammar_source=source, **knobs,
    )


def test_a_constrained_request_waits_for_its_grammar_while_others_run():
    h = make({"digits": FakeGrammar(DIGITS, num_tokens=3, build_polls=3)})
    h.submit(1, [5, 6, 7], SamplingParams(regex="digits", max_tokens=20))
    h.submit(2, [8, 9, 10], SamplingParams(max_tokens=6, ignore_eos=True))
    assert h.scheduler.stats().num_waiting == 2
    for _ in range(3):  # three polls say "not built": request 1 is not admitted
        h.step()
        assert 1 not in h.first and h.batches[-1].grammar is None and h.scheduler.stats().num_waiting == 1
    h.step()  # the fourth poll finds it built: admitted at once, next to the running request 2
    assert 1 in h.first and h.batches[-1].grammar is not None
    h.run()
    h.assert_drained()
    assert h.final[1].finish_reason is FinishReason.STOP and len(h.outputs[2]) == 6
    assert h.grammar_source.released == [1]


def test_only_allowed_tokens_are_sampled_then_the_grammar_ends_the_text():
    h = make({"digits": FakeGrammar(DIGITS, num_tokens=4)})
    prompt = [3, 4, 5, 6, 7]
    h.submit(1, prompt, SamplingParams(regex="digits", max_tokens=30))
    h.run()
    h.assert_drained()
    out = h.outputs[1]
    assert out[:4] and set(out[:4]) <= DIGITS and out[4:] == [EOS], out  # the harness also checked each is the masked pick
    assert h.final[1].finish_reason is FinishReason.STOP
    free = [FakeModel.next_token(prompt + out[:i], VOCAB) for i in range(4)]
    assert free != out[:4], "the fake model picks these anyway: the mask was not tested"
    masks = [b.grammar for b in h.batches]
    assert all(m is not None and m.rows.tolist() == [0] for m in masks)  # one row, every step


def test_a_grammar_that_fails_to_build_finishes_the_request_with_its_error():
    h = make({"bad": FakeGrammar(frozenset(), build_polls=1, error="regex cannot be used: unclosed group")})
    h.submit(1, [5, 6, 7], SamplingParams(regex="bad"))
    h.submit(2, [5, 6, 7], SamplingParams(max_tokens=2))
    h.run()
    h.assert_drained()
    final = h.final[1]
    assert (final.finish_reason, final.code, final.error) == (FinishReason.ERROR, ErrorCode.INVALID, "regex cannot be used: unclosed group")
    assert h.outputs[1] == [] and len(h.outputs[2]) == 2
    stats = h.scheduler.stats()
    assert stats.num_refused == 1 and stats.num_finished == 1
    assert h.grammar_source.released == [1]


def test_an_abort_while_waiting_for_the_grammar_releases_it():
    h = make({"slow": FakeGrammar(DIGITS, build_polls=1000)})
    h.submit(1, [5, 6, 7], SamplingParams(regex="slow"))
    assert h.step() is None and h.scheduler.has_work and h.scheduler.waits_for_grammars_only
    (final,) = h.abort(1)
    assert final.finish_reason is FinishReason.ABORT
    assert h.grammar_source.released == [1] and not h.scheduler.has_work
    h.assert_drained()


def test_abort_running_and_in_flight_release_the_grammar_once():
    h = make({"long": FakeGrammar(DIGITS, num_tokens=50)})
    for req_id in (1, 2):
        h.submit(req_id, [5, 6, req_id], SamplingParams(regex="long", max_tokens=40))
    h.step()
    h.step()
    h.abort(1)
    h.step(abort_in_flight=[2])
    assert sorted(h.grammar_source.released) == [1, 2]
    h.run()
    h.assert_drained()


def test_a_retracted_constrained_request_keeps_its_grammar_and_resumes_under_it():
    # 10 pages of 2 tokens; 8 digits and EOS after prompts of 3 and 4 tokens need 6 pages each:
    # both are admitted (the estimate reserves 5 each), and the newer is retracted mid-output
    h = make({"long": FakeGrammar(DIGITS, num_tokens=8)}, num_pages=10, page_size=2, context_len=64,
             kv_reservation="estimated", admission_policy="fifo")
    h.submit(1, [5, 6, 7], SamplingParams(regex="long", max_tokens=9))
    h.submit(2, [1, 2, 3, 4], SamplingParams(regex="long", max_tokens=9))
    h.run()
    h.assert_drained()
    assert h.scheduler.stats().num_retracted > 0
    for req_id in (1, 2):  # the harness checked each token is the masked pick after the output so far
        assert set(h.outputs[req_id][:8]) <= DIGITS and h.outputs[req_id][8:] == [EOS]
        assert h.final[req_id].finish_reason is FinishReason.STOP
    assert sorted(h.grammar_source.released) == [1, 2]


def test_n_constrained_copies_each_get_their_own_grammar():
    h = make({"digits": FakeGrammar(DIGITS, num_tokens=2)})
    h.submit(10, [5, 6, 7], SamplingParams(regex="digits", max_tokens=8, temperature=1.0, seed=3), num_copies=3)
    h.run()
    h.assert_drained()
    assert sorted(h.grammar_source.released) == [10, 11, 12]
    assert all(h.final[i].finish_reason is FinishReason.STOP for i in (10, 11, 12))


def test_without_a_grammar_source_a_constrained_request_is_refused():
    h = SchedulerHarness(FakeModel(16, 4, VOCAB), context_len=64, eos_token_ids=[EOS])
    (refusal,) = h.submit(1, [5, 6], SamplingParams(json_object=True))
    assert (refusal.finish_reason, refusal.code, refusal.error) == (FinishReason.ERROR, ErrorCode.INVALID, GRAMMAR_OFF)
    assert not h.scheduler.has_work
    h.assert_drained()
