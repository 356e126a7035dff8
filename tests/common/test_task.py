"""Task (common/task.py): --task resolved once into the typed record every process reads."""

from __future__ import annotations

import json

import pytest

from zserve.common.model_facts import ModelFacts
from zserve.common.pooling import Pooling
from zserve.common.task import EMBED, GENERATE, TASKS, Task


def test_generate_is_the_default_and_carries_no_pooling(tmp_path):
    task = Task.resolve(GENERATE, tmp_path, "", hidden_size=64)
    assert task == Task() and not task.is_embedding and task.pooling is None and task.embedding_size is None


def test_embed_reads_the_model_directory_and_the_pooler_config(tmp_path):
    task = Task.resolve(EMBED, tmp_path, "", hidden_size=64)  # no modules.json: last token, normalised
    assert task.is_embedding and task.pooling == Pooling("last", normalize=True) and task.embedding_size == 64
    overridden = Task.resolve(EMBED, tmp_path, '{"pooling_type": "MEAN", "normalize": false}', hidden_size=64)
    assert overridden.pooling == Pooling("mean", normalize=False)


def test_a_pooler_config_needs_embed():
    with pytest.raises(ValueError, match="it needs --task embed"):
        Task.check_flags(GENERATE, '{"normalize": true}')
    Task.check_flags(EMBED, '{"normalize": true}')


@pytest.mark.parametrize(("args", "words"), [
    (("classify",), "task must be one of"),
    ((GENERATE, Pooling("last", normalize=True), None), "pooling and embedding_size are embed's"),
    ((EMBED, Pooling("last", normalize=True), None), "embed needs both"),
    ((EMBED, None, 8), "embed needs both"),
])
def test_a_task_without_its_facts_is_refused(args, words):
    with pytest.raises(ValueError, match=words):
        Task(*args)


@pytest.mark.parametrize("task", [Task(), Task(EMBED, Pooling("cls", normalize=False), 32)])
def test_the_task_crosses_to_the_children_in_the_model_facts(task):
    facts = ModelFacts(context_len=300, task=task)
    assert ModelFacts.from_json(facts.to_json()).task == task
    assert json.loads(facts.to_json())["task"]["kind"] in TASKS
