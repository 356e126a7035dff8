"""Pooling.from_model_dir reads sentence-transformers' modules.json and 1_Pooling/config.json; combine and
finish fold a prompt's chunk vectors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zserve.common.pooling import Pooling


def write_st(model_dir, pooling: dict | None, normalize: bool) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    if pooling is not None:
        modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
        (model_dir / "1_Pooling").mkdir()
        (model_dir / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (model_dir / "modules.json").write_text(json.dumps(modules))


def test_no_sentence_transformers_files_is_last_token_normalised(tmp_path):
    assert Pooling.from_model_dir(tmp_path) == Pooling("last", normalize=True)


@pytest.mark.parametrize(("key", "mode"), [("pooling_mode_lasttoken", "last"), ("pooling_mode_mean_tokens", "mean"),
                                           ("pooling_mode_cls_token", "cls")])
@pytest.mark.parametrize("normalize", [True, False])
def test_the_config_names_the_mode_and_normalize_module(tmp_path, key, mode, normalize):
    write_st(tmp_path, {key: True, "pooling_mode_max_tokens": False, "word_embedding_dimension": 8}, normalize)
    assert Pooling.from_model_dir(tmp_path) == Pooling(mode, normalize)


@pytest.mark.parametrize("config", [{"pooling_mode_max_tokens": True}, {},
                                    {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}])
def test_a_mode_zserve_does_not_pool_with_is_refused(tmp_path, config):
    write_st(tmp_path, config, normalize=True)
    with pytest.raises(ValueError, match="zserve pools with exactly one of"):
        Pooling.from_model_dir(tmp_path)


def test_combine_and_finish():
    chunks = [np.array([1.0, 0.0], np.float32), np.array([3.0, 4.0], np.float32)]
    for mode, want in [("mean", [4 / 3, 4 / 3]), ("last", [0.6, 0.8]), ("cls", [1.0, 0.0])]:
        pooling = Pooling(mode, normalize=mode != "mean")
        folded = None
        for chunk in chunks:
            folded = pooling.combine(folded, chunk)
        assert np.allclose(pooling.finish(folded, 3), want), mode
    with pytest.raises(ValueError, match="pooling mode must be one of"):
        Pooling("max", normalize=False)


def test_vllms_pooler_config_overrides_the_directory():
    base = Pooling("last", normalize=True)
    assert base.overridden("") is base
    assert base.overridden('{"pooling_type": "MEAN"}') == Pooling("mean", True)
    assert base.overridden('{"pooling_type": "CLS", "normalize": false}') == Pooling("cls", False)


@pytest.mark.parametrize(("text", "words"), [
    ('{"pooling_type": "MAX"}', "pooling_type must be one of LAST, MEAN, CLS"),
    ('{"dimensions": 8}', "dimensions not supported here"),
    ('{"normalize": "yes"}', "normalize must be true or false"),
    ("[1]", "must be a JSON object"),
    ("MEAN", "must be a JSON object"),
])
def test_a_pooler_config_that_would_change_the_answer_unseen_is_refused(text, words):
    with pytest.raises(ValueError, match=words):
        Pooling("last", normalize=True).overridden(text)


def test_the_launcher_resolves_the_pooling_once_for_every_process(tmp_path):
    from testing.embedding_fixtures import make_embedding_checkpoint
    from testing.model_facts import facts_of
    from zserve.common.model_facts import ModelFacts
    from zserve.common.server_config import ServerConfig

    model_dir = str(make_embedding_checkpoint(tmp_path / "emb", "mean", normalize=False))
    assert facts_of(ServerConfig(model=model_dir)).task.pooling is None  # a generating server
    facts = facts_of(ServerConfig(model=model_dir, task="embed"))
    assert facts.task.pooling == Pooling("mean", normalize=False) and facts.task.embedding_size == 64
    overridden = facts_of(ServerConfig(model=model_dir, task="embed", pooler_config='{"normalize": true}'))
    assert ModelFacts.from_json(overridden.to_json()).task.pooling == Pooling("mean", normalize=True)
