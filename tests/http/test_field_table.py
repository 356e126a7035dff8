"""The README's request-field table covers every field each route declares: a field added to a request model,
to the native /generate keywords or to SGLang's shape without a row saying whether it is honoured, refused or
ignored (and why) fails here. And each row's verdict holds: every field it names is sent on every route it names
(in-process, RecordingClient answering for the server), and the answer or what the route asks of the server shows
the verdict (test_each_field_s_verdict_holds_when_it_is_sent)."""

from __future__ import annotations

import json
import re

import pytest

from testing.asgi_call import RecordingClient, call_app
from testing.paths import REPO_ROOT
from zserve.common.sampling_params import SamplingParams
from zserve.http_proc.apis.anthropic.protocol import MessagesRequest
from zserve.http_proc.apis.openai.embeddings_route import EmbeddingRequest
from zserve.http_proc.apis.openai.protocol import ChatCompletionRequest, CompletionRequest
from zserve.http_proc.apis.openai.tokenize_route import DetokenizeRequest, TokenizeRequest
from zserve.http_proc.apis.responses.protocol import ResponsesRequest
from zserve.http_proc.apis.sglang import protocol as sglang_protocol
from zserve.http_proc.http_app import build_app
from zserve.http_proc.reasoning import ReasoningParser
from zserve.http_proc.shared.health_monitor import HealthMonitor
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.refused_fields import REFUSED_UNLESS_DEFAULT
from zserve.http_proc.shared.request_gate import GatePolicy
from zserve.http_proc.shared.server_metrics import ServerMetrics
from zserve.http_proc.shared.unknown_fields import SGLANG_IGNORED_FIELDS
from zserve.http_proc.tools.parser import ToolCallParser
from zserve.tokenizer_proc.request_validator import BODY_KEYS

GENERATION_ROUTES = ("chat", "completions", "/generate")
ROUTES = (*GENERATION_ROUTES, "/tokenize", "/detokenize", "/v1/responses", "/v1/messages", "/v1/embeddings")
TABLE_HEADER = "| Field | Route | Here | Why |"


def declared_fields() -> dict[str, set[str]]:
    """route -> every field name a request on it may carry and the server reads."""
    generate = set(BODY_KEYS) - {"sampling", "n"} | {"stream"} | set(SamplingParams.__struct_fields__)
    generate |= {"sampling_params", *sglang_protocol.RENAMED_TOP, *sglang_protocol.KEPT_TOP}
    generate |= {*sglang_protocol.RENAMED_SAMPLING, *sglang_protocol.KEPT_SAMPLING, *sglang_protocol.SGLANG_ONLY_TOP}
    refused = set(REFUSED_UNLESS_DEFAULT)
    refused_sglang = {name for name in refused if not name.startswith("guided_")}  # vLLM's are OpenAI-route fields
    ignored = {name for name in SGLANG_IGNORED_FIELDS if "." not in name}
    return {
        "chat": set(ChatCompletionRequest.model_fields) | refused,
        "completions": set(CompletionRequest.model_fields) | refused,
        "/generate": generate | refused_sglang | ignored,
        "/tokenize": set(TokenizeRequest.model_fields),
        "/detokenize": set(DetokenizeRequest.model_fields),
        "/v1/responses": set(ResponsesRequest.model_fields),
        "/v1/messages": set(MessagesRequest.model_fields),
        "/v1/embeddings": set(EmbeddingRequest.model_fields),
    }


def table_rows() -> list[tuple[set[str], set[str], str]]:
    """(field names, routes, verdict) of each row of the README's field table."""
    readme = (REPO_ROOT / "README.md").read_text()
    start = readme.index(TABLE_HEADER)
    lines = readme[start: readme.index("\n\n", start)].splitlines()[2:]
    rows = []
    for line in lines:
        field_cell, route_cell, verdict, _why = (cell.strip() for cell in line.strip("|").split(" | ", 3))
        names = set(re.findall(r"`([a-z_][a-z0-9_]*)", field_cell))
        if route_cell in ("all", "as sent"):
            routes = set(GENERATION_ROUTES if route_cell == "all" else ROUTES)
        else:
            routes = {part.strip().strip("`") for part in route_cell.split(",")}
        rows.append((names, routes, verdict))
    return rows


def test_the_table_names_only_known_routes_and_verdicts():
    for names, routes, verdict in table_rows():
        assert routes <= set(ROUTES), (names, routes)
        assert verdict in ("honoured", "refused", "ignored"), (names, verdict)


