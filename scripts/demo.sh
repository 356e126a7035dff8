#!/usr/bin/env bash
# The README's first command: install, fetch the demo model, start the server, ask it one
# question through the Python client, then keep serving in the foreground (Ctrl-C stops it).
# Extra arguments go to launch_server (e.g. --port 30000 for HTTP there, --zmq-port N for the Python client's).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/zserve-fetch-demo
log=$(mktemp -t zserve-demo.XXXXXX)
.venv/bin/launch_server "$@" >"$log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 600); do
    if ! kill -0 $server 2>/dev/null; then cat "$log"; echo "launch_server exited" >&2; exit 1; fi
    port=$(sed -n 's/.*clients connect to tcp:\/\/[0-9.]*:\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$port" ] && break
    sleep 0.5
done
[ -n "$port" ] || { cat "$log"; echo "server not ready" >&2; exit 1; }
grep "zserve ready" "$log"
.venv/bin/python - "$port" <<'PY'
import sys
from zserve import Client

with Client(int(sys.argv[1])) as c:
    q = "What is the capital of France?"
    r = c.generate(messages=[{"role": "user", "content": q}], max_tokens=32)
    print(f"Q: {q}\nA: {r.text}\n({r.usage.completion_tokens} tokens, finish={r.finish_reason}, ttft={r.ttft_s*1000:.0f} ms, total={r.latency_s*1000:.0f} ms)")
PY
if [ "${ZSERVE_DEMO_ONESHOT:-0}" = 1 ]; then exit 0; fi  # tests: stop after the answer
echo "Server running on port $port (chat with: .venv/bin/python -m zserve.client --zmq-port $port). Ctrl-C stops it."
tail -n +1 -f "$log" --pid=$server
