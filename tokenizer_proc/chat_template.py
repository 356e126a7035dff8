"""A model's Jinja chat template, compiled once and rendered in a sandbox the way transformers does.

Chat templates come from model repositories, so they are untrusted code: they run in jinja2's
ImmutableSandboxedEnvironment (no attribute starting with "_", no mutating built-in containers),
with the globals and filters transformers gives them: `raise_exception`, `strftime_now`, a
`tojson` that does not HTML-escape, `dict`, and a `namespace` that refuses "_" names.
`trim_blocks` and `lstrip_blocks` are on, and loop controls (`{% break %}`) and the
`{% generation %}` tag (assistant-mask templates) parse. Rendering must give the same string as
transformers' `apply_chat_template(..., tokenize=False)`: the parity tests hold us to it.

A render is also bounded: it stops once its output passes `max_chars` (the prompt could not fit
the context anyway) or after `timeout_s` (a SIGALRM timer, in the main thread: a loop that
prints nothing cannot run on), and whatever the template raises becomes a ChatTemplateError
for that request; the sandbox's own range limit bounds each `range()`.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils

CONTINUE_MARKER = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' own marker, so renders match it
# The variables the render sets itself: a request's chat_template_kwargs may not name them.
RESERVED_VARIABLES = frozenset(("messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
                                "chat_template", "tokenize"))

class ChatTemplateError(ValueError):
    """The template refused the conversation (e.g. `raise_exception('roles must alternate')`);
    the message is fit for the client."""


class ChatTemplate:
    def __init__(self, source: str, origin: str):
        """`origin` names where the template came from (a file), for error messages."""
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"{origin}: chat template is empty or not a string")
        self.source = source
        self.origin = origin
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.globals["dict"] = _TemplateDict()
        env.globals["namespace"] = _TemplateNamespace
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"{origin}: chat template does not compile (line {exc.lineno}): {exc.message}") from exc

    def render(
        self, messages: list[dict[str, Any]], *, add_generation_prompt: bool, special_tokens: dict[str, str],
        max_chars: int | None = None, timeout_s: float | None = None, tools: list[dict[str, Any]] | None = None,
        continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """Render a conversation (with `tools`, the function definitions a tool-calling template lists).
        `special_tokens` are the template variables transformers passes from the tokenizer's special
        tokens map (`bos_token`, `eos_token`, ...). `template_kwargs`: more variables (a request's
        chat_template_kwargs, e.g. Qwen3's `enable_thinking`), as transformers' `**kwargs` pass them;
        they may override a special token, not a RESERVED_VARIABLES name (ValueError).
        `continue_final_message`: the text ends inside the last message, right after its content
        (its turn is left open, for the model to continue), as transformers does it: a marker is
        appended to that content and the render is cut where the marker lands.
        Raises ChatTemplateError when the template rejects the conversation, fails on it, or
        passes `max_chars` or `timeout_s`."""
        # transformers drops None-valued keys from each message before rendering.
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        if continue_final_message:
            if add_generation_prompt:
                raise ValueError("continue_final_message and add_generation_prompt exclude each other")
            if not chat or not isinstance(chat[-1].get("content"), str):
                raise ChatTemplateError("continue_final_message needs a last message with text content to continue")
            chat[-1] = {**chat[-1], "content": chat[-1]["content"] + CONTINUE_MARKER}
        reserved = sorted(RESERVED_VARIABLES.intersection(template_kwargs or {}))
        if reserved:
            raise ValueError(f"chat_template_kwargs cannot set {reserved[0]!r}: the server sets it")
        variables = {**special_tokens, **(template_kwargs or {})}
        text = self._render_bounded(chat, add_generation_prompt, variables, max_chars, timeout_s, tools)
        return _cut_at_marker(text, messages[-1]["content"]) if continue_final_message else text

    def _render_bounded(
        self, chat: list[dict[str, Any]], add_generation_prompt: bool, extra_variables: dict[str, Any],
        max_chars: int | None, timeout_s: float | None, tools: list[dict[str, Any]] | None,
    ) -> str:
        variables = dict(
            messages=chat, tools=tools or None, documents=None, add_generation_prompt=add_generation_prompt,
            **extra_variables,
        )
        parts: list[str] = []
        num_chars = 0
        try:
            with _deadline(timeout_s):
                for part in self._template.generate(**variables):
                    parts.append(part)
                    num_chars += len(part)
                    if max_chars is not None and num_chars > max_chars:
                        raise ChatTemplateError(
                            f"the rendered chat prompt passed {max_chars} characters, more than the context can hold"
                        )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:  # raise_exception, undefined values, sandbox refusals
            raise ChatTemplateError(f"chat template rejected the messages: {exc}") from exc
        except _RenderTimeout:
            raise ChatTemplateError(f"the chat template took over {timeout_s:g}s to render these messages") from None
        except (RecursionError, MemoryError) as exc:
            raise ChatTemplateError(f"the chat template failed on the messages: {type(exc).__name__}") from None
        except Exception as exc:  # the template is untrusted code: whatever it raises ends this request only
            raise ChatTemplateError(f"the chat template failed on the messages: {type(exc).__name__}: {exc}") from exc
        return "".join(parts)


def _cut_at_marker(text: str, final_content: str) -> str:
    """The render up to the end of the last message's content (where CONTINUE_MARKER landed); a
    template that trims the content's end trims the marker's space too, so the cut then trims."""
    tag = CONTINUE_MARKER.strip()
    if tag not in text or final_content.strip() not in text:
        raise ChatTemplateError(
            "continue_final_message: the chat template does not show the last message's content as given, "
            "so it cannot be continued"
        )
    loc = text.rindex(tag)
    return text[:loc] if text[loc : loc + len(CONTINUE_MARKER)] == CONTINUE_MARKER else text[:loc].rstrip()


class _RenderTimeout(BaseException):
    """Raised by the render timer (a BaseException, so the template's code cannot catch it)."""


@contextlib.contextmanager
def _deadline(timeout_s: float | None) -> Iterator[None]:
    """Raise _RenderTimeout in this thread after `timeout_s`; only in the main thread, where
    Python delivers signals (elsewhere, as in tests calling from a worker thread, no timer)."""
    if not timeout_s or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise _RenderTimeout()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    started_s = time.monotonic()
    outer_delay_s, outer_interval_s = signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay_s > 0:  # someone else's timer (pytest-timeout's, say) runs on, less the time spent here
            outer_left_s = max(outer_delay_s - (time.monotonic() - started_s), 0.001)
            signal.setitimer(signal.ITIMER_REAL, outer_left_s, outer_interval_s)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; serving
    only needs it to parse, and renders the body unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False):
    # Jinja's own tojson HTML-escapes; transformers' does not, and templates expect plain JSON.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` inside templates, without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja2's namespace, refusing underscore names (a route to interpreter internals)."""

    def __init__(*args: Any, **kwargs: Any):  # noqa: N805 - same signature trick as jinja2.utils.Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot store {name!r} on a namespace")
