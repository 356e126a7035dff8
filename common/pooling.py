"""Pooling: how an embedding server (--task embed) turns a prompt's final hidden states into one vector.

Read as sentence-transformers writes it in the model directory: `modules.json` lists the modules in
order; a `sentence_transformers.models.Pooling` module's folder (`1_Pooling/config.json`) names the mode
(`pooling_mode_lasttoken`, `pooling_mode_mean_tokens` or `pooling_mode_cls_token`), and a
`sentence_transformers.models.Normalize` module means the vector is L2-normalised. With no such files:
last-token pooling, normalised (vLLM's default for a decoder checkpoint; Qwen3-Embedding's own config).
vLLM's `--pooler-config '{"pooling_type": "MEAN", "normalize": false}'` overrides either (`overridden`).

A prompt may be computed in several chunks (chunked prefill). The worker, which keeps no state about
requests, returns one vector per chunk (`ModelRunner`: the chunk's last position, its first, or the sum
of its positions, after the model's final norm); the scheduler folds them with `combine` and ends with
`finish`:

    chunk        c0            c1            c2 (the prompt's last)
    last         h[c0 last]    h[c1 last]    h[c2 last]       -> the last chunk's
    cls          h[0]          (dropped)     (dropped)        -> the first chunk's
    mean         sum(c0)   +   sum(c1)   +   sum(c2)          -> / num_prompt_tokens
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

POOLING_MODES = ("last", "mean", "cls")
# sentence-transformers' 1_Pooling/config.json keys, in the order a config that sets several is read
ST_MODE_KEYS = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
ST_POOLING = "sentence_transformers.models.Pooling"
ST_NORMALIZE = "sentence_transformers.models.Normalize"
VLLM_POOLING_TYPES = {"LAST": "last", "MEAN": "mean", "CLS": "cls"}  # --pooler-config's pooling_type


@dataclass(frozen=True, slots=True)
class Pooling:
    mode: str  # POOLING_MODES
    normalize: bool  # L2-normalise the pooled vector

    def __post_init__(self) -> None:
        if self.mode not in POOLING_MODES:
            raise ValueError(f"pooling mode must be one of {', '.join(POOLING_MODES)}, got {self.mode!r}")

    @staticmethod
    def from_model_dir(model_dir: str | Path) -> Pooling:
        """The model directory's sentence-transformers pooling, or last-token + normalise without one."""
        modules_path = Path(model_dir) / "modules.json"
        if not modules_path.is_file():
            return Pooling("last", normalize=True)
        modules = json.loads(modules_path.read_text(encoding="utf-8"))
        if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
            raise ValueError(f"{modules_path}: expected a list of modules (sentence-transformers' modules.json)")
        types = [m.get("type") for m in modules]
        mode = "last"
        if ST_POOLING in types:
            folder = modules[types.index(ST_POOLING)].get("path", "")
            config_path = Path(model_dir) / folder / "config.json"
            config = json.loads(config_path.read_text(encoding="utf-8"))
            modes = [name for key, name in ST_MODE_KEYS.items() if config.get(key)]
            other = [k for k, v in config.items() if k.startswith("pooling_mode_") and v and k not in ST_MODE_KEYS]
            if other or len(modes) != 1:
                raise ValueError(
                    f"{config_path}: zserve pools with exactly one of {', '.join(ST_MODE_KEYS)}; "
                    f"this config sets {', '.join(other + [k for k in ST_MODE_KEYS if config.get(k)]) or 'none'}"
                )
            mode = modes[0]
        return Pooling(mode, normalize=ST_NORMALIZE in types)

    def overridden(self, pooler_config: str) -> Pooling:
        """This pooling with --pooler-config's JSON (vLLM's `pooling_type` LAST | MEAN | CLS, `normalize`)
        over it; "" changes nothing. Any other key is refused: it would change the answer unseen."""
        if not pooler_config:
            return self
        try:
            override = json.loads(pooler_config)
        except ValueError:
            raise ValueError(f"--pooler-config must be a JSON object, got {pooler_config!r}") from None
        if not isinstance(override, dict):
            raise ValueError(f"--pooler-config must be a JSON object, got {pooler_config!r}")
        unknown = sorted(set(override) - {"pooling_type", "normalize"})
        if unknown:
            raise ValueError(
                f"--pooler-config: {', '.join(unknown)} not supported here (pooling_type and normalize are)"
            )
        mode, normalize = self.mode, override.get("normalize", self.normalize)
        if "pooling_type" in override:
            pooling_type = override["pooling_type"]
            if pooling_type not in VLLM_POOLING_TYPES:
                raise ValueError(f"--pooler-config: pooling_type must be one of {', '.join(VLLM_POOLING_TYPES)}, "
                                 f"got {pooling_type!r}")
            mode = VLLM_POOLING_TYPES[pooling_type]
        if not isinstance(normalize, bool):
            raise ValueError(f"--pooler-config: normalize must be true or false, got {normalize!r}")
        return Pooling(mode, normalize)

    def combine(self, pooled: np.ndarray | None, chunk: np.ndarray) -> np.ndarray:
        """Fold one chunk's vector (float32[hidden], see the table above) into what earlier chunks gave."""
        if pooled is None:
            return chunk.astype(np.float32, copy=True)
        if self.mode == "mean":
            return pooled + chunk
        return chunk.astype(np.float32, copy=True) if self.mode == "last" else pooled

    def finish(self, pooled: np.ndarray, num_tokens: int) -> np.ndarray:
        """The embedding of a prompt of `num_tokens` tokens whose chunks folded into `pooled`."""
        vector = pooled / num_tokens if self.mode == "mean" else pooled
        if self.normalize:
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)  # torch's F.normalize eps
        return vector.astype(np.float32, copy=False)
