#!/usr/bin/env bash
# Is the server up? Waits (up to TIMEOUT_S, default 600) until the server whose ZMQ client port is PORT answers one
# greedy request through the Python client, prints the answer and the server's stats, exits 0;
# exits 1 if it never answers.
#
#   bash scripts/launch_check.sh 30001 [host]     # the server's --zmq-port (default 30001)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ZSERVE_VENV:-.venv}
PORT=${1:?usage: launch_check.sh PORT [HOST]}
HOST=${2:-127.0.0.1}
exec "$VENV/bin/python" - "$HOST" "$PORT" "${TIMEOUT_S:-600}" <<'PY'
import sys
import time

from zserve import Client, ServerGoneError

host, port, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout_s
while True:
    try:
        with Client(f"tcp://{host}:{port}", timeout_s=60, server_timeout_s=5) as c:
            r = c.generate("The capital of France is", max_tokens=8, temperature=0)
            stats = c.stats()
        break
    except (ServerGoneError, ConnectionError, OSError) as exc:
        if time.monotonic() > deadline:
            sys.exit(f"no answer from tcp://{host}:{port} within {timeout_s:.0f}s: {exc}")
        time.sleep(2)
print(f"server tcp://{host}:{port} is up: {r.text!r} ({r.usage.completion_tokens} tokens, ttft {r.ttft_s * 1000:.0f} ms)")
print(f"stats: {stats}")
PY
