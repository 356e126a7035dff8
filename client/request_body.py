"""The request body both clients send: validated by the server, not here.

The client sends what it is given, unchanged (token ids that are not ints stay what they are,
and the server refuses them); only a value the wire cannot carry at all (an int beyond 64 bits,
a string that is not valid Unicode, an object msgpack does not know) is refused here, naming
where it is, with the InvalidRequestError the server would have raised.

One default is added here: a request that names no max_tokens gets DEFAULT_MAX_TOKENS (128, SGLang's
native default); `max_tokens=None` asks for up to the context (nothing is sent, the server's meaning).
"""

from __future__ import annotations

import itertools
import operator
import secrets
from typing import Any

from zserve.client.types import InvalidRequestError
from zserve.common.choices import num_choices
from zserve.common.messages import CLIENT_TO_FRONTEND, GenerateReq
from zserve.common.sampling_params import DEFAULT_MAX_TOKENS

MAX_DEPTH = 32  # deeper nesting than any valid body has: the wire refuses it
# keywords sent next to the prompt, not in `sampling`: n choices; how a chat's messages are rendered (its function
# definitions, continuing its last assistant message, no generation prompt, its own chat template, more template
# variables: tokenizer_proc/chat_options.py); an embedding request (a --task embed server)
REQUEST_KEYS = ("n", "tools", "continue_final_message", "add_generation_prompt", "chat_template",
                "chat_template_kwargs", "embed")


def new_req_id() -> int:
    return secrets.randbits(62)


def build_body(
    prompt: str | None, input_ids: list[int] | None, messages: list[dict] | None, sampling: dict[str, Any],
) -> dict:
    given = [k for k, v in (("prompt", prompt), ("input_ids", input_ids), ("messages", messages)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of prompt, input_ids or messages (got {', '.join(given) or 'none'})")
    sampling = {"max_tokens": DEFAULT_MAX_TOKENS, **sampling}  # not named: 128; named None: up to the context
    body: dict[str, Any] = {"sampling": {k: v for k, v in sampling.items() if v is not None and k not in REQUEST_KEYS}}
    # token ids as ints here, as strings on the wire (JSON's keys)
    if isinstance(body["sampling"].get("logit_bias"), dict):
        body["sampling"]["logit_bias"] = {
            str(k) if isinstance(k, int) and not isinstance(k, bool) else k: v
            for k, v in body["sampling"]["logit_bias"].items()
        }
    for key in REQUEST_KEYS:  # request-level fields, next to the prompt
        if sampling.get(key) is not None:
            body[key] = sampling[key]
    if prompt is not None:
        body["prompt"] = prompt
    elif input_ids is not None:
        body["input_ids"] = [_as_int(t) for t in input_ids]
    else:
        body["messages"] = messages
    return body


def num_copies(body: dict[str, Any]) -> int:
    """How many request ids a body with `n` occupies (req_id .. req_id + n - 1; common/choices.py);
    1 for an `n` the server will refuse, whose error comes on req_id alone."""
    return num_choices(body) or 1


def refuse_copies(sampling: dict[str, Any], method: str) -> None:
    """`method` answers one choice: a valid `n` above 1 is refused before anything is sent (its
    other choices would never be read)."""
    n = num_copies(sampling)
    if n > 1:
        raise InvalidRequestError(
            f"{method} answers one choice but n={n}: use generate_batch (each prompt's n choices in turn), "
            f"or submit and then result(req_id + i) for i in range({n})"
        )


def encode_request(msg: GenerateReq) -> bytes:
    """The frame for `msg`, or InvalidRequestError naming the first value the wire cannot carry."""
    problem = _unsendable(msg.body, 0)
    if problem is None:
        try:
            return CLIENT_TO_FRONTEND.encode(msg)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidRequestError(f"the request cannot be encoded: {exc}", req_id=msg.req_id) from None
    where, what = problem
    raise InvalidRequestError("request" + "".join(reversed(where)) + what, req_id=msg.req_id)


def _as_int(t: Any) -> Any:
    """numpy and other integer types become int (lossless); anything else is sent as it is."""
    if isinstance(t, int) or isinstance(t, (float, str, bytes)):
        return t
    try:
        return operator.index(t)
    except TypeError:
        return t


# A problem: the path to the value, innermost part first ("[3]", ".messages"), and what is wrong with it. The
# path is built only on the way back from a problem, so a valid body of a million values costs no strings.
Problem = tuple[list[str], str]


def _unsendable(value: Any, depth: int) -> Problem | None:
    if depth > MAX_DEPTH:
        return [], f" is nested more than {MAX_DEPTH} levels deep"
    if isinstance(value, bool) or value is None or isinstance(value, (float, bytes)):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**64 else ([], f" = {value} does not fit in 64 bits")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return [], f" is not valid Unicode ({exc.reason} at character {exc.start})"
        return None
    if isinstance(value, (list, tuple)):
        if value and all(type(item) is int for item in value) and -(2**63) <= min(value) and max(value) < 2**64:
            return None  # token ids: checked at C speed
        for i, item in enumerate(value):
            problem = _unsendable(item, depth + 1)
            if problem is not None:
                problem[0].append(f"[{i}]")
                return problem
        return None
    if isinstance(value, dict):
        if all(type(key) is str and type(item) is str for key, item in value.items()):  # a chat message
            try:
                "".join(itertools.chain.from_iterable(value.items())).encode("utf-8")
                return None
            except UnicodeEncodeError:
                pass  # the walk below names the string
        for key, item in value.items():
            if not isinstance(key, str):
                return [], f" has a key that is not a string: {key!r:.64}"
            problem = _unsendable(key, depth + 1)
            if problem is not None:
                problem[0].append(" key")
                return problem
            problem = _unsendable(item, depth + 1)
            if problem is not None:
                problem[0].append(f".{key[:64]}")
                return problem
        return None
    return [], f" is a {type(value).__name__}, which a request cannot carry (use str, int, float, bool, list, dict)"
