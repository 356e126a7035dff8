"""What one message costs on the wire: encode + decode of the hot messages, in this process.

    .venv/bin/python benchmarks/bench_wire.py [--rounds 15] [--seconds 0.05]

The hot messages are the ones sent every step: a `TokenOutBatch` of a 64-request decode step
(scheduler -> detokenizer), a `ForwardBatch` of 64 decoding requests (contexts of 100-2000
tokens, 16-token pages) and a `ForwardBatch` prefilling one 2048-token prompt (scheduler ->
worker). Each round times each message for about `--seconds`; the best round is printed (the
least disturbed by other processes), in microseconds per encode + decode, with the frame size.

`cases()` takes the message modules as arguments, so that a script can time another copy of the
wire code in the same process, interleaved, for a ratio that machine noise does not skew.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine_info import load_average, machine_info  # noqa: E402

NUM_REQS = 64
PAGE_SIZE = 16
PROMPT_LEN = 2048


def cases(messages: ModuleType, forward_batch: ModuleType) -> dict[str, tuple[Any, Any]]:
    """name -> (codec, message): the three hot messages built with these modules' classes."""
    rng = np.random.default_rng(0)
    next_ids = rng.integers(0, 32000, NUM_REQS).astype(np.int32)
    outs = messages.TokenOutBatch(outs=[
        messages.TokenOut(req_id=1000 + i, token_ids=next_ids[i : i + 1]) for i in range(NUM_REQS)
    ])
    cached = rng.integers(100, 2000, NUM_REQS).astype(np.int32)
    decode = _forward_batch(forward_batch, next_ids, cached, np.ones(NUM_REQS, np.int32))
    prompt = rng.integers(0, 32000, PROMPT_LEN).astype(np.int32)
    prefill = _forward_batch(forward_batch, prompt, np.zeros(1, np.int32), np.array([PROMPT_LEN], np.int32))
    return {
        f"TokenOutBatch ({NUM_REQS} reqs)": (messages.DETOK_INBOX, outs),
        f"ForwardBatch decode ({NUM_REQS} reqs)": (messages.WORKER_INBOX, decode),
        f"ForwardBatch prefill ({PROMPT_LEN} tokens)": (messages.WORKER_INBOX, prefill),
    }


def _forward_batch(forward_batch: ModuleType, input_ids: np.ndarray, cached_lens: np.ndarray, extend_lens: np.ndarray) -> Any:
    num_reqs = len(extend_lens)
    num_pages = -(-(cached_lens + extend_lens) // PAGE_SIZE)
    sampling = forward_batch.SamplingArrays(
        temperature=np.full(num_reqs, 0.7, np.float32), top_k=np.zeros(num_reqs, np.int32),
        top_p=np.full(num_reqs, 0.95, np.float32), min_p=np.zeros(num_reqs, np.float32),
        seed=np.arange(num_reqs, dtype=np.int64),
    )
    return forward_batch.ForwardBatch(
        step_id=12345, input_ids=input_ids, cached_lens=cached_lens, extend_lens=extend_lens,
        page_ids=np.arange(int(num_pages.sum()), dtype=np.int32), num_pages=num_pages.astype(np.int32),
        is_sampled=np.ones(num_reqs, np.bool_), return_logprob=np.zeros(num_reqs, np.bool_), sampling=sampling,
    )


def round_trip_us(codec: Any, msg: Any, seconds: float) -> float:
    """Mean microseconds of one encode + decode, over about `seconds`."""
    n, start = 0, time.perf_counter()
    while True:
        for _ in range(50):
            codec.decode(codec.encode(msg))
        n += 50
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.05, help="time per message per round")
    args = parser.parse_args()
    from zserve.common import forward_batch, messages

    info = machine_info()
    print(f"# {info['cpu']}, {info['num_cores']} cores, load {load_average()}")
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, (codec, msg) in cases(messages, forward_batch).items():
            best[name] = min(best.get(name, float("inf")), round_trip_us(codec, msg, args.seconds))
    for name, (codec, msg) in cases(messages, forward_batch).items():
        print(f"{name:34s} {best[name]:8.1f} us  encode + decode, frame {len(codec.encode(msg)):6d} bytes")


if __name__ == "__main__":
    main()
