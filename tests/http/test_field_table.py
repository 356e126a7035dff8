"""The README's request-field table covers every field each route declares: a field added to a request model,
to the native /generate keywords or to SGLang's shape without a row saying whether it is honoured, refused or
ignored (and why) fails here."""

from __future__ import annotations

import re

import pytest

from testing.paths import REPO_ROOT
from zserve.common.sampling_params import SamplingParams
from zserve.http_proc.apis.anthropic.protocol import MessagesRequest
from zserve.http_proc.apis.openai.embeddings_route import EmbeddingRequest
from zserve.http_proc.apis.openai.protocol import ChatCompletionRequest, CompletionRequest
from zserve.http_proc.apis.openai.tokenize_route import DetokenizeRequest, TokenizeRequest
from zserve.http_proc.apis.responses.protocol import ResponsesRequest
from zserve.http_proc.apis.sglang import protocol as sglang_protocol
from zserve.http_proc.shared.refused_fields import REFUSED_UNLESS_DEFAULT
from zserve.http_proc.shared.unknown_fields import SGLANG_IGNORED_FIELDS
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
