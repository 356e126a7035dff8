"""Sampler: one next token per row of logits, each row with its own sampling parameters.

    greedy rows (temperature 0)  ->  argmax of the raw logits (so are rows with T < 1e-5)
    sampled rows                 ->  w = exp((logits - max) / T)        relative probabilities, max 1
                                     -> top-k   keep w >= the k-th largest w
                                     -> top-p   keep the largest w whose mass (over what top-k
                                                kept) first reaches top_p, ties included
                                     -> min-p   keep w >= min_p
                                     -> one inverse-CDF draw over the kept w, in vocab order

The choice is made from the logits after the penalties and the grammar mask
(model_proc/logits_processors.py); logprobs are read from the raw logits.

Each filter keeps the tokens whose w reaches a per-row threshold, so the kept set is
`w >= max(thresholds)`. The order is SGLang's and Hugging Face's (top-p sees the distribution
top-k left, renormalised); min-p compares with the largest w, a ratio that renormalising does
not change, so its place in the order does not matter.

Reproducibility: a row's draw uses one uniform number u = hash(seed, position); its kept set and
its CDF (over the kept tokens in vocabulary order) come from that row alone. So a request's
token depends on its logits, parameters, seed and position, and on nothing else: not on which
rows share its batch, nor on which of the two paths below served it (they compute the same
CDF: the full-row one only adds exact zeros for the dropped tokens).

Cost, CPU, vocab ~49k: every full-size pass over [rows, vocab] counts. An all-greedy batch is
one max. A sampled batch is one new buffer (w) and an in-place exp; then
    * rows with a filter whose kept set fits in the top HEAD_LEN tokens (the usual case for
      top-k / top-p / min-p) draw inside `topk(w, HEAD_LEN)`: no full-row cumsum, no mask;
    * the other rows (temperature only, or a filter keeping many tokens) take a masked
      full-row cumsum. A top-p row whose head holds too little mass looks at a x16 longer
      head, and only that row pays for it.
"""

from __future__ import annotations

import numpy as np
import torch

from zserve.common.forward_batch import (
    MIN_P_OFF,
    TOP_K_OFF,
    TOP_P_OFF,
    GrammarMasks,
    PenaltyArrays,
    SamplingArrays,
)
from zserve.model_proc.logits_processors import apply_grammar, apply_penalties

# Below this a temperature is greedy (vLLM's rule too): 1 / T would overflow float32 near 3e-39,
# and long before that the draw is an argmax anyway.
MIN_TEMPERATURE = 1e-5
HEAD_LEN = 64  # top tokens looked at first for top-k / top-p / min-p rows
HEAD_GROWTH = 16  # a top-p row whose head is short of top_p looks again at a head this much longer

# splitmix64 (Steele, Lea & Flood 2014): a counter-based generator, so the n-th draw of a seed
# needs no state, only (seed, n). Arithmetic is on uint64, where numpy wraps by definition.
_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_MUL_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_MUL_2 = np.uint64(0x94D049BB133111EB)


