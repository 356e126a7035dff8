#!/usr/bin/env bash
# One machine, tensor parallelism over its GPUs (or over CPU processes where it has none).
#
#   MODEL=/path/to/hf-model-dir TP=4 bash scripts/launch_one_node.sh [more launch_server flags]
#
#   MODEL  Hugging Face model directory (config.json + safetensors + tokenizer); unset = the demo model,
#          whose 9 attention heads and 3 KV heads split over 1 or 3 ranks only: for 2, 4 or 8 GPUs name a
#          model that splits (e.g. Qwen3-0.6B, Llama-3.2-1B); otherwise the launcher refuses in one line, exit 2
#   TP     ranks = GPUs used (default: the GPUs in CUDA_VISIBLE_DEVICES, else all nvidia-smi lists, else 1);
#          local rank i runs on cuda:i, so CUDA_VISIBLE_DEVICES picks which GPUs
#   PORT   HTTP port (default 30000, SGLang's), on loopback unless you pass --host; ZMQ_PORT the Python client's
#          port (default 30001)
#
# Then check it is up from another shell:  bash scripts/launch_check.sh 30001
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ZSERVE_VENV:-.venv}
if [ -z "${TP:-}" ]; then
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        TP=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
    else
        TP=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    fi
    [ "${TP:-0}" -ge 1 ] || TP=1
fi
exec "$VENV/bin/launch_server" ${MODEL:+--model "$MODEL"} --tp-size "$TP" --port "${PORT:-30000}" --zmq-port "${ZMQ_PORT:-30001}" "$@"
