"""Stop strings: never streamed in part, cut exactly before, held-back text flushed at the end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testing.tokenizer_fixtures import build_byte_level_bpe, build_metaspace_bpe
from zserve.detokenizer_proc.incremental_detokenizer import IncrementalDetokenizer
from zserve.detokenizer_proc.stop_matcher import StopMatcher
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer


def push_all(matcher: StopMatcher, pieces: list[str]) -> list[str]:
    return [matcher.push(p) for p in pieces]


def test_stop_string_spanning_several_pushes_is_cut_before():
    m = StopMatcher(["</end>"])
    out = push_all(m, ["Hello </", "en", "d> ignored"])
    assert out == ["Hello ", "", ""]
    assert m.matched == "</end>"
    assert m.push("more") == "" and m.flush() == ""


def test_stop_string_in_one_push():
    m = StopMatcher(["STOP"])
    assert m.push("abcSTOPdef") == "abc"
    assert m.matched == "STOP"


def test_hold_back_that_turns_out_not_to_be_a_stop_string():
    m = StopMatcher(["abc"])
    assert m.push("xxab") == "xx"
    assert m.held_text == "ab"
    assert m.push("d") == "abd"
    assert m.matched is None
    assert m.push("a") == ""
    assert m.flush() == "a"  # end of request: held text is emitted


def test_overlapping_stop_strings_first_to_complete_wins():
    m = StopMatcher(["abcd", "bc"])
    assert push_all(m, ["a", "b", "c", "d"]) == ["", "", "a", ""]
    assert m.matched == "bc"


def test_stop_string_that_is_a_prefix_of_another():
    m = StopMatcher(["ab", "abc"])
    assert m.push("xab") == "x"
    assert m.matched == "ab"
    m = StopMatcher(["abc", "ab"])
    assert m.push("xabc") == "x"  # both start at 1; "ab" completes first either way


def test_same_end_earliest_start_wins():
    m = StopMatcher(["c", "abc"])
    assert m.push("xabc") == "x"
    assert m.matched == "abc"


def test_repeated_prefix_characters():
    m = StopMatcher(["aab"])
    assert push_all(m, ["a", "a", "a", "b"]) == ["", "", "a", ""]
    assert m.matched == "aab"


def test_multibyte_stop_strings():
    m = StopMatcher(["世界", "🙂"])
    assert push_all(m, ["你好", "世", "界!"]) == ["你好", "", ""]
    assert m.matched == "世界"


def test_bad_stop_lists_rejected():
    for bad in ("abc", [""], [1]):
        with pytest.raises(ValueError):
            StopMatcher(bad)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc世🙂", max_size=30),
    stop=st.lists(st.text(alphabet="abc世🙂", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 30), max_size=8),
)
def test_streamed_output_is_the_text_cut_at_the_first_completed_stop(text, stop, cuts):
    pieces = [text[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(text)], strict=True)]
    m = StopMatcher(stop)
    emitted = ""
    for piece in pieces:
        emitted += m.push(piece)
        assert not any(s in emitted for s in stop), "a stop string was streamed"
    emitted += m.flush()
    # Reference: scan character by character; stop at the first position where a stop string ends.
    ends = [(text.find(s) + len(s), text.find(s)) for s in stop if s in text]
    expected = text[: min(ends)[1]] if ends else text
    assert emitted == expected
    assert (m.matched is not None) == bool(ends)


@pytest.fixture(scope="module", params=["byte_level", "metaspace"])
def tokenizer(request, tmp_path_factory) -> TextTokenizer:
    build = build_byte_level_bpe if request.param == "byte_level" else build_metaspace_bpe
    return TextTokenizer.from_model_dir(build(tmp_path_factory.mktemp(request.param)))


def detokenize(tok: TextTokenizer, text: str, stop: list[str]) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(tok, stop=stop)
    return [detok.add_tokens([t]) for t in tok.encode(text, add_special_tokens=False)], detok


def test_detokenizer_stop_spanning_tokens(tokenizer):
    pieces, detok = detokenize(tokenizer, "The answer is 42. Next question", ["Next question"])
    assert detok.stopped and detok.stop_matched == "Next question"
    assert "".join(pieces) == "The answer is 42. "
    assert detok.flush() == "" and detok.add_tokens([5, 6]) == ""


def test_detokenizer_stop_inside_multibyte_sequence(tokenizer):
    # "界" is spelled by byte tokens (metaspace) or shares tokens with its neighbours (byte-level):
    # the matcher only ever sees whole characters, and cuts before it.
    pieces, detok = detokenize(tokenizer, "你好世界🙂 and more", ["界", "🙂"])
    assert detok.stop_matched == "界"
    assert "".join(pieces) == "你好世"
    pieces, detok = detokenize(tokenizer, "Emoji 🙂 here", ["🙂"])
    assert "".join(pieces) == "Emoji " and detok.stopped


def test_detokenizer_held_back_text_flushed_at_end(tokenizer):
    text = "Hello wor"
    pieces, detok = detokenize(tokenizer, text, ["world"])
    assert not detok.stopped
    assert "".join(pieces) + detok.flush() == tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))
    assert not "".join(pieces).endswith("wor")  # "wor" may still become "world": held until the end
