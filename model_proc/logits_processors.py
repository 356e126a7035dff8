"""Logits processors: what changes or reads a batch's logits beside the draw (model_proc/sampler.py).

    apply_penalties   repetition / frequency / presence penalties, logit bias, min_tokens bans
    apply_grammar     structured output: -inf for every token a row's grammar does not allow
    top_logprobs_of   the K most likely tokens per row and their logprobs (top_logprobs)

None writes into the model's raw logits: logprobs are always reported under the model's own
distribution. The logits have one row per request of the batch (float32[num_reqs, vocab]), and
the `rows` of `PenaltyArrays` and `GrammarMasks` are those batch rows (common/forward_batch.py).
"""

from __future__ import annotations

import numpy as np
import torch

from zserve.common.forward_batch import GrammarMasks, PenaltyArrays


def apply_penalties(logits: torch.Tensor, penalties: PenaltyArrays | None) -> torch.Tensor:
    """`logits` adjusted for the rows that asked (a new tensor; `logits` itself when nobody did):
    the repetition penalty over each row's prompt and output tokens (transformers' rule: a
    positive logit is divided by it, a negative one multiplied), then OpenAI's frequency and
    presence penalties over its output tokens, then the logit bias, then -inf for the stop tokens
    min_tokens still bans. Only the listed (row, token) entries are touched."""
    if penalties is None:
        return logits
    out = logits.clone()
    device = logits.device
    rows = penalties.rows.astype(np.int64)
    num_tokens = np.diff(penalties.token_offsets)
    if penalties.token_ids.size:
        row_of = torch.from_numpy(np.repeat(rows, num_tokens)).to(device)
        ids = torch.from_numpy(penalties.token_ids.astype(np.int64)).to(device)
        values = out[row_of, ids].float()
        repetition = torch.from_numpy(np.repeat(penalties.repetition, num_tokens)).to(device)
        values = torch.where(values > 0, values / repetition, values * repetition)
        counts = torch.from_numpy(penalties.output_counts.astype(np.float32)).to(device)
        frequency = torch.from_numpy(np.repeat(penalties.frequency, num_tokens)).to(device)
        presence = torch.from_numpy(np.repeat(penalties.presence, num_tokens)).to(device)
        values = values - counts * frequency - (counts > 0).float() * presence
        out[row_of, ids] = values.to(out.dtype)
    if penalties.bias_ids.size:
        row_of = torch.from_numpy(np.repeat(rows, np.diff(penalties.bias_offsets))).to(device)
        ids = torch.from_numpy(penalties.bias_ids.astype(np.int64)).to(device)
        out.index_put_((row_of, ids), torch.from_numpy(penalties.bias_values).to(device, out.dtype), accumulate=True)
    if penalties.banned_ids.size:
        row_of = torch.from_numpy(np.repeat(rows, np.diff(penalties.banned_offsets))).to(device)
        out[row_of, torch.from_numpy(penalties.banned_ids.astype(np.int64)).to(device)] = float("-inf")
    return out


def top_logprobs_of(logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(int32[n, k], float32[n, k]): each row's k most likely tokens and their logprobs under the
    model's own distribution (log_softmax of the raw logits, like the chosen token's), most likely first."""
    values, ids = torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1)
    return ids.to(torch.int32).cpu().numpy(), values.cpu().numpy()


def apply_grammar(logits: torch.Tensor, grammar: GrammarMasks | None, raw: torch.Tensor) -> torch.Tensor:
    """`logits` with -inf for every token a row's grammar does not allow next (structured
    output). Never writes into `raw` (the model's own logits, which logprobs read)."""
    if grammar is None or not grammar.rows.size:
        return logits
    vocab_size = logits.shape[1]
    words = grammar.bitmask.astype("<i4", copy=False).reshape(len(grammar.rows), grammar.words_per_row)
    # bit j of word w (little-endian) allows token 32 w + j: unpackbits in little bit order lays them out in token order
    allowed = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab_size].view(bool)
    allowed_t = torch.from_numpy(allowed).to(logits.device)
    if len(grammar.rows) == logits.shape[0] and (grammar.rows == np.arange(len(grammar.rows))).all():
        return torch.where(allowed_t, logits, float("-inf"))  # every row under a grammar: one pass, a new tensor
    out = logits.clone() if logits is raw else logits
    rows = torch.from_numpy(grammar.rows.astype(np.int64)).to(out.device)
    out[rows] = torch.where(allowed_t, out[rows], float("-inf"))
    return out
