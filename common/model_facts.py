"""What the server's processes must agree on about the model, resolved once by the launcher.

The launcher reads the model directory and the flags once (launcher/facts_resolver.py) and passes
this record, as JSON next to the config, to every child (`--model-facts`): no child works these
out again, so they cannot disagree (the context /v1/models reports is the one the frontend checks
prompts against and the scheduler stops requests at).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from zserve.common.task import Task
from zserve.common.tool_call_format import TOOL_CALL_FORMATS


@dataclass(frozen=True, slots=True)
class ModelFacts:
    context_len: int  # tokens of prompt + output: the model's maximum, or less with --context-length
    # the default chat template's Jinja source: --chat-template's, else the tokenizer's
    chat_template: str | None = None
    chat_template_origin: str = ""  # where it came from (a file), for error messages
    # how the chat template writes tool calls (TOOL_CALL_FORMATS); None: not one we parse
    tool_call_format: str | None = None
    vocab_size: int | None = None  # ids the model has rows for (config.json); a prompt id at or above it is refused
    # generation_config.json's sampling (when it samples)
    default_sampling: dict[str, float] = field(default_factory=dict)
    # --reasoning-parser's end of thinking (`</think>`) as token ids: a grammar starts after them; () without one
    think_end_ids: tuple[int, ...] = ()
    # --task: the kind of work, with embed's pooling and vector size (common/task.py)
    task: Task = Task()

    def __post_init__(self) -> None:
        if self.context_len < 2:
            raise ValueError(f"context_len must be >= 2, got {self.context_len}")
        if self.tool_call_format is not None and self.tool_call_format not in TOOL_CALL_FORMATS:
            raise ValueError(
                f"tool_call_format must be one of {TOOL_CALL_FORMATS} or None, got {self.tool_call_format!r}"
            )

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> ModelFacts:
        values = json.loads(text)
        task = Task.from_dict(values["task"]) if "task" in values else Task()
        return ModelFacts(**{**values, "think_end_ids": tuple(values.get("think_end_ids", ())), "task": task})
