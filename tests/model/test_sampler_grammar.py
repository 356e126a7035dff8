"""The sampler's grammar mask: the packed bitmask the scheduler sends (xgrammar's layout) bans
exactly the tokens xgrammar's own apply_token_bitmask_inplace bans, on every row or some rows,
without touching the model's logits; a greedy pick is the best allowed token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zserve.common.forward_batch import GrammarMasks
from zserve.model_proc.logits_processors import apply_grammar

xgrammar = pytest.importorskip("xgrammar")


def random_masks(num_rows: int, vocab_size: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    bitmask = xgrammar.allocate_token_bitmask(num_rows, vocab_size)
    bitmask.copy_(torch.from_numpy(rng.integers(-(2**31), 2**31, size=bitmask.shape, dtype=np.int64).astype(np.int32)))
    bitmask[0, :] = 0
    bitmask[0, 1] = 1 << 5  # row 0 allows one token: 1 * 32 + 5
    return bitmask


@pytest.mark.parametrize("vocab_size", [100, 49152, 151_936])
def test_mask_matches_xgrammars_own_apply_on_every_row(vocab_size):
    logits = torch.randn(4, vocab_size)
    raw = logits.clone()
    bitmask = random_masks(4, vocab_size, seed=vocab_size)
    grammar = GrammarMasks(rows=np.arange(4, dtype=np.int32), words_per_row=bitmask.shape[1], bitmask=bitmask.numpy().reshape(-1))
    expected = logits.clone()
    xgrammar.apply_token_bitmask_inplace(expected, bitmask, backend="torch_native")
    out = apply_grammar(logits, grammar, logits)
    assert torch.equal(out, expected) and torch.equal(logits, raw)
    assert int(out[0].argmax()) == 1 * 32 + 5 and torch.isfinite(out[0]).sum() == 1


def test_mask_on_some_rows_leaves_the_others_and_writes_only_copies():
    vocab_size = 1000
    logits = torch.randn(5, vocab_size)
    raw = logits.clone()
    bitmask = random_masks(2, vocab_size, seed=1)
    grammar = GrammarMasks(rows=np.array([1, 4], np.int32), words_per_row=bitmask.shape[1], bitmask=bitmask.numpy().reshape(-1))
    out = apply_grammar(logits, grammar, logits)
    assert torch.equal(logits, raw)  # the model's logits (logprobs read them) untouched
    for row in (0, 2, 3):
        assert torch.equal(out[row], raw[row])
    for j, row in enumerate((1, 4)):
        expected = raw[row : row + 1].clone()
        xgrammar.apply_token_bitmask_inplace(expected, bitmask[j : j + 1], backend="torch_native")
        assert torch.equal(out[row], expected[0])
    penalized = raw.clone()  # an adjusted copy (penalties) is masked in place
    assert apply_grammar(penalized, grammar, logits) is penalized
    assert apply_grammar(logits, None, logits) is logits
