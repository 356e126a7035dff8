"""Hostile requests through the Python client: each gets a clear error of its own (InvalidRequestError,
from the server or, for values the wire cannot carry, from the client) while a normal request
next to it is served with its usual output."""

from __future__ import annotations

import pytest

from testing.hostile import Neighbour
from zserve.client import Client, InvalidRequestError

TINY = [{"role": "user", "content": "a"}]


def chat(content: str) -> dict:
    return {"messages": [{"role": "user", "content": content}]}


CASES = [
    # numbers out of range
    ("top_k=2**31", {"prompt": "hi", "top_k": 2**31}, r"top_k must be an integer in \[0, 2147483647\]"),
    ("top_k above vocab", {"prompt": "hi", "top_k": 10**6}, "top_k must be at most the vocabulary size"),
    ("top_k negative", {"prompt": "hi", "top_k": -1}, "top_k must be an integer in"),
    ("max_tokens=10**30", {"prompt": "hi", "max_tokens": 10**30}, "does not fit in 64 bits"),
    ("max_tokens=2**40", {"prompt": "hi", "max_tokens": 2**40}, r"max_tokens must be an integer in \[1, "),
    ("max_tokens=0", {"prompt": "hi", "max_tokens": 0}, "max_tokens must be an integer in"),
    ("max_tokens beyond context", {"prompt": "hi", "max_tokens": 100_000}, "maximum context length is 512 tokens"),
    ("temperature nan", {"prompt": "hi", "temperature": float("nan")}, "temperature must be a finite number"),
    ("temperature inf", {"prompt": "hi", "temperature": float("inf")}, "temperature must be a finite number"),
    ("temperature huge int", {"prompt": "hi", "temperature": 10**400}, "does not fit in 64 bits"),
    ("top_p=2", {"prompt": "hi", "top_p": 2}, r"top_p must be in \(0, 1\]"),
    ("min_p=1", {"prompt": "hi", "min_p": 1.0}, r"min_p must be in \[0, 1\)"),
    ("seed=2**63", {"prompt": "hi", "seed": 2**63}, r"seed must be an integer in \[0, 2\*\*63\)"),
    ("seed=-1", {"prompt": "hi", "seed": -1}, "seed must be an integer in"),
    ("ignore_eos string", {"prompt": "hi", "ignore_eos": "yes"}, "ignore_eos and return_logprob must be booleans"),
    # lists and strings over their caps
    ("10,000 stop strings", {"prompt": "hi", "stop": ["x"] * 10_000}, "stop has 10000 strings; at most 32"),
    ("1,000,000 stop strings", {"prompt": "hi", "stop": ["ab"] * 1_000_000}, "stop has 1000000 strings"),
    ("a 10,000-char stop string", {"prompt": "hi", "stop": ["x" * 10_000]}, r"stop\[0\] is 10000 characters"),
    ("an empty stop string", {"prompt": "hi", "stop": [""]}, r"stop\[0\] must be a non-empty string"),
    ("100,000 stop ids", {"prompt": "hi", "stop_token_ids": list(range(100_000))}, "stop_token_ids has 100000 ids"),
    ("stop id beyond vocab", {"prompt": "hi", "stop_token_ids": [10**6]}, "are not in the vocabulary"),
    ("unknown field self", {"prompt": "hi", "self": 1}, "unknown sampling field.*self"),
    ("10,000 unknown fields", {"prompt": "hi", **{f"f{i}": i for i in range(10_000)}}, "and 9995 more"),
    # prompts
    ("input_ids with a float", {"input_ids": [5, 1.5]}, r"input_ids\[1\] must be an integer, got float"),
    ("input_ids negative", {"input_ids": [-1]}, r"input_ids\[0\] = -1 is not a token id"),
    ("input_ids beyond vocab", {"input_ids": [10**6]}, "is not a token id"),
    ("input_ids longer than the context", {"input_ids": [5] * 600}, "the prompt is 600 tokens"),
    ("a 10-million-char prompt", {"prompt": "x" * 10_000_000}, "the prompt is 10000000 characters"),
    ("a lone surrogate", {"prompt": "\ud800 hi"}, "is not valid Unicode"),
    ("a lone surrogate in a message", {"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\udc00"}]},
     r"request\.messages\[1\]\.content is not valid Unicode"),
    ("an id beyond 64 bits", {"input_ids": [5, 2**64]}, r"request\.input_ids\[1\] = 18446744073709551616 does not fit in 64 bits"),
    ("an object as a value", {"prompt": "hi", "top_k": object()}, "which a request cannot carry"),
    # structured output: schemas whose compilation would hold the compile thread for minutes, specs xgrammar refuses
    ("a schema nested 1,500 deep", {"prompt": "hi", "json_schema": '{"type":"object","properties":{"a":' * 1500 + "{}" + "}}" * 1500},
     "json_schema nests deeper than 64 levels"),
    ("a schema nested 30,000 deep", {"prompt": "hi", "json_schema": "[" * 30_000 + "]" * 30_000}, "json_schema nests deeper than 64 levels"),
    ("2,000 optional properties", {"prompt": "hi", "json_schema": {"type": "object", "properties": {f"p{i}": {} for i in range(2000)}}},
     "json_schema has an object with 2000 properties at #; at most 256"),
    ("a 1 MB regex", {"prompt": "hi", "regex": "a" * (1 << 20)}, "regex must be a non-empty string of at most 65536 characters"),
    ("a regex nested 20,000 deep", {"prompt": "hi", "regex": "(" * 20_000 + "a" + ")" * 20_000}, "regex cannot be used: .*Nest layer"),
    ("an EBNF without root", {"prompt": "hi", "ebnf": 'start ::= "a"'}, "ebnf cannot be used"),
    ("json_schema not a schema", {"prompt": "hi", "json_schema": "[1, 2]"}, "json_schema must be a JSON schema"),
    # chat messages
    ("100,001 messages", {"messages": TINY * 100_001}, "messages has 100001 entries; at most 511"),
    ("a made-up role", {"messages": [{"role": "hacker", "content": "x"}]}, r"messages\[0\].role must be one of"),
    ("content as a dict", {"messages": [{"role": "user", "content": {"a": 1}}]}, r"messages\[0\].content must be a string"),
    ("template divides by zero", chat("zero"), "chat template failed on the messages: ZeroDivisionError"),
    ("template loops forever", chat("spin"), r"chat template took over 2s to render"),
    ("template prints 100M chars", chat("big"), "the rendered chat prompt passed"),
    ("template recurses forever", chat("deep"), "chat template failed on the messages: RecursionError"),
]


@pytest.mark.parametrize(("name", "request_kwargs", "needle"), CASES, ids=[c[0] for c in CASES])
def test_hostile_request_fails_alone(hostile_server, expected, name, request_kwargs, needle):
    neighbour = Neighbour.start(hostile_server.port, expected)
    kwargs = dict(request_kwargs)
    prompt = kwargs.pop("prompt", None)
    with Client(hostile_server.port, timeout_s=30) as c, pytest.raises(InvalidRequestError, match=needle):
        c.generate(prompt, **kwargs)
    neighbour.assert_served()
