"""A rank's place among the tensor-parallel ranks (model_proc/rank_place.py), and the worker's sections."""

from __future__ import annotations

import pytest

from zserve.common.config_sections import CacheSection, KernelSection, ModelSection
from zserve.common.server_config import ServerConfig
from zserve.model_proc.rank_place import RankPlace
from zserve.model_proc.worker_sections import WorkerSections


def test_a_rank_is_one_of_the_ranks():
    assert RankPlace("cpu", 1, 2).tp_rank == 1
    with pytest.raises(ValueError, match="tp_rank must be in 0..1 for tp_size 2, got 2"):
        RankPlace("cpu", 2, 2)
    with pytest.raises(ValueError, match="tp_rank must be in 0..0"):
        RankPlace("cpu", -1)
    with pytest.raises(ValueError, match="tp_size must be >= 1"):
        RankPlace("cpu", 0, 0)


def test_the_worker_keeps_its_sections_of_the_config():
    cfg = ServerConfig(model="m", page_size=32, gemm_backend="torch", tp_size=2, device="cpu", startup_timeout_s=5.0)
    sections = WorkerSections.of(cfg)
    assert type(sections.model) is ModelSection and sections.model.model == "m"
    assert sections.cache == CacheSection(page_size=32)
    assert sections.kernels == KernelSection(gemm_backend="torch")
    assert sections.frontend.startup_timeout_s == 5.0
    assert sections.place(1) == RankPlace("cpu", 1, 2)
