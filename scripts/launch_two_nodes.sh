#!/usr/bin/env bash
# Two machines, tensor parallelism over the GPUs of both. Run it on each node, same MODEL
# (a local copy on each), same TP, same flags; only NODE_RANK differs:
#
#   node 0:  NODE_RANK=0 DIST_INIT_ADDR=10.0.0.1:29500 TP=16 MODEL=/models/m bash scripts/launch_two_nodes.sh
#   node 1:  NODE_RANK=1 DIST_INIT_ADDR=10.0.0.1:29500 TP=16 MODEL=/models/m bash scripts/launch_two_nodes.sh
#
#   DIST_INIT_ADDR  node 0's address as every node reaches it. Node 0 listens there on PORT
#                   (torch.distributed's rendezvous) and PORT + 1 (rank 0's batch broadcast):
#                   open both between the nodes, and nothing else.
#   NODE_RANK       0 runs the whole server (client port, scheduler, tokenizer, its TP / 2 ranks);
#                   1 runs only its TP / 2 model worker ranks, and exits when node 0 stops.
#   TP              ranks over both nodes (default 2 x the GPUs of this node); node n runs
#                   ranks n*TP/2 .. (n+1)*TP/2 - 1, local rank i on cuda:i
#   PORT            node 0's HTTP port (default 30000); ZMQ_PORT its Python client port (default 30001);
#                   add --host 0.0.0.0 for remote clients
#   GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME  the network interface between the nodes (e.g. eth0,
#                   ib0) when the default route is not it
#
# Then check it is up, on node 0:  bash scripts/launch_check.sh 30001
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ZSERVE_VENV:-.venv}
: "${NODE_RANK:?set NODE_RANK=0 on the first node, 1 on the second}"
: "${DIST_INIT_ADDR:?set DIST_INIT_ADDR=host:port of node 0, the same on both nodes}"
if [ -z "${TP:-}" ]; then
    per_node=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [ "${per_node:-0}" -ge 1 ] || per_node=1
    TP=$((2 * per_node))
fi
exec "$VENV/bin/launch_server" ${MODEL:+--model "$MODEL"} --tp-size "$TP" --nnodes 2 --node-rank "$NODE_RANK" \
    --dist-init-addr "$DIST_INIT_ADDR" --port "${PORT:-30000}" --zmq-port "${ZMQ_PORT:-30001}" "$@"
