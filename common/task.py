"""Task: the kind of work a server does with every request (--task), resolved once at start.

    generate   sample tokens after the prompt (the generation routes)
    embed      pool the prompt's final hidden states into one vector (/v1/embeddings), with its Pooling
               (common/pooling.py) and the vector's length; generation is refused

The launcher resolves the flags over the model directory once (`Task.resolve`, in
launcher/facts_resolver.py) into `ModelFacts.task`, which every process reads: the tokenizer (which
requests it takes), the scheduler (its owner of the kind: PoolingReqs for embed), the HTTP server (its
routes and health probe). No process compares the flag's string again.

Each kind of work has one owner in the scheduler and its route(s) in http_proc: generate is the
scheduler core and the OpenAI/SGLang routes, embed is scheduler_proc/pooled_reqs.py and
http_proc/apis/openai/embeddings_route.py. Adding a kind (classify, score) is a TASKS entry here, one owner
and one route.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zserve.common.pooling import Pooling

GENERATE = "generate"
EMBED = "embed"
TASKS = (GENERATE, EMBED)  # --task's choices


@dataclass(frozen=True, slots=True)
class Task:
    kind: str = GENERATE  # TASKS
    pooling: Pooling | None = None  # embed: how a prompt's hidden states become its vector
    embedding_size: int | None = None  # embed: the pooled vector's length (the model's hidden size)

    def __post_init__(self) -> None:
        if self.kind not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.kind!r}")
        if (self.pooling is not None, self.embedding_size is not None) != (self.is_embedding,) * 2:
            raise ValueError(f"task {self.kind}: pooling and embedding_size are embed's, and embed needs both")

    @property
    def is_embedding(self) -> bool:
        return self.kind == EMBED

    @staticmethod
    def check_flags(task: str, pooler_config: str) -> None:
        """The rules between --task and --pooler-config that need no model directory."""
        if pooler_config and task != EMBED:
            raise ValueError(f"--pooler-config sets an embedding server's pooling: it needs --task {EMBED}")

    @staticmethod
    def resolve(task: str, model_dir: str | Path, pooler_config: str, hidden_size: int) -> Task:
        """--task over the model directory: for embed, its pooling (--pooler-config over it) and vector size."""
        Task.check_flags(task, pooler_config)
        if task != EMBED:
            return Task(task)
        return Task(EMBED, Pooling.from_model_dir(model_dir).overridden(pooler_config), hidden_size)

    @staticmethod
    def from_dict(values: dict[str, Any]) -> Task:
        """The Task that `dataclasses.asdict` wrote (ModelFacts' JSON)."""
        pooling = values.get("pooling")
        return Task(values["kind"], None if pooling is None else Pooling(**pooling), values.get("embedding_size"))
