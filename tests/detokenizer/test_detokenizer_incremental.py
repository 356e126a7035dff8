"""IncrementalDetokenizer: streamed text equals a full decode, never splits a character, never
goes back, and decodes a bounded window per step."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testing.tokenizer_fixtures import build_byte_level_bpe, build_metaspace_bpe, demo_tokenizer_dir
from zserve.detokenizer_proc.incremental_detokenizer import MAX_HELD_TOKENS, IncrementalDetokenizer
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

MULTIBYTE_TEXTS = (
    "Hello, world! 你好，世界！",
    "café crème brûlée naïve Zürich",
    "Emoji: 🙂🚀 👍🏽 👩‍💻 🇫🇷 ❤️",
    "한국어 문장 and Ελληνικά and Русский",
    "  leading spaces and\ttabs\nnewlines  ",
    "日本語のテキストです。東京🗼",
)


@pytest.fixture(scope="module", params=["byte_level", "metaspace", "smollm2"])
def tokenizer(request, tmp_path_factory) -> TextTokenizer:
    if request.param == "smollm2":
        if demo_tokenizer_dir() is None:
            pytest.skip("demo model (SmolLM2-135M-Instruct) not present")
        return TextTokenizer.from_model_dir(demo_tokenizer_dir())
    build = build_byte_level_bpe if request.param == "byte_level" else build_metaspace_bpe
    return TextTokenizer.from_model_dir(build(tmp_path_factory.mktemp(request.param)))


def stream(tok: TextTokenizer, ids: list[int], chunk_sizes: list[int] | None = None, **kw) -> list[str]:
    """Feed ids in chunks (one token at a time by default); return every returned piece, finish included."""
    detok = IncrementalDetokenizer(tok, **kw)
    pieces, i, sizes = [], 0, iter(chunk_sizes or [])
    while i < len(ids):
        n = max(1, next(sizes, 1))
        pieces.append(detok.add_tokens(ids[i : i + n]))
        i += n
    pieces.append(detok.flush())
    return pieces


def assert_stream_ok(tok: TextTokenizer, ids: list[int], pieces: list[str], skip: bool = True) -> None:
    expected = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(pieces) == expected
    # Never half a character: a streamed piece ends in U+FFFD only where the full text has one.
    emitted = ""
    for piece in pieces:
        emitted += piece
        assert expected.startswith(emitted)
        if piece.endswith("\ufffd"):
            assert expected[len(emitted) - 1] == "\ufffd"


@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
def test_stream_of_real_text_matches_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = stream(tokenizer, ids)
    assert_stream_ok(tokenizer, ids, pieces)
    assert "\ufffd" not in "".join(pieces)


def test_character_split_across_tokens_is_held_until_complete(tokenizer):
    ids = tokenizer.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1, "fixture should spell this emoji with several byte tokens"
    word_ids = tokenizer.encode(" ok", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add_tokens([t]) for t in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1)
    if tokenizer.invalid_byte_token_id is None:  # byte-level: the character is out once complete
        assert pieces[-1] == "🙂"
    else:  # byte fallback: a run of byte tokens is final only once a non-byte token follows
        assert pieces[-1] == ""
    pieces.append(detok.add_tokens(word_ids))
    assert "".join(pieces) == tokenizer.decode(ids + word_ids, skip_special_tokens=True)
    assert "".join(pieces).startswith("🙂")
    assert detok.flush() == ""


def test_special_tokens_skipped_by_default_and_kept_on_request(tokenizer):
    eos = tokenizer.eos_token_ids[0]
    ids = tokenizer.encode("hi there", add_special_tokens=False) + [eos]
    assert "".join(stream(tokenizer, ids)) == "hi there"
    kept = "".join(stream(tokenizer, ids, skip_special_tokens=False))
    assert kept == tokenizer.decode(ids) and kept.endswith(tokenizer.special_tokens["eos_token"])


def test_special_token_between_words_keeps_the_space(tokenizer):
    # A window must not start at a skipped special token: the decoder would strip " world".
    bos = tokenizer.bos_token_id
    ids = tokenizer.encode("Hello", add_special_tokens=False) + [bos]
    ids += tokenizer.encode(" world", add_special_tokens=False)[-1:]
    assert_stream_ok(tokenizer, ids, stream(tokenizer, ids))


def test_window_stays_short_on_long_output(tokenizer):
    """Each step decodes a bounded window, not the whole output (no O(n^2))."""
    ids = tokenizer.encode(" ".join(MULTIBYTE_TEXTS) * 20, add_special_tokens=False)
    decoded_lens: list[int] = []

    class Counting:
        invalid_byte_token_id = tokenizer.invalid_byte_token_id

        def decode(self, token_ids, skip_special_tokens=False):
            decoded_lens.append(len(token_ids))
            return tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    detok = IncrementalDetokenizer(Counting())
    text = "".join(detok.add_tokens([t]) for t in ids) + detok.flush()
    assert text == tokenizer.decode(ids, skip_special_tokens=True)
    assert len(ids) > 1000
    # prefix + held tokens + the probe; byte-fallback text (Hangul here) holds whole byte runs
    assert max(decoded_lens) <= 2 * MAX_HELD_TOKENS + 1
    if tokenizer.invalid_byte_token_id is None:
        assert max(decoded_lens) <= 16


def test_garbage_bytes_bounded_work(tokenizer):
    """A degenerate model repeating a lone lead byte holds back at most MAX_HELD_TOKENS tokens."""
    lead = next(t for t in tokenizer.encode("🙂", add_special_tokens=False) if tokenizer.decode([t]) == "\ufffd")
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add_tokens([lead]) for _ in range(5 * MAX_HELD_TOKENS)]
    assert any(pieces), "garbage must eventually stream"
    assert len(detok.token_ids) - detok._read_offset <= MAX_HELD_TOKENS
    text = "".join(pieces) + detok.flush()
    assert set(text) == {"\ufffd"}


def test_tokens_after_finish_by_chunks(tokenizer):
    ids = tokenizer.encode(MULTIBYTE_TEXTS[2], add_special_tokens=False)
    assert_stream_ok(tokenizer, ids, stream(tokenizer, ids, chunk_sizes=[3, 1, 5, 2, 7, 1, 1, 4]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_token_sequence_streams_to_its_full_decode(tokenizer, data):
    """Random ids (byte tokens, special tokens, pieces of multi-byte characters included),
    fed in random chunks: the stream concatenates to decode(all_ids)."""
    vocab = tokenizer.vocab_size
    multibyte_ids = sorted({i for t in MULTIBYTE_TEXTS for i in tokenizer.encode(t, add_special_tokens=False)})
    token = st.one_of(st.integers(0, vocab - 1), st.sampled_from(multibyte_ids))
    ids = data.draw(st.lists(token, max_size=40), label="ids")
    chunks = data.draw(st.lists(st.integers(1, 4), max_size=40), label="chunks")
    skip = data.draw(st.booleans(), label="skip_special_tokens")
    assert_stream_ok(tokenizer, ids, stream(tokenizer, ids, chunks, skip_special_tokens=skip), skip)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30))
def test_any_text_round_trips_through_the_stream(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert_stream_ok(tokenizer, ids, stream(tokenizer, ids))
