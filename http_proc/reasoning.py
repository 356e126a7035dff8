"""ReasoningParser: a reasoning model's thinking (`<think>...</think>`) split from its answer.

`--reasoning-parser qwen3 | deepseek-r1` (vLLM's and SGLang's names). The rules, as both peers
apply them:
- one `<think>` opening the output is dropped (DeepSeek-R1-0528 and Qwen3 write it themselves;
  newer templates put it in the prompt, so only `</think>` appears);
- in thinking mode, the text up to the first `</think>` is `reasoning_content` and the rest is
  `content`; with no `</think>` (cut by max_tokens) all of it is reasoning;
- deepseek-r1 always starts in thinking mode; qwen3 does unless the request's
  `chat_template_kwargs` has `enable_thinking: false` (the template then writes an empty
  `<think>\\n\\n</think>` into the prompt), in which case the output is content, unless it opens
  with `<think>` itself.

ReasoningSplit streams it: `feed(delta)` returns the (reasoning, content) text that is certain so
far, holding back a tail that may still be the start of a tag; `finish()` the held-back rest. The
deltas concatenate to what `split(text)` gives for the whole text, wherever the text is cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zserve.common.think_markers import REASONING_PARSERS, THINK_CLOSE, THINK_OPEN


@dataclass(frozen=True)
class ReasoningParser:
    kind: str  # "qwen3" | "deepseek-r1"
    end_ids: tuple[int, ...] = ()  # THINK_CLOSE as the tokenizer encodes it (ModelFacts.think_end_ids)

    def __post_init__(self) -> None:
        if self.kind not in REASONING_PARSERS:
            raise ValueError(f"reasoning parser must be one of {', '.join(REASONING_PARSERS)}, got {self.kind!r}")

    @staticmethod
    def of(kind: str, end_ids: tuple[int, ...] = ()) -> ReasoningParser | None:
        """The parser --reasoning-parser names; None for "none" (or "")."""
        return None if kind in ("", "none") else ReasoningParser(kind, tuple(end_ids))

    def thinks(self, template_kwargs: dict[str, Any] | None) -> bool:
        """Whether an answer starts inside the thinking (see the module doc)."""
        return self.kind == "deepseek-r1" or (template_kwargs or {}).get("enable_thinking", True) is not False

    def splitter(self, template_kwargs: dict[str, Any] | None) -> ReasoningSplit:
        return ReasoningSplit(thinking=self.thinks(template_kwargs))

    def split(self, text: str, template_kwargs: dict[str, Any] | None) -> tuple[str, str]:
        """(reasoning, content) of a whole answer."""
        return self.splitter(template_kwargs).split(text)


@dataclass(frozen=True)
class ReasoningOptions:
    """One chat request's use of the server's parser: its template variables (enable_thinking) and
    SGLang's `stream_reasoning` (false: the thinking goes out in one delta once it has ended)."""

    parser: ReasoningParser
    template_kwargs: dict[str, Any] | None = None
    stream_reasoning: bool = True

    def splitter(self) -> ReasoningSplit:
        return self.parser.splitter(self.template_kwargs)


@dataclass
class ReasoningSplit:
    """One answer's split, fed its text piece by piece (owned by the formatter of one choice)."""

    thinking: bool  # in thinking mode, before `</think>`
    opened: bool = False  # past the point where a leading `<think>` could still come
    held: str = field(default="")  # text not yet given out: it may be (the start of) a tag

    def feed(self, delta: str) -> tuple[str, str]:
        """The (reasoning, content) text `delta` makes certain."""
        text = self.held + delta
        self.held = ""
        if not self.opened:
            if THINK_OPEN.startswith(text) and text != THINK_OPEN:
                self.held = text  # "" or the start of "<think>": wait for more
                return "", ""
            self.opened = True
            if text.startswith(THINK_OPEN):
                text = text[len(THINK_OPEN) :]
                self.thinking = True
        if not self.thinking:
            return "", text
        end = text.find(THINK_CLOSE)
        if end >= 0:
            self.thinking = False
            return text[:end], text[end + len(THINK_CLOSE) :]
        keep = _partial_tag_len(text, THINK_CLOSE)
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep], ""

    def finish(self) -> tuple[str, str]:
        """The held-back rest, once the answer has ended."""
        text, self.held, self.opened = self.held, "", True
        return (text, "") if self.thinking else ("", text)

    def split(self, text: str) -> tuple[str, str]:
        reasoning, content = self.feed(text)
        more_reasoning, more_content = self.finish()
        return reasoning + more_reasoning, content + more_content


def _partial_tag_len(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag` (without being all of it)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
