"""Support for the hostile-input tests: a model whose chat template misbehaves on cue, and a check
that a hostile request next to a normal one fails alone while the normal one is served on time.

    neighbour = Neighbour.start(server.port, expected)   # a normal request, in flight meanwhile
    ... send the hostile request, assert its clear error ...
    neighbour.assert_served()                             # same greedy output, within the deadline
"""

from __future__ import annotations

import http.client
import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from testing.tokenizer_fixtures import CHATML_TEMPLATE
from zserve.client import Client
from zserve.client.types import GenerateResult

NORMAL_PROMPT = "The quick brown fox"
NORMAL_MAX_TOKENS = 24
SERVED_WITHIN_S = 20.0  # generous for a loaded 2-core machine; a stalled process shows as a timeout

# The fixture's ChatML template, misbehaving when the last message's content names a cue:
#   zero   ZeroDivisionError (an exception jinja2 does not wrap)
#   spin   ten billion empty loop turns (only the render timeout stops it)
#   big    a hundred million characters of output (only the output cap stops it)
#   deep   a recursive macro (RecursionError)
HOSTILE_TEMPLATE = (
    "{% set cue = messages[-1]['content'] %}"
    "{% if cue == 'zero' %}{{ 1 // 0 }}{% endif %}"
    "{% if cue == 'spin' %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}"
    "{% if cue == 'big' %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endif %}"
    "{% macro down(n) %}{{ down(n + 1) }}{% endmacro %}{% if cue == 'deep' %}{{ down(0) }}{% endif %}"
    + CHATML_TEMPLATE
)


def build_hostile_model_dir(model_dir: Path, target_dir: Path) -> Path:
    """A copy of `model_dir` whose chat template is HOSTILE_TEMPLATE."""
    shutil.copytree(model_dir, target_dir, dirs_exist_ok=True)
    (target_dir / "chat_template.jinja").write_text(HOSTILE_TEMPLATE, encoding="utf-8")
    config_path = target_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    return target_dir


@dataclass
class Neighbour:
    """A normal request run in a thread of its own, next to a hostile one."""

    expected: GenerateResult
    started_s: float = field(default_factory=time.monotonic)
    result: GenerateResult | None = None
    error: BaseException | None = None
    thread: threading.Thread | None = None

    @staticmethod
    def start(port: int, expected: GenerateResult) -> Neighbour:
        neighbour = Neighbour(expected)

        def run() -> None:
            try:
                with Client(port, timeout_s=SERVED_WITHIN_S) as c:
                    neighbour.result = c.generate(NORMAL_PROMPT, max_tokens=NORMAL_MAX_TOKENS, ignore_eos=True)
            except BaseException as exc:  # reported by assert_served
                neighbour.error = exc

        neighbour.thread = threading.Thread(target=run, daemon=True)
        neighbour.thread.start()
        return neighbour

    def assert_served(self) -> None:
        self.thread.join(SERVED_WITHIN_S + 5)
        assert self.error is None, f"the normal request next to the hostile one failed: {self.error!r}"
        assert self.result is not None, f"the normal request was not served within {SERVED_WITHIN_S}s"
        assert self.result.output_ids == self.expected.output_ids, "the normal request's output changed"


def http_post(port: int, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()
