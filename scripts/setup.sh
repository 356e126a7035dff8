#!/usr/bin/env bash
# Installs zserve and everything it needs into ./.venv on a fresh machine.
# torch is pinned first where none is present: an unpinned torch (asked for directly or by
# transformers) would pull gigabytes of CUDA wheels on a CPU-only machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${ZSERVE_VENV:-.venv}
TORCH_VERSION=${ZSERVE_TORCH_VERSION:-2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating virtual environment $VENV"
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
    echo "[setup] installing torch==$TORCH_VERSION first"
    "$VPY" -m pip install -q "torch==$TORCH_VERSION"
fi
# Skip the (slow) pip resolve when pyproject.toml has not changed since the last install here.
stamp="$VENV/.zserve-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && "$VPY" -m pip show zserve >/dev/null 2>&1; then
    echo "[setup] zserve already installed for this pyproject.toml"
else
    echo "[setup] installing zserve (editable) with the test and router extras"
    # router: sglang-router, for `launch_server --router` and tests/fleet (prebuilt wheels, no Rust toolchain needed)
    "$VPY" -m pip install -q -e ".[test,router]"
    echo "$want" >"$stamp"
fi
# The CPU kernels (paged attention, the 16-bit GEMMs, fused ops) for this CPU's instruction set
# (model_proc/kernels/cpu_isa.py: every feature of avx2, avx512, avx512_vnni, avx_vnni, avx512_bf16 it has;
# ZSERVE_CPU_ISA forces a smaller set), compiled once here (about a minute on 2 cores) so a server starts without
# compiling; cached in ~/.cache/zserve/kernels by feature set, source, flags, torch version and CPU. A machine where they do not
# build still works: attention falls back to the pure-torch path, linear layers to oneDNN.
if ! "$VPY" -m zserve.model_proc.kernels.cpu_kernels; then
    echo "[setup] the CPU kernels did not build; attention will use the pure-torch path, linear layers oneDNN (fp32) or torch.mm"
fi
echo "[setup] done: $VENV/bin/python"
