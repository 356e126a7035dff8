"""An id given again as soon as its request had its final update: a request ended by a stop string (the
detokenizer's abort, STOP) while a step holding it is with the worker still holds its pages and row until
that step is back; the new request with its id is taken at once, gets exactly its own tokens, and the
old one's late step neither feeds it nor frees anything of it (FakeModel, poisoned freed pages)."""

import pytest

from testing.fake_model import FakeModel
from testing.scheduler_harness import SchedulerHarness
from zserve.common.finish_reason import FinishReason
from zserve.common.sampling_params import SamplingParams

VOCAB = 64
REQ_ID = 9


def make(overlap: bool) -> SchedulerHarness:
    return SchedulerHarness(FakeModel(64, 4, VOCAB), context_len=128, eos_token_ids=[],
                            overlap_schedule="on" if overlap else "off")


@pytest.mark.parametrize("overlap", [False, True], ids=["one-step", "overlap"])
@pytest.mark.parametrize("num_rounds_before", [1, 3])
def test_an_id_stop_aborted_in_flight_is_taken_again_at_once(overlap, num_rounds_before):
    h = make(overlap)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    h.submit(REQ_ID, list(range(5, 14)), params)
    h.submit(REQ_ID + 1, list(range(30, 36)), params)  # a neighbour, running throughout
    for _ in range(num_rounds_before):
        h.step()
    refusals: list = []
    reused: list[bool] = []

    def stop_and_reuse() -> None:
        if reused:
            return
        assert h.scheduler.num_in_flight  # a step is with the worker: both requests decode in every step by now
        [final] = h.abort(REQ_ID, FinishReason.STOP)  # the stop string's abort
        assert final.finish_reason is FinishReason.STOP
        h.forget(REQ_ID)
        refusals.extend(h.submit(REQ_ID, list(range(20, 27)), params))  # its client gives the id again at once
        reused.append(True)

    while not reused:  # under overlap a step may wait for the one before instead of sending
        h.step(while_in_flight=stop_and_reuse)
    assert refusals == []
    h.run()
    assert len(h.outputs[REQ_ID]) == 40 and h.final[REQ_ID].finish_reason is FinishReason.LENGTH
    h.assert_drained()
    stats = h.scheduler.stats()
    assert (stats.num_submitted, stats.num_refused, stats.num_finished) == (3, 0, 3), stats
