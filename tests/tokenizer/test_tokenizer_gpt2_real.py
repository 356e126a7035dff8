"""A real tokenizer: GPT-2's BPE (from openai-whisper's sdist on PyPI, cached), converted to a
tokenizers BPE. Checked against known GPT-2 ids and a plain-Python tiktoken-style BPE; the
detokenizer property runs over its 50257 tokens. Skipped when the ranks cannot be fetched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testing.tokenizer_fixtures import build_gpt2_bpe, fetch_gpt2_ranks, load_tiktoken_ranks
from zserve.detokenizer_proc.incremental_detokenizer import IncrementalDetokenizer
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
KNOWN_IDS = {
    "Hello world": [15496, 995],
    "Hello, world!": [15496, 11, 995, 0],
    "The quick brown fox jumps over the lazy dog.": [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13],
    "<|endoftext|>": [50256],
}


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> tuple[TextTokenizer, dict[bytes, int]]:
    cache = Path(os.environ.get("ZSERVE_CACHE_DIR") or Path.home() / ".cache" / "zserve") / "gpt2-tiktoken"
    ranks_path = fetch_gpt2_ranks(cache)
    if ranks_path is None:
        pytest.skip("gpt2.tiktoken unavailable (openai-whisper sdist could not be downloaded)")
    model_dir = build_gpt2_bpe(tmp_path_factory.mktemp("gpt2"), ranks_path)
    return TextTokenizer.from_model_dir(model_dir), load_tiktoken_ranks(ranks_path)


def reference_encode(text: str, ranks: dict[bytes, int]) -> list[int]:
    """tiktoken's algorithm: per regex piece, merge the adjacent pair whose concatenation has the lowest rank."""
    regex = pytest.importorskip("regex")
    ids: list[int] = []
    for piece in regex.findall(GPT2_PATTERN, text):
        parts = [bytes([b]) for b in piece.encode("utf-8")]
        while len(parts) > 1:
            candidates = [(ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
            candidates = [c for c in candidates if c[0] is not None]
            if not candidates:
                break
            _, i = min(candidates)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        ids += [ranks[p] for p in parts]
    return ids


def test_known_gpt2_ids(gpt2):
    tok, _ = gpt2
    assert (tok.vocab_size, tok.eos_token_ids, tok.adds_bos) == (50257, (50256,), False)
    for text, ids in KNOWN_IDS.items():
        assert tok.encode(text) == ids
        assert tok.decode(ids) == text


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40))
def test_encode_matches_tiktoken_algorithm(gpt2, text):
    tok, ranks = gpt2
    assert tok.encode(text) == reference_encode(text, ranks)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_detokenizer_streams_full_decode(gpt2, data):
    tok, _ = gpt2
    pieces = tok.encode("naïve 你好 🙂👍🏽 Ελληνικά", add_special_tokens=False)
    ids = data.draw(st.lists(st.one_of(st.integers(0, tok.vocab_size - 1), st.sampled_from(pieces)), max_size=30))
    detok = IncrementalDetokenizer(tok)
    text = "".join(detok.add_tokens([t]) for t in ids) + detok.flush()
    assert text == tok.decode(ids, skip_special_tokens=True)
