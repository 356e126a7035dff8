"""A fleet of 2 replicas (1 core each here) behind sglang-router, shared by a module's tests."""

from __future__ import annotations

import pytest

from testing.fleet_harness import FleetHarness

ROUTER_MISSING = "sglang-router is not installed (pip install -e '.[test,router]')"


@pytest.fixture(scope="module")
def fleet(model_dir):
    harness = FleetHarness.start(model_dir, num_replicas=2)
    try:
        yield harness
    finally:
        harness.kill()