class Sampler:
    """Stateless apart from the device; one per ModelRunner."""

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)

    def sample(
        self,
        logits: torch.Tensor,
        sampling: SamplingArrays,
        positions: torch.Tensor,
        want_logprob: np.ndarray,
        penalties: PenaltyArrays | None = None,
        grammar: GrammarMasks | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Choose one token per row. `logits` is read, never written.

        logits: float32[n, vocab], one row per request of the batch (the rows that `penalties`
        and `grammar` name); sampling: exactly the n rows; positions: int64[n], the
        position of the token being generated (the draw's counter); want_logprob: bool[n].

        Returns (token_ids int32[n], logprobs float32[n]). A logprob is the chosen token's
        log-probability under the model's *unmodified* distribution, log_softmax(raw logits),
        before penalties, temperature, top-k, top-p or min-p; NaN where the row did not ask.
        `penalties` (rows of the requests that asked) adjust a copy of the logits the choice is
        made from (`apply_penalties`). That is vLLM's
        default ("raw" logprobs, what OpenAI's API reports); SGLang reports them after
        temperature. Raw logprobs belong to the model and the text alone: the same text scores
        the same whatever a request's sampling parameters, greedy and sampled requests compare,
        and transformers can check them.
        """
        num_rows = self._check(logits, sampling, positions, want_logprob)
        chosen_from = apply_grammar(apply_penalties(logits, penalties), grammar, logits)
        if sampling.all_greedy:
            token_ids = _argmax(chosen_from)
        else:
            token_ids = self._sample_mixed(chosen_from, sampling, positions)
        logprobs = torch.full((num_rows,), float("nan"), dtype=torch.float32, device=logits.device)
        if want_logprob.any():
            rows = self._tensor(np.flatnonzero(want_logprob))
            # log_softmax is one fused pass; logsumexp would be four unfused ones.
            all_logprobs = torch.log_softmax(_select_rows(logits, rows).float(), dim=-1)
            logprobs.index_copy_(0, rows, all_logprobs.gather(1, _select_rows(token_ids, rows)[:, None]).squeeze(1))
        return token_ids.to(torch.int32), logprobs

    def _sample_mixed(self, logits: torch.Tensor, sampling: SamplingArrays, positions: torch.Tensor) -> torch.Tensor:
        """Greedy rows take the argmax, the others one seeded draw each."""
        sampled = sampling.temperature >= MIN_TEMPERATURE
        rows = self._tensor(np.flatnonzero(sampled))
        params = sampling.select(sampled)
        uniforms = self._tensor(uniform_from_seed(params.seed, positions.cpu().numpy()[sampled]).astype(np.float32))
        row_logits = _select_rows(logits, rows).float()
        inv_temperature = 1.0 / self._tensor(params.temperature)[:, None]
        # w = exp((logits - max) / T): one new buffer, then exp in place.
        weights = torch.addcmul(-row_logits.amax(dim=-1, keepdim=True) * inv_temperature, row_logits, inv_temperature)
        drawn = self._draw(weights.exp_(), params, uniforms)
        if rows.numel() == logits.shape[0]:
            return drawn
        return _argmax(logits).index_copy_(0, rows, drawn)

    def _draw(self, weights: torch.Tensor, params: SamplingArrays, uniforms: torch.Tensor) -> torch.Tensor:
        """int64[m]: one token per row of `weights` (float32[m, vocab], max 1 per row; ours)."""
        vocab_size = weights.shape[1]
        top_k_on = (params.top_k != TOP_K_OFF) & (params.top_k < vocab_size)
        filtered = top_k_on | (params.top_p < TOP_P_OFF) | (params.min_p > MIN_P_OFF)
        token_ids = torch.empty(weights.shape[0], dtype=torch.int64, device=weights.device)
        full_rows = np.flatnonzero(~filtered)  # drawn over the whole row
        full_floors = torch.zeros(full_rows.size, dtype=weights.dtype, device=weights.device)
        if filtered.any():
            rows = np.flatnonzero(filtered)
            floors, head_w, head_ids = self._floors(weights, params, top_k_on, rows)
            # The kept set fits in the head when the head's last token is not kept.
            fits = (
                (head_w[:, -1] < floors) if head_w.shape[1] < vocab_size else torch.ones_like(floors, dtype=torch.bool)
            )
            fits_np = fits.cpu().numpy()
            if fits_np.any():
                fit = torch.from_numpy(np.flatnonzero(fits_np)).to(weights.device)
                token_ids.index_copy_(
                    0,
                    self._tensor(rows[fits_np]),
                    _draw_in_head(
                        head_w.index_select(0, fit), head_ids.index_select(0, fit), floors.index_select(0, fit),
                        uniforms.index_select(0, self._tensor(rows[fits_np])),
                    ),
                )
            full_rows = np.concatenate([full_rows, rows[~fits_np]])
            full_floors = torch.cat([full_floors, floors[torch.from_numpy(~fits_np).to(weights.device)]])
        if full_rows.size:
            order = np.argsort(full_rows, kind="stable")
            full_rows, full_floors = full_rows[order], full_floors[self._tensor(order)]
            index = self._tensor(full_rows)
            row_weights = _select_rows(weights, index)
            if bool((full_floors > 0).any()):
                row_weights = torch.where(row_weights >= full_floors[:, None], row_weights, 0.0)
            # row_weights may be `weights` itself: it is not read again.
            token_ids.index_copy_(0, index, _inverse_cdf(row_weights, uniforms.index_select(0, index)))
        return token_ids

    def _floors(
        self, weights: torch.Tensor, params: SamplingArrays, top_k_on: np.ndarray, rows: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For the filtered `rows`: (the smallest w each keeps, float[r]; their top weights,
        float[r, head_len] descending; those tokens' ids, int64[r, head_len])."""
        vocab_size = weights.shape[1]
        index = self._tensor(rows)
        row_weights = _select_rows(weights, index)
        top_k = np.where(top_k_on[rows], params.top_k[rows], vocab_size).astype(np.int64)
        # One past the largest k, so that a top-k row's kept set fits in the head (see `fits`).
        head_len = min(max(HEAD_LEN, int(top_k[top_k_on[rows]].max(initial=0)) + 1), vocab_size)
        head_w, head_ids = torch.topk(row_weights, head_len, dim=-1)
        ks = self._tensor(np.minimum(top_k, head_len))  # rows without top-k do not use theirs
        top_k_floors = torch.where(
            self._tensor(top_k_on[rows]), head_w.gather(1, ks[:, None] - 1).squeeze(1), torch.zeros_like(head_w[:, 0])
        )
        min_p_floors = self._tensor(params.min_p[rows])
        floors = torch.maximum(top_k_floors, min_p_floors)
        top_p_on = params.top_p[rows] < TOP_P_OFF
        if top_p_on.any():
            # Top-p's mass is over what top-k kept: the head when top-k is on, else the row.
            kept_by_k = torch.where(head_w >= top_k_floors[:, None], head_w, 0.0)
            totals = torch.where(self._tensor(top_k_on[rows]), kept_by_k.sum(dim=-1), row_weights.sum(dim=-1))
            p_rows = np.flatnonzero(top_p_on)
            p_index = self._tensor(p_rows)
            top_p_floors = self._top_p_floors(
                _select_rows(row_weights, p_index), _select_rows(head_w, p_index),
                top_k_floors.index_select(0, p_index),
                self._tensor(params.top_p[rows][p_rows]) * totals.index_select(0, p_index),
            )
            floors.index_copy_(0, p_index, torch.maximum(floors.index_select(0, p_index), top_p_floors))
        return floors, head_w, head_ids

    def _top_p_floors(
        self, row_weights: torch.Tensor, head_w: torch.Tensor, top_k_floors: torch.Tensor, wanted_mass: torch.Tensor
    ) -> torch.Tensor:
        """float[r]: per row, the weight of the first token (largest first) at which the mass of
        the tokens so far reaches `wanted_mass`, counting only tokens with w >= top_k_floors.

        Look for it in the row's top weights (`head_w` first); a row whose head holds less mass
        tries again with a longer head. The head's values, and so its prefix sums, are the same
        whatever its length: the answer does not depend on it.
        """
        vocab_size = row_weights.shape[1]
        floors = torch.empty(row_weights.shape[0], dtype=row_weights.dtype, device=row_weights.device)
        todo = torch.arange(row_weights.shape[0], device=row_weights.device)
        head_len = head_w.shape[1]
        head = head_w
        while todo.numel():
            if head is None:
                head = torch.topk(_select_rows(row_weights, todo), head_len, dim=-1).values
            head = torch.where(head >= top_k_floors.index_select(0, todo)[:, None], head, 0.0)
            mass = torch.cumsum(head, dim=-1)
            wanted = wanted_mass.index_select(0, todo)
            reached = mass[:, -1] >= wanted
            if head_len == vocab_size:  # rounding left the row short of top_p: keep all top-k kept
                reached.fill_(True)
            last_idx = (mass < wanted[:, None]).sum(dim=-1).clamp_(max=head_len - 1)
            done = reached.nonzero().squeeze(1)
            floors.index_copy_(
                0, todo.index_select(0, done),
                head.index_select(0, done).gather(1, last_idx.index_select(0, done)[:, None]).squeeze(1),
            )
            todo = todo[~reached]
            head, head_len = None, min(head_len * HEAD_GROWTH, vocab_size)
        return floors

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device, non_blocking=True)

    @staticmethod
    def _check(logits, sampling, positions, want_logprob) -> int:
        if logits.dim() != 2:
            raise ValueError(f"logits must be [num_rows, vocab], got shape {tuple(logits.shape)}")
        num_rows = logits.shape[0]
        sizes = {
            "temperature": sampling.temperature.shape[0], "top_k": sampling.top_k.shape[0],
            "top_p": sampling.top_p.shape[0], "min_p": sampling.min_p.shape[0], "seed": sampling.seed.shape[0],
            "positions": positions.shape[0], "want_logprob": want_logprob.shape[0],
        }
        wrong = {name: size for name, size in sizes.items() if size != num_rows}
        if wrong:
            raise ValueError(f"sampler got {num_rows} rows of logits but {wrong}")
        return num_rows


def uniform_from_seed(seeds: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """float64[n] in [0, 1): the `positions[i]`-th output of the splitmix64 stream of `seeds[i]`.

    The seed is mixed first so that neighbouring seeds give unrelated streams."""
    stream = _mix64(seeds.astype(np.uint64))
    with np.errstate(over="ignore"):
        state = stream + _GOLDEN_GAMMA * (positions.astype(np.uint64) + np.uint64(1))
    return (_mix64(state) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _mix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _MIX_MUL_1
        x = (x ^ (x >> np.uint64(27))) * _MIX_MUL_2
    return x ^ (x >> np.uint64(31))


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    # max(dim).indices is argmax (first maximum on ties) and, on CPU, about twice as fast.
    return logits.max(dim=-1).indices


def _select_rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """t[rows]; `rows` is sorted and unique, so as many rows as `t` has means all of them,
    and no copy is made."""
    return t if rows.numel() == t.shape[0] else t.index_select(0, rows)


def _draw_in_head(
    head_w: torch.Tensor, head_ids: torch.Tensor, floors: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """int64[r]: the inverse-CDF draw over the kept tokens, all of which are in the head.

    The head is put back in vocabulary order first, so the CDF is the full-row one without the
    zeros of the dropped tokens: the same numbers, the same token."""
    vocab_order = torch.argsort(head_ids, dim=-1)
    ids = head_ids.gather(1, vocab_order)
    w = head_w.gather(1, vocab_order)
    kept_w = torch.where(w >= floors[:, None], w, 0.0)
    return ids.gather(1, _inverse_cdf(kept_w, uniforms)[:, None]).squeeze(1)


def _inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """int64[m]: per row, the first index whose cumulative weight exceeds u * total.
    `weights` is overwritten (with its cumulative sum: a new [m, vocab] buffer costs more on
    CPU than the pass itself).

    Zero-weight entries leave the cumulative sum flat, so they are never chosen; clamping the
    target below the total keeps u * total from rounding onto the end of the row.
    """
    cdf = weights.cumsum_(dim=-1)
    totals = cdf[:, -1:]
    targets = torch.minimum(uniforms[:, None] * totals, torch.nextafter(totals, torch.zeros_like(totals)))
    return torch.searchsorted(cdf, targets, right=True).squeeze(1).clamp_(max=weights.shape[1] - 1)

