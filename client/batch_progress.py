"""A progress bar over an offline batch: prompts finished, and the token rates so far.

    Generating: 100%|██████████| 20000/20000 [03:10<00:00, 105.0prompt/s, in 1,690 tok/s, out 840 tok/s]

The bar counts prompts (with `n`, a prompt is done when all its choices are); "in" counts each
prompt's tokens once, "out" every choice's output tokens, both over the time since the bar began.
It writes to stderr (tqdm's default), nothing at all when disabled (`use_tqdm=False`).
"""

from __future__ import annotations

import time

from tqdm import tqdm

from zserve.client.types import GenerateResult


class BatchProgress:
    def __init__(self, num_prompts: int, *, enabled: bool = True):
        self._bar = tqdm(total=num_prompts, desc="Generating", unit="prompt", disable=not enabled, dynamic_ncols=True)
        self._start_s = time.perf_counter()
        self.num_prompt_tokens = 0
        self.num_output_tokens = 0

    def update(self, choices: list[GenerateResult]) -> None:
        """One prompt finished, with its choices' results."""
        self.num_prompt_tokens += choices[0].usage.prompt_tokens if choices else 0
        self.num_output_tokens += sum(r.usage.completion_tokens for r in choices)
        if not self._bar.disable:
            elapsed_s = max(time.perf_counter() - self._start_s, 1e-9)
            self._bar.set_postfix_str(
                f"in {self.num_prompt_tokens / elapsed_s:,.0f} tok/s, "
                f"out {self.num_output_tokens / elapsed_s:,.0f} tok/s",
                refresh=False,  # the update below redraws, at most every tqdm.mininterval
            )
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> BatchProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
