"""One MoE layer's routed experts per step, stacked (zserve::moe_experts) against fused_experts.py's loop over
expert modules, in one process, interleaved, on the same file and routes (1, 8 and 128 rows, bf16):

    .venv/bin/python benchmarks/moe_experts_speed.py /tmp/moe30b-small/small-q4_k_m.gguf

(the file: make_shaped_gguf.py --config of a qwen3_moe with few layers and experts; both copies are held at once,
so not the 30B file on a 24 GB machine.)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testing.model_fixtures import make_runner  # noqa: E402
from zserve.launcher.gguf_model_dir import gguf_model_dir  # noqa: E402
from zserve.model_proc.layers import fused_experts  # noqa: E402
from zserve.model_proc.layers.sparse_moe import SparseMoeBlock  # noqa: E402


def main() -> None:
    model_dir = gguf_model_dir(Path(sys.argv[1]), with_tokenizer=False)
    options = {"page_size": 16, "kv_cache_tokens": 256, "device": "cpu", "quantization": "gguf"}
    stacked = make_runner(model_dir, **options)
    fused_experts.load_moe_experts = lambda: None  # the second copy through the loop
    loop = make_runner(model_dir, **options)
    paths = {name: [m for m in r.model.modules() if isinstance(m, SparseMoeBlock)]
             for name, r in (("stacked", stacked), ("loop", loop))}
    assert paths["stacked"][0].experts.stacked is not None and paths["loop"][0].experts.stacked is None
    for rows in (1, 8, 128):
        x = torch.randn(rows, paths["stacked"][0].gate.weight.shape[1]).to(stacked.dtype)
        routes = [b.gate(x) for b in paths["stacked"]]
        repeats = 20 if rows < 100 else 3
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(repeats):
            for name, blocks in paths.items():
                t = time.perf_counter()
                for block, (ids, weights) in zip(blocks, routes, strict=True):
                    block.experts(x, ids, weights)
                times[name].append((time.perf_counter() - t) / len(blocks) * 1e3)
        med = {name: sorted(v)[len(v) // 2] for name, v in times.items()}
        print(f"{rows} rows: ms per layer, median of {repeats}: stacked {med['stacked']:.3f}, loop {med['loop']:.3f} "
              f"(ratio {med['stacked'] / med['loop']:.3f})", flush=True)


if __name__ == "__main__":
    main()
