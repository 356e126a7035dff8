"""--kv-cache-dtype's spellings: fp8 is fp8_e4m3 (vLLM's and SGLang's alias), stored as the canonical name."""

from __future__ import annotations

import pytest

from zserve.common.kernel_choices import KV_CACHE_DTYPES
from zserve.launcher.cli import parse_config


@pytest.mark.parametrize(("given", "stored"), [("fp8", "fp8_e4m3"), *((name, name) for name in KV_CACHE_DTYPES)])
def test_kv_cache_dtype_spellings(given, stored):
    assert parse_config(["--kv-cache-dtype", given]).kv_cache_dtype == stored
