"""SpeculativeSettings: what the --speculative-* flags and vLLM's --speculative-config JSON say, checked.

    --speculative-algorithm ngram --speculative-num-draft-tokens 5
    --speculative-ngram-min-match-window-size 1 --speculative-ngram-max-match-window-size 3
    --speculative-config '{"method": "ngram", "num_speculative_tokens": 5,
                           "prompt_lookup_min": 1, "prompt_lookup_max": 3}'

are the same configuration: the launcher folds the JSON into the flags (`resolve_speculative_config`,
its keys win over the flags; a missing prompt_lookup_min / max keeps the flag's, moved so min <= max)
and refuses a bad JSON, another method, an unknown key or min > max with one line (exit code 2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from zserve.common.config_sections import SpeculationSection
from zserve.common.server_config import ServerConfig

JSON_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "disable_by_batch_size")
MAX_DRAFT_TOKENS = 64
SPECULATIVE_ALGORITHMS = ("none", "ngram")  # --speculative-algorithm (scheduler_proc/ngram_drafter.py drafts)


@dataclass(frozen=True)
class SpeculativeSettings:
    algorithm: str  # one of SPECULATIVE_ALGORITHMS
    num_draft_tokens: int
    min_window: int
    max_window: int
    disable_by_batch_size: int = 0  # no drafts in a step with at least this many decoding requests (0: never off)

    @property
    def enabled(self) -> bool:
        return self.algorithm != "none"

    @staticmethod
    def of(cfg: SpeculationSection) -> SpeculativeSettings:
        """The effective settings (the JSON over the flags); ValueError naming the flag when one is bad."""
        settings = SpeculativeSettings(
            cfg.speculative_algorithm.lower(), cfg.speculative_num_draft_tokens,
            cfg.speculative_ngram_min_match_window_size, cfg.speculative_ngram_max_match_window_size,
            cfg.speculative_disable_by_batch_size,
        )
        if cfg.speculative_config.strip():
            settings = settings._with_json(cfg.speculative_config)
        if settings.algorithm not in SPECULATIVE_ALGORITHMS:
            raise ValueError(f"--speculative-algorithm must be none or ngram, got {cfg.speculative_algorithm!r}")
        if not 1 <= settings.num_draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(
                f"--speculative-num-draft-tokens must be in 1..{MAX_DRAFT_TOKENS}, got {settings.num_draft_tokens}"
            )
        if not 1 <= settings.min_window <= settings.max_window:
            raise ValueError(
                f"--speculative-ngram-min-match-window-size ({settings.min_window}) must be >= 1 and at most "
                f"--speculative-ngram-max-match-window-size ({settings.max_window})"
            )
        return settings

    def _with_json(self, text: str) -> SpeculativeSettings:
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"--speculative-config is not valid JSON ({exc.msg} at character {exc.pos}): {text!r}"
            ) from None
        if not isinstance(spec, dict):
            raise ValueError(f"--speculative-config must be a JSON object, got {text!r}")
        unknown = sorted(set(spec) - set(JSON_KEYS))
        if unknown:
            raise ValueError(
                f"--speculative-config: unsupported key(s) {', '.join(unknown)} (zserve reads {', '.join(JSON_KEYS)})"
            )
        method = spec.get("method")
        if not isinstance(method, str) or method.lower() != "ngram":
            raise ValueError(
                f"--speculative-config: method must be \"ngram\" (the only one zserve runs), got {method!r}"
            )
        for key in JSON_KEYS[1:]:
            value, least = spec.get(key), 0 if key == "disable_by_batch_size" else 1
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise ValueError(f"--speculative-config: {key} must be an integer >= {least}, got {value!r}")
        lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
        if lo is None and hi is not None:
            lo = min(hi, self.min_window)
        if hi is None and lo is not None:
            hi = max(lo, self.max_window)
        return SpeculativeSettings(
            "ngram", spec.get("num_speculative_tokens") or self.num_draft_tokens,
            lo if lo is not None else self.min_window, hi if hi is not None else self.max_window,
            spec.get("disable_by_batch_size", self.disable_by_batch_size),
        )


def resolve_speculative_config(cfg: ServerConfig) -> ServerConfig:
    """The config with --speculative-config folded into the --speculative-* flags (and emptied), so
    every process reads one set of fields; ValueError when the settings are bad."""
    s = SpeculativeSettings.of(cfg)
    return replace(
        cfg, speculative_algorithm=s.algorithm, speculative_num_draft_tokens=s.num_draft_tokens,
        speculative_ngram_min_match_window_size=s.min_window, speculative_ngram_max_match_window_size=s.max_window,
        speculative_disable_by_batch_size=s.disable_by_batch_size, speculative_config="",
    )