@pytest.mark.parametrize("route", ROUTES)
def test_every_declared_field_has_a_row(route):
    covered = {name for names, routes, _ in table_rows() if route in routes for name in names}
    missing = sorted(declared_fields()[route] - covered)
    assert not missing, f"README field table lacks rows for {route}: {missing}"


# ---- each row's verdict, by sending its fields -------------------------------------------------------------------
#
# Every (field, route) of the table is sent to the HTTP app in-process (RecordingClient answers for the server and
# records what each route asks of it): once with the field and once without, the rest of the body the same.
#   honoured: 200, and what the route sends the server, or what it answers, changes (or a CHECKS probe holds)
#   refused:  a 4xx whose message names the field
#   ignored:  200, and neither changes

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
USER = [{"role": "user", "content": "hi"}]
CONTINUED = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
BASES = {
    "chat": {"messages": USER},
    "completions": {"prompt": "hi", "max_tokens": 4},
    "/generate": {"prompt": "hi", "max_tokens": 4},
    "/generate sglang": {"text": "hi", "sampling_params": {"max_new_tokens": 4}},
    "/tokenize": {"prompt": "hi"},
    "/tokenize messages": {"messages": USER},
    "/detokenize": {"tokens": [1]},
    "/v1/responses": {"input": "hi", "max_output_tokens": 4},
    "/v1/messages": {"messages": USER, "max_tokens": 4},
    "/v1/embeddings": {"input": "hi"},
}
SGLANG_SHAPED = {"text", "sampling_params", "max_new_tokens", "min_new_tokens", "sampling_seed", "top_logprobs_num",
                 *sglang_protocol.SGLANG_ONLY_TOP, *REFUSED_UNLESS_DEFAULT, *SGLANG_IGNORED_FIELDS}
IN_SAMPLING_PARAMS = {"max_new_tokens", "min_new_tokens", "sampling_seed"}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}

