"""Unit tests of the frontend's bookkeeping and the launcher's CLI (no processes)."""

from dataclasses import fields

import pytest

from zserve.common.server_config import ServerConfig
from zserve.launcher.cli import build_parser, parse_config
from zserve.tokenizer_proc.client_registry import ClientRegistry


def test_registry_routes_each_request_to_its_owner_and_forgets_finished():
    reg = ClientRegistry(client_timeout_s=5.0)
    reg.add_request("a", b"id-a", 1, now_s=0.0)
    reg.add_request("b", b"id-b", 2, now_s=0.0)
    reg.add_request("a", b"id-a", 3, now_s=0.0)
    assert reg.identity_of(1) == b"id-a" and reg.identity_of(2) == b"id-b"
    assert reg.owns("a", 3) and not reg.owns("b", 3)
    reg.finish(1)
    assert reg.identity_of(1) is None and reg.num_in_flight == 2
    reg.finish(3)
    assert "a" not in reg.clients  # no state left for a client with nothing in flight
    reg.finish(3)  # twice is harmless


def test_registry_names_the_first_id_in_flight_and_whose_it_is():
    reg = ClientRegistry(client_timeout_s=5.0)
    for req_id in (10, 11):  # a's n=2 request
        reg.add_request("a", b"id-a", req_id, now_s=0.0)
    assert reg.clash_error("b", range(12, 14)) is None and reg.clash_error("b", range(8, 10)) is None
    assert reg.clash_error("b", range(9, 12)).startswith(
        "req_id 10 is already in flight for another client's request"
    ) and "(req_ids 9 .. 11 (n=3))" in reg.clash_error("b", range(9, 12))
    assert reg.clash_error("a", range(11, 12)).startswith("req_id 11 is already in flight on this client")
    assert "(req_id 11)" in reg.clash_error("a", range(11, 12))


def test_silent_client_requests_are_reported_once():
    reg = ClientRegistry(client_timeout_s=5.0)
    reg.add_request("a", b"id-a", 1, now_s=0.0)
    reg.add_request("b", b"id-b", 2, now_s=0.0)
    reg.heard_from("b", now_s=4.0)
    assert reg.silent_requests(now_s=6.0) == [1]
    assert reg.silent_requests(now_s=7.0) == []  # already reported
    assert reg.silent_requests(now_s=9.5) == [2]


def test_cli_flags_cover_every_config_field_with_its_default():
    parser = build_parser()
    dests = {a.dest for a in parser._actions}
    for f in fields(ServerConfig):
        assert f.name in dests, f.name
    cfg = parse_config([])
    assert cfg == ServerConfig()


def test_cli_parses_values_and_rejects_bad_choices():
    cfg = parse_config(["--page-size", "4", "--step-policy", "mixed", "--disable-radix-cache", "--model", "/m"])
    assert (cfg.page_size, cfg.schedule_policy, cfg.disable_radix_cache, cfg.model) == (4, "mixed", True, "/m")
    with pytest.raises(SystemExit):
        parse_config(["--step-policy", "random"])


def test_config_json_round_trip_is_exact():
    cfg = ServerConfig(model="/x", zmq_port=123, kv_memory_fraction=0.5, disable_radix_cache=True)
    assert ServerConfig.from_json(cfg.to_json()) == cfg
