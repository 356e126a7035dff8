"""Per-request generation options, as the client sends them and the scheduler keeps them.

Built from the client's untrusted fields once, at the door (`from_dict`, in the frontend's
RequestValidator), then carried whole to the scheduler as a nested wire message."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from common.wire import message


@message()
@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int | None = None  # None: up to the context (prompt + output fill it at most)
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off; must be in (0, 1]
    min_p: float = 0.0  # 0 = off; must be in [0, 1)
    seed: int | None = None  # None: the scheduler draws one (sampling is still per-request reproducible in a run)
    stop: tuple[str, ...] = ()  # stop strings, matched on detokenized text
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    return_logprob: bool = False

    def validate(self) -> None:
        """Raise ValueError with a message fit for the client."""
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1 (or none: up to the context), got {self.max_tokens!r}")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_number(self.min_p) or not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a list of non-empty strings")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be a list of non-negative integers")
        if not isinstance(self.ignore_eos, bool) or not isinstance(self.return_logprob, bool):
            raise ValueError("ignore_eos and return_logprob must be booleans")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        d["stop_token_ids"] = list(self.stop_token_ids)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SamplingParams:
        """Build from client-supplied fields; unknown fields and wrong types raise ValueError."""
        if not isinstance(d, dict):
            raise ValueError(f"sampling params must be a mapping, got {type(d).__name__}")
        unknown = set(d) - set(SamplingParams.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown sampling field(s): {', '.join(sorted(map(str, unknown)))}")
        kw = dict(d)
        for key in ("stop", "stop_token_ids"):
            if key in kw:
                v = kw[key]
                if isinstance(v, str) and key == "stop":
                    v = [v]
                if not isinstance(v, (list, tuple)):
                    raise ValueError(f"{key} must be a list, got {type(v).__name__}")
                kw[key] = tuple(v)
        if isinstance(kw.get("temperature"), int) and not isinstance(kw.get("temperature"), bool):
            kw["temperature"] = float(kw["temperature"])
        params = SamplingParams(**kw)
        params.validate()
        return params


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


