"""Embedding fixtures: a tiny Qwen3 checkpoint (written by transformers, testing/model_fixtures.py)
with sentence-transformers' pooling files, and the oracle: transformers' AutoModel (Qwen3Model) in
fp32 on the same weights, pooled and normalised per those files (common/pooling.py's rules).

    model_dir = make_embedding_checkpoint(tmp_path / "emb", "mean")
    expected = hf_embeddings(model_dir, [[5, 6, 7], [8, 9]])   # float32[2, hidden]
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from testing.model_fixtures import make_tiny_checkpoint
from zserve.common.pooling import Pooling

ST_MODE_KEY = {"last": "pooling_mode_lasttoken", "mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token"}


def make_embedding_checkpoint(
    target_dir: str | Path, mode: str = "last", *, normalize: bool = True, bare: bool = False,
) -> Path:
    """A tiny Qwen3 with a tokenizer, plus modules.json, 1_Pooling/config.json (pooling `mode`) and,
    when `normalize`, a 2_Normalize module, as sentence-transformers saves them. `bare`: the weights as a
    bare Qwen3Model saves them (no `model.` prefix, no lm_head; the config ties the head to the embeddings)."""
    target = make_tiny_checkpoint(target_dir, "qwen3", with_tokenizer=True)
    if bare:
        _strip_to_bare_model(target)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (target / "2_Normalize").mkdir()
    (target / "modules.json").write_text(json.dumps(modules, indent=2))
    hidden_size = json.loads((target / "config.json").read_text())["hidden_size"]
    config = {"word_embedding_dimension": hidden_size, **{key: key == ST_MODE_KEY[mode] for key in ST_MODE_KEY.values()},
              "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
              "pooling_mode_weightedmean_tokens": False, "include_prompt": True}
    (target / "1_Pooling").mkdir()
    (target / "1_Pooling" / "config.json").write_text(json.dumps(config, indent=2))
    return target


def _strip_to_bare_model(target: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(target / "model.safetensors")
    save_file({name.removeprefix("model."): w for name, w in weights.items() if name != "lm_head.weight"},
              target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}, indent=2))


@torch.no_grad()
def hf_embeddings(model_dir: str | Path, prompts: list[list[int]]) -> np.ndarray:
    """float32[len(prompts), hidden]: transformers' AutoModel last_hidden_state, one prompt at a time
    (no padding), pooled per the directory's sentence-transformers config."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    pooling = Pooling.from_model_dir(model_dir)
    vectors = []
    for ids in prompts:
        hidden = model(torch.tensor([ids])).last_hidden_state[0]  # [len, hidden]
        vector = {"last": hidden[-1], "cls": hidden[0], "mean": hidden.mean(dim=0)}[pooling.mode]
        if pooling.normalize:
            vector = torch.nn.functional.normalize(vector, dim=0)
        vectors.append(vector.numpy())
    return np.stack(vectors).astype(np.float32)
