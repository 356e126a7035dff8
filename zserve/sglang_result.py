"""SglangResult: a GenerateResult that also reads as SGLang's result dict, so that SGLang's positional
quick start, `for out in engine.generate(prompts, params): out["text"]`, reads zserve.Engine's results.

The dict is client/sglang_shape.py's (`{"text", "output_ids", "meta_info"}`, the /generate route's SGLang
answer too); the client's own GenerateResult knows nothing of SGLang: the facade adds the reading here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from zserve.client.sglang_shape import sglang_output
from zserve.client.types import GenerateResult


@dataclass(slots=True)
class SglangResult(GenerateResult):
    def __getitem__(self, key: str) -> Any:
        """SGLang's result keys (`text`, `output_ids`, `meta_info`); KeyError for any other."""
        return sglang_output(self)[key]

    @staticmethod
    def of(result: GenerateResult) -> SglangResult:
        return SglangResult(**{f.name: getattr(result, f.name) for f in fields(result)})