# a value that asks for something: by (name, route, verdict), (name, verdict), (name, route), or name
VALUES: dict = {
    "messages": [{"role": "user", "content": "hello there"}], "prompt": "hello", "input_ids": [5, 6, 7],
    "max_tokens": 7, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.5, "top_k": 5, "min_p": 0.1,
    "seed": 3, "stop": ["x"], "stop_token_ids": [5], "ignore_eos": True, "min_tokens": 2, "presence_penalty": 0.5,
    "frequency_penalty": 0.5, "repetition_penalty": 1.2, "logit_bias": {"5": 1.0}, "n": 2, "stream": True,
    "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2, "return_logprob": True,
    "prompt_logprobs": 1, "top_logprobs_num": 2, "echo": True, "suffix": "x", "user": "u1", "tools": [TOOL],
    "tool_choice": "required", "parallel_tool_calls": False, "response_format": {"type": "json_object"},
    "json_object": True, "json_schema": json.dumps(SCHEMA), "structured_outputs": {"regex": "a+"},
    "guided_json": SCHEMA, "guided_regex": "a+", "guided_choice": ["a", "b"], "guided_grammar": 'root ::= "a"',
    "regex": "a+", "ebnf": 'root ::= "a"', "skip_special_tokens": False, "no_stop_trim": True,
    "include_stop_str_in_output": True, "bad_words": ["x"], "allowed_token_ids": [1],
    "add_generation_prompt": False, "chat_template": "{{ messages[0].content }}", "continue_final_message": True,
    "return_prompt_text": True, "grammar_after": [5], "chat_template_kwargs": {"enable_thinking": False},
    "separate_reasoning": False, "stream_reasoning": False, "add_special_tokens": False, "return_token_strs": True,
    "tokens": [4, 5], "text": "hello", "sampling_params": {"max_new_tokens": 7}, "max_new_tokens": 7,
    "min_new_tokens": 2, "sampling_seed": 3, "lora_path": "adapters/sql", "return_hidden_states": True,
    "priority": 5, "logprob_start_len": 0, "custom_logit_processor": '{"callable": "x"}',
    "session_params": {"id": "s1"}, "guided_whitespace_pattern": "[ ]?", "guided_decoding_backend": "outlines",
    "return_text_in_logprobs": True, "token_ids_logprob": [1], "rid": "r1", "bootstrap_host": "h",
    "bootstrap_port": 1, "bootstrap_room": 1, "data_parallel_rank": 0, "custom_params": {"a": 1},
    "log_metrics": True, "background": True, "no_logs": True, "return_bytes": True, "return_entropy": True,
    "stream_interval": 2, "embed": True, ("model", "/generate"): "another-model",
    ("structured_outputs", "refused"): {"structural_tag": {"type": "x"}},
    ("prompt_logprobs", "/generate"): 1,
    ("tools", "/v1/responses"): [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    ("tool_choice", "/v1/responses"): "required", ("tool_choice", "/v1/messages"): {"type": "any"},
    ("tools", "/v1/messages"): [{"name": "f", "input_schema": {"type": "object"}}],
    "input": "hello", "instructions": "Be brief.", "max_output_tokens": 7, ("text", "/v1/responses"): {
        "format": {"type": "json_schema", "name": "s", "schema": SCHEMA}},
    "metadata": {"k": "v"}, ("metadata", "/v1/messages"): {"user_id": "u"}, ("store", "ignored"): False,
    ("store", "refused"): True, ("background", "/v1/responses", "refused"): True,
    ("background", "/v1/responses", "ignored"): False, "previous_response_id": "resp_1", "conversation": "c1",
    ("prompt", "/v1/responses"): {"id": "pmpt_1"}, "include": ["reasoning.encrypted_content"],
    "truncation": "auto", "system": "Be brief.", "stop_sequences": ["x"],
    "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}, "thinking": {"type": "disabled"},
    ("thinking", "ignored"): {"type": "enabled", "budget_tokens": 4096},
    ("input", "/v1/embeddings"): ["hello", "there"], "encoding_format": "base64", "dimensions": 4,
    "truncate_prompt_tokens": 8,
}
# what the body without the field still holds, for a field that only means something next to others
NEEDS: dict = {
    "stream_options": {"stream": True}, "top_logprobs": {"logprobs": True}, ("top_logprobs", "/generate"): {
        "return_logprob": True}, "top_logprobs_num": {"return_logprob": True}, "tool_choice": {"tools": [TOOL]},
    "parallel_tool_calls": {"tools": [TOOL], "tool_choice": "required"}, "continue_final_message": {
        "messages": CONTINUED}, "grammar_after": {"regex": "a+"}, "stream_reasoning": {"stream": True},
    ("tool_choice", "/v1/responses"): {"tools": VALUES[("tools", "/v1/responses")]},
    ("parallel_tool_calls", "/v1/responses"): {"tools": VALUES[("tools", "/v1/responses")],
                                               "tool_choice": "required"},
    ("tool_choice", "/v1/messages"): {"tools": VALUES[("tools", "/v1/messages")]},
    ("thinking", "ignored"): {"thinking": {"type": "enabled", "budget_tokens": 1024}},
    "echo": {"logprobs": 1},
}
# names in the table that are not fields of their row's routes: content and tool kinds, values of another field
NAMES_WITHOUT_A_FIELD = {"web_search", "file_search", "web_search_", "image", "document", "auto", "xgrammar"}
NOT_A_FIELD_HERE = {("json_schema", "/v1/messages")}  # output_config.format's type
# fields inside another field: name -> (the field that carries it, its value with the name set, without it)
NESTED = {"disable_parallel_tool_use": ("tool_choice", {"type": "any", "disable_parallel_tool_use": True},
                                        {"type": "any"})}


def lookup(table: dict, name: str, route: str, verdict: str, default=None):
    for key in ((name, route, verdict), (name, verdict), (name, route), name):
        if key in table:
            return table[key]
    return default


def request_of(name: str, route: str) -> tuple[str, dict]:
    """(path, base body) for sending `name` on `route`."""
    if route in PATHS:
        return PATHS[route], BASES[route]
    if route == "/generate" and name in SGLANG_SHAPED:
        return route, BASES["/generate sglang"]
    if route == "/tokenize" and name in ("tools", "add_generation_prompt", "chat_template", "chat_template_kwargs",
                                         "continue_final_message"):
        return route, BASES["/tokenize messages"]
    return route, BASES[route]


PROMPT_FIELDS = ("messages", "prompt", "input_ids", "text", "input")


def put(body: dict, name: str, value) -> dict:
    """`body` with `name` set to `value` (inside sampling_params where SGLang keeps it; a prompt replacing the
    body's prompt in whatever spelling)."""
    body = json.loads(json.dumps(body))
    if "sampling_params" in body and name in IN_SAMPLING_PARAMS:
        body["sampling_params"][name] = value
        return body
    if name in PROMPT_FIELDS and not isinstance(value, dict):
        kept = {k: body.pop(k) for k in PROMPT_FIELDS if k in body}
        if "text" in kept and name != "text":  # SGLang's shape stays SGLang's
            body["text"] = kept["text"]
    body[name] = value
    return body


def post(path: str, body: dict, state_options: dict) -> tuple[int, str, list]:
    client = RecordingClient(pieces=["a", " b", "</think>c", " d"])  # Qwen3 thinks from the start, in two deltas
    health = HealthMonitor(client)
    health.state = "ready"
    gate = GatePolicy.build("127.0.0.1", "", "", "", 1 << 20)
    state = HttpState(client, "tiny", "/models/tiny", 512, ServerMetrics("tiny"), health, gate, **state_options)
    status, _, raw = call_app(build_app(state), "POST", path, body)
    text = re.sub(r'"(id|created|created_at|system_fingerprint)": ?("[^"]*"|\d+)', "", raw.decode())
    text = re.sub(r"(chatcmpl|cmpl|resp|msg|fc|call|toolu|rs)_[0-9a-zA-Z]+", "ID", text)
    return status, text, [{k: v for k, v in s.items() if k != "req_id"} for s in client.submitted]


def observed_verdict(name: str, route: str, verdict: str) -> tuple[str, str]:
    path, base = request_of(name, route)
    for need, need_value in lookup(NEEDS, name, route, verdict, {}).items():
        base = put(base, need, need_value)
    if name in NESTED:
        carrier, value, without_value = NESTED[name]
        base = {**put(base, "tools", VALUES[("tools", route)]), carrier: without_value}
        name_sent = carrier
    else:
        value, name_sent = lookup(VALUES, name, route, verdict), name
    assert value is not None, f"no value to send for {name} on {route}"
    options = {"reasoning_parser": ReasoningParser("qwen3"), "tool_parser": ToolCallParser("hermes")}
    if route == "/v1/embeddings":
        options = {"embedding_size": 4}
    s1, with_, sent1 = post(path, put(base, name_sent, value), options)
    s0, without, sent0 = post(path, base, options)
    assert s0 == 200, f"{route} without {name}: {s0} {without[:300]}"
    if 400 <= s1 < 500:
        return ("refused" if name in with_ else "refused without naming it"), with_
    assert s1 == 200, f"{route} with {name}={value!r}: {s1} {with_[:300]}"
    if sent1 == sent0 and (with_ == without or _echoes(with_, value)):
        return "ignored", with_  # nothing asked of the server changed; the answer at most echoes the value back
    return "honoured", with_


def _echoes(answer: str, value) -> bool:
    """Whether `answer` holds `value` (an object or a string) as JSON: echoed back, as the Responses API's metadata
    and user are."""
    return isinstance(value, (dict, str)) and json.dumps(value, separators=(",", ":")) in answer


# honoured fields whose meaning is a check rather than a change: a wrong value is refused, the right one accepted
CHECKS = {
    "model": lambda route: request_of("model", route),
    "best_of": lambda route: request_of("best_of", route),
    "dimensions": lambda route: request_of("dimensions", route),
}


def check_probe(name: str, route: str) -> None:
    path, base = request_of(name, route)
    options = {"embedding_size": 4} if route == "/v1/embeddings" else {}
    good = {"model": "tiny", "best_of": 1, "dimensions": 4}[name]
    bad = {"model": "other-model", "best_of": 3, "dimensions": 8}[name]
    status, text, _ = post(path, put(base, name, good), options)
    assert status == 200, (name, route, text[:300])
    status, text, _ = post(path, put(base, name, bad), options)
    assert 400 <= status < 500 and (name in text or "other-model" in text), (name, route, status, text[:300])


def verdict_cases() -> list[tuple[str, str, str]]:
    cases = []
    for names, routes, verdict in table_rows():
        for name in sorted(names - NAMES_WITHOUT_A_FIELD):
            cases += [(name, route, verdict) for route in sorted(routes) if (name, route) not in NOT_A_FIELD_HERE]
    return cases


@pytest.mark.parametrize("name, route, verdict", verdict_cases())
def test_each_field_s_verdict_holds_when_it_is_sent(name, route, verdict):
    if name in CHECKS and verdict == "honoured":
        check_probe(name, route)
        return
    seen, answer = observed_verdict(name, route, verdict)
    assert seen == verdict, f"{name} on {route}: the table says {verdict}, sending it shows {seen}: {answer[:300]}"
