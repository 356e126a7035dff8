"""ChoiceStream: one streamed chat choice, its new text run through reasoning split -> tool stream -> content.

Each event's new text goes first through the request's reasoning split (reasoning.py: the thinking apart
from the answer; under stream_reasoning false held until the thinking ends, or the answer does); then,
with a tool parser, the answer so far through a ToolCallStream (tools/stream.py: content as far as no call
may begin, each call's name once, then its arguments as they are written); without one, the answer's new
text is the content. The chat formatter owns one per streamed choice.
"""

from __future__ import annotations

from typing import Any

from zserve.http_proc.apis.openai.tool_choice import ForcedToolChoice
from zserve.http_proc.reasoning import ReasoningOptions
from zserve.http_proc.shared.request_group import ChoiceEvent
from zserve.http_proc.tools.parser import ToolCallParser
from zserve.http_proc.tools.stream import ToolCallStream


class ChoiceStream:
    def __init__(self, *, reasoning: ReasoningOptions | None, tool_parser: ToolCallParser | ForcedToolChoice | None):
        self.reasoning = reasoning
        self.split = None if reasoning is None else reasoning.splitter()
        self.held_thought = ""  # stream_reasoning false: thinking not yet sent
        self.content = ""  # with a reasoning parser and a tool parser: the content so far
        self.tools = None if tool_parser is None else ToolCallStream(tool_parser)

    @property
    def made_calls(self) -> bool:
        return self.tools is not None and self.tools.made_calls

    def delta(self, event: ChoiceEvent) -> dict[str, Any]:
        """The chat delta for one event: `reasoning_content` first, then `content` or `tool_calls`; {} when
        nothing is new."""
        final = event.result.finish_reason is not None
        if self.split is None:
            thought, content, content_so_far = "", event.delta, event.result.text
        else:
            thought, content = self._split(event.delta, final)
            if self.tools is not None:  # (kept only where needed: the tool stream reads the whole content)
                self.content += content
            content_so_far = self.content
        delta: dict[str, Any] = {"reasoning_content": thought} if thought else {}
        if self.tools is not None:
            delta.update(self.tools.feed(content_so_far, final=final))
        elif content:
            delta["content"] = content
        return delta

    def _split(self, text: str, final: bool) -> tuple[str, str]:
        """(thinking to send, content) of new text."""
        assert self.split is not None and self.reasoning is not None
        thought, content = self.split.feed(text)
        if final:
            more_thought, more_content = self.split.finish()
            thought, content = thought + more_thought, content + more_content
        if not self.reasoning.stream_reasoning:  # held until the thinking ends (or the answer does)
            thought = self.held_thought + thought
            done = not self.split.thinking or final
            self.held_thought, thought = ("", thought) if done else (thought, "")
        return thought, content
