"""What a model worker process reads of the one server configuration, as typed sections: what is
served (model), where its ranks run (parallel), the KV pool (cache), how it computes (kernels), and of
the frontend section its start timeout and log level. The process receives the whole ServerConfig as
JSON (common/proc_runtime.py child_args) and keeps only these; the ModelRunner takes four of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from zserve.common.config_sections import CacheSection, FrontendSection, KernelSection, ModelSection, ParallelSection
from zserve.common.server_config import ServerConfig
from zserve.model_proc.rank_place import RankPlace


@dataclass(frozen=True)
class WorkerSections:
    model: ModelSection
    parallel: ParallelSection
    cache: CacheSection
    kernels: KernelSection
    frontend: FrontendSection  # startup_timeout_s, log_level

    @staticmethod
    def of(cfg: ServerConfig) -> WorkerSections:
        return WorkerSections(cfg.section(ModelSection), cfg.section(ParallelSection), cfg.section(CacheSection),
                              cfg.section(KernelSection), cfg.section(FrontendSection))

    def place(self, rank: int) -> RankPlace:
        """Rank `rank`'s place: --device as given, among --tp-size ranks."""
        return RankPlace(self.parallel.device, rank, self.parallel.tp_size)
