"""One rule for `n`: the client's count of request ids and the frontend's agree on every value."""

import pytest

from zserve.client.request_body import num_copies
from zserve.common.choices import bad_n_error, num_choices
from zserve.common.request_limits import LIMITS

VALID = [1, 2, LIMITS.max_copies]
INVALID = [0, -1, LIMITS.max_copies + 1, True, False, 2.0, "2", None, [2]]


@pytest.mark.parametrize("n", VALID)
def test_a_valid_n_is_its_own_count_everywhere(n):
    assert num_choices({"n": n}) == n
    assert num_copies({"n": n}) == n


def test_no_n_is_one_choice():
    assert num_choices({"prompt": "hi"}) == 1
    assert num_copies({}) == 1


@pytest.mark.parametrize("n", INVALID)
def test_an_invalid_n_is_refused_and_takes_one_id(n):
    assert num_choices({"n": n}) is None
    assert num_copies({"n": n}) == 1  # the frontend's error comes on req_id alone
    assert f"[1, {LIMITS.max_copies}]" in bad_n_error({"n": n})
