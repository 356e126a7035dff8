"""SGLang's fields that would change the answer but are not honoured here are a 400 naming the field, on every
route and --strict-requests or not; at their defaults (what sglang-router forwards) they are accepted."""

from __future__ import annotations

import json

import pytest

from testing.asgi_call import RecordingClient, call_app
from zserve.http_proc.http_app import build_app
from zserve.http_proc.shared.health_monitor import HealthMonitor
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.request_gate import GatePolicy
from zserve.http_proc.shared.server_metrics import ServerMetrics
from zserve.http_proc.shared.unknown_fields import UnknownFieldPolicy

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"prompt": "hi", "max_tokens": 4}
GENERATE = {"text": "hi", "sampling_params": {"max_new_tokens": 4}}
BODIES = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETION, "/generate": GENERATE}
REFUSED = [
    ("lora_path", "adapters/sql"),
    ("return_hidden_states", True),
    ("priority", 5),
    ("logprob_start_len", 0),
    ("custom_logit_processor", "{\"callable\": \"...\"}"),
    ("session_params", {"id": "s1"}),
    ("guided_whitespace_pattern", "[ ]?"),
    ("guided_decoding_backend", "outlines"),
]
DEFAULTS = [("lora_path", None), ("return_hidden_states", False), ("priority", 0), ("logprob_start_len", -1),
            ("custom_logit_processor", None), ("session_params", None)]


def post(body: dict, path: str, strict: bool = False) -> tuple[int, dict, RecordingClient]:
    client = RecordingClient(text="hello")
    health = HealthMonitor(client)
    health.state = "ready"
    gate = GatePolicy.build("127.0.0.1", "", "", "", 1 << 20)
    state = HttpState(client, "tiny", "/models/tiny", 512, ServerMetrics("tiny"), health, gate,
                      unknown_fields=UnknownFieldPolicy(strict=strict))
    status, _, raw = call_app(build_app(state), "POST", path, body)
    return status, json.loads(raw), client


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize(("name", "value"), REFUSED)
def test_a_field_asking_for_what_is_not_honoured_is_a_400_naming_it(path, name, value):
    for strict in (False, True):
        status, body, client = post({**BODIES[path], name: value}, path, strict)
        assert status == 400, body
        assert body["error"]["param"] == name and f"{name} is not supported" in body["error"]["message"]
        assert client.submitted == []  # nothing reached the server


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize(("name", "value"), DEFAULTS)
def test_the_same_field_at_its_default_is_accepted_also_under_strict(path, name, value):
    status, body, client = post({**BODIES[path], name: value}, path, strict=True)
    assert status == 200, body
    assert len(client.submitted) == 1 and name not in client.submitted[0]


def test_vllms_backend_field_naming_xgrammar_is_accepted():
    """Not SGLang's: a field this server does not declare, so ignored with the warning (a 400 under strict)."""
    status, body, client = post({**CHAT, "guided_decoding_backend": "xgrammar"}, "/v1/chat/completions")
    assert status == 200 and len(client.submitted) == 1, body


def test_a_default_of_the_wrong_type_is_refused():
    """`return_hidden_states: 1` asks for them as much as `true` does; `priority: false` is not SGLang's 0."""
    assert post({**CHAT, "return_hidden_states": 1}, "/v1/chat/completions")[0] == 400
    assert post({**CHAT, "priority": False}, "/v1/chat/completions")[0] == 400
