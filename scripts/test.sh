#!/usr/bin/env bash
# The README's test command: set up (idempotent), fetch the demo model (idempotent), run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/zserve-fetch-demo
exec .venv/bin/python -m pytest -q -ra "$@"
