#!/usr/bin/env bash
# Data-parallel replicas on this machine behind sglang-router: the common case of
# `launch_server --dp-size N` (launcher/fleet/): one endpoint, the router on PORT.
#
#   MODEL=/path/to/hf-model-dir DP=2 bash scripts/launch_router.sh [more launch_server flags]
#
#   MODEL        model directory or .gguf (unset = the demo model, fetched once for every replica)
#   DP           replicas (default: one per NUMA node; each gets its own cores: the allowed CPUs split evenly)
#   PORT         where clients send requests: the router (default 8000; the replicas take free loopback
#                ports); ZMQ_PORT the first Python-client port (default 0: each replica picks a free one)
#   POLICY       cache_aware (default), round_robin, random or power_of_two
#   WORKERS      more servers on other machines for the router, space-separated URLs (http://host:port)
#
# sglang-router is an extra: pip install -e '.[router]' (scripts/setup.sh installs it).
# Ctrl-C or SIGTERM drains every replica, then stops the router.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ZSERVE_VENV:-.venv}
read -r -a workers <<<"${WORKERS:-}"
exec "$VENV/bin/launch_server" ${MODEL:+--model "$MODEL"} --dp-size "${DP:-0}" --router \
    --port "${PORT:-8000}" --zmq-port "${ZMQ_PORT:-0}" \
    --router-policy "${POLICY:-cache_aware}" ${workers[@]:+--router-worker-urls "${workers[@]}"} "$@"
