import math

import pytest

from zserve.common.sampling_params import SamplingParams


def test_defaults_are_greedy_and_round_trip():
    p = SamplingParams.from_dict({})
    assert p.temperature == 0.0 and p.top_k == 0 and p.top_p == 1.0 and p.min_p == 0.0
    q = SamplingParams(max_tokens=5, temperature=0.5, stop=("a", "b"), stop_token_ids=(7,), seed=3)
    assert SamplingParams.from_dict(q.to_dict()) == q


def test_single_stop_string_and_int_temperature_are_accepted():
    p = SamplingParams.from_dict({"stop": "###", "temperature": 1})
    assert p.stop == ("###",) and p.temperature == 1.0 and isinstance(p.temperature, float)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"min_p": 1.0}, "min_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": -5}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"frobnicate": 1}, "unknown sampling field"),
    ],
)
def test_bad_values_raise_a_message_naming_the_field(fields, needle):
    with pytest.raises(ValueError, match=needle):
        SamplingParams.from_dict(fields)


def test_non_mapping_is_refused():
    with pytest.raises(ValueError, match="mapping"):
        SamplingParams.from_dict([1, 2])
