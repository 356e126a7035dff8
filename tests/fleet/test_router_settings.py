"""The router command line the fleet builds is one the installed sglang-router parses as meant."""

from __future__ import annotations

import pytest

from tests.fleet.conftest import ROUTER_MISSING
from zserve.launcher.fleet.router import RouterSettings

launch_router = pytest.importorskip("sglang_router.launch_router", reason=ROUTER_MISSING)


def test_router_argv_parses_with_the_fleets_settings_and_extra_args_win():
    settings = RouterSettings(
        host="127.0.0.1", port=30000, policy="round_robin", worker_urls=("http://127.0.0.1:8000", "http://10.0.0.2:8000"),
        prometheus_port=29001, log_level="info", extra_args="--health-check-interval-secs 1 --retry-max-retries 2",
    )
    argv = settings.argv()
    assert argv[1:3] == ["-m", "zserve.launcher.fleet.router_main"]  # sglang_router.launch_router, with the API key
    args = launch_router.parse_router_args(argv[3:])
    assert (args.host, args.port, args.policy, args.prometheus_port) == ("127.0.0.1", 30000, "round_robin", 29001)
    assert args.worker_urls == ["http://127.0.0.1:8000", "http://10.0.0.2:8000"]
    assert (args.health_check_interval_secs, args.retry_max_retries) == (1, 2)  # the extra args came last
    assert args.log_level == "warn"  # at info it logs two lines per request
