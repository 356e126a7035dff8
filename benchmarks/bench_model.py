"""Our forward vs transformers' forward on the same weights, same machine, same run.

    .venv/bin/python benchmarks/bench_model.py [--model DIR] [--threads N] [--repeats R] [--dtype float32,bfloat16]
                                               [--quantization int8]

Cases: one decode step at batch 1, 8, 32 and 64 with 256 tokens of context per request, and a
512-token prefill. Each line prints both times and ours/transformers (< 1 is faster), and the
bound measured in the same run, timed alternately with our step (other processes' load then
slows both alike):

  * batch-1 decode: the memory bound, weight bytes / bandwidth, the bandwidth measured by a
    1 GiB tensor copy;
  * other cases: the GEMM bound, the time of matmuls in the compute dtype with the step's linear
    FLOPs and weight bytes: [tokens, hidden] @ [hidden, N], N = (weights of every layer's linear
    layers) / hidden, plus [sampled rows, hidden] @ the LM head. Attention's FLOPs (~6% of a
    batch-64 decode step at 256 tokens of context, ~8% of a 512-token prefill for SmolLM2) are
    left out, so the bound is a little optimistic.

K/V contents do not change the cost of a step, so both sides get 256 tokens of random context
instead of a real prefill (which would take minutes). `--dtype` takes one dtype or several
(comma-separated): each runs ours and transformers in that dtype, in turn, in the same process;
with two, a last table gives our bfloat16 / float32 time per case.

`--quantization int8` (or `gguf`, with `--model X.gguf`: the file's 4-bit and other quantized
blocks kept as stored, against the same file dequantized to the dtype) adds, for each dtype, our runner with int8 weights (--quantization int8),
timed in turn with the plain one in the same loop (ours, ours int8, transformers, bound): its
column `int8_ms`, and `int8/ours` the ratio of the two (< 1: int8 is faster). The weight bytes
of both are printed.

Everything runs in one process started with the model worker's environment
(common/worker_env.py: thread count, OpenMP wait policy, malloc thresholds; the script
re-executes itself with it), so both sides share threads, allocator and machine state.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from zserve.common.weight_formats import QUANTIZATION_CHOICES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine_info import load_average  # noqa: E402
from testing.model_fixtures import make_runner  # noqa: E402
from zserve.common.forward_batch import ForwardBatch, SamplingArrays  # noqa: E402
from zserve.common.worker_env import worker_env  # noqa: E402
from zserve.model_proc.compute_dtype import DTYPES  # noqa: E402
from zserve.model_proc.layers.gemm import GemmWeight, gemm_weight_bytes  # noqa: E402

DECODE_BATCH_SIZES = (1, 8, 32, 64)
CONTEXT_LEN = 256
PREFILL_LEN = 512
PAGE_SIZE = 16


def log(msg: str) -> None:
    print(f"[bench_model] {msg}", file=sys.stderr, flush=True)


def timed_alternately(fns, repeats: int, warmup: int = 2) -> list[float]:
    """Median wall times (ms) of each of fns(), run in turn so that load from other processes on
    the machine falls on all alike."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class CopyBandwidth:
    """Bytes moved (read + written) per second by a large tensor copy."""

    def __init__(self, num_bytes: int = 1 << 30):
        self.num_bytes = num_bytes
        self.src = torch.ones(num_bytes // 4, dtype=torch.float32)
        self.dst = torch.empty_like(self.src)

    def copy(self) -> None:
        self.dst.copy_(self.src)

    def gbs(self, copy_ms: float) -> float:
        return 2 * self.num_bytes / (copy_ms / 1e3) / 1e9


class GemmBound:
    """Matmuls with a step's linear FLOPs and weight bytes, in the compute dtype and through the
    same GEMM as the model's layers (the runner's gemm_backend, model_proc/layers/gemm.py)."""

    def __init__(self, runner, dtype: torch.dtype):
        from zserve.model_proc.layers.linear import ColumnParallelLinear, RowParallelLinear

        cfg = runner.config
        layers = [m for m in runner.model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
        layer_weights = sum(m.weight_shape[0] * m.weight_shape[1] for m in layers)
        self.hidden, self.vocab, self.dtype = cfg.hidden_size, cfg.vocab_size, dtype
        kernel = runner.weight_kernel
        self.layers_w = self._weight(self.hidden, layer_weights // self.hidden, kernel)  # [hidden, N]
        self.head_w = self._weight(self.hidden, self.vocab, kernel)

    def _weight(self, rows: int, cols: int, kernel) -> GemmWeight:
        weight = GemmWeight()
        weight.init_weight(rows, cols)
        weight.weight.data = torch.randn(rows, cols).to(self.dtype)
        weight.pack(kernel)
        return weight

    def flops(self, num_tokens: int, num_sampled: int) -> float:
        return 2.0 * self.hidden * (num_tokens * self.layers_w.weight_shape[1] + num_sampled * self.vocab)

    def fn(self, num_tokens: int, num_sampled: int):
        x = torch.randn(num_tokens, self.hidden).to(self.dtype)

        def step():
            self.layers_w.matmul(x, None)
            return self.head_w.matmul(x[:num_sampled], None)

        return step


PROBED = ("fma", "vdpbf16ps", "vpdpbusd", "vpmaddubsw")
PROBE_ITERATIONS = 5_000_000


class InstructionPeaks:
    """The clock and each GEMM instruction's rate, measured on every thread at once (under load)
    by kernels/cpu_probe.cpp for this process's feature set, and which instruction a kernel multiplies
    with at a row count: the peak a GEMM's rate is compared with. oneDNN's AMX tiles (the many-row
    half of the row-split kernels on a CPU with AMX) are not measured: those cases say so."""

    def __init__(self) -> None:
        from zserve.common.isa_features import cpu_flags
        from zserve.model_proc.kernels.cpu_kernels import load_cpu_kernels

        self.rates = {}
        if load_cpu_kernels():
            self.clock_ghz = torch.ops.zserve.probe_rate("clock", 4 * PROBE_ITERATIONS) / 1e9
            self.rates = {name: torch.ops.zserve.probe_rate(name, PROBE_ITERATIONS) / 1e9 for name in PROBED}
        self.amx = "amx_bf16" in cpu_flags()

    def describe(self) -> str:
        if not self.rates:
            return "peaks not measured (no CPU kernels)"
        rates = ", ".join(f"{name.upper()} {rate:.0f}" for name, rate in self.rates.items() if rate > 0)
        return f"measured peaks {rates} GOP/s at {self.clock_ghz:.2f} GHz under load"

    def instruction(self, kernel, rows: int) -> str:
        """What `kernel` (a runner's weight kernel) multiplies `rows` rows with."""
        name = kernel.name
        if name.endswith("+onednn") and rows >= kernel.min_onednn_rows or name == "onednn":
            return "amx" if self.amx else "vdpbf16ps" if self.rates.get("vdpbf16ps") else "fma"
        if name.startswith("zserve_bf16"):
            return "vdpbf16ps"
        if name.startswith("zserve_int8_dot"):
            return "vpdpbusd" if self.rates.get("vpdpbusd") else "vpmaddubsw"
        return "fma"

    def share(self, gflops: float, kernel, rows: int) -> str:
        instruction = self.instruction(kernel, rows)
        peak = self.rates.get(instruction, 0.0)
        if not peak:
            return f"{instruction.upper()}: peak not measured"
        return f"{gflops / peak:.0%} of the {instruction.upper()} peak"


def decode_batch(batch_size: int, context_len: int, step_id: int) -> ForwardBatch:
    """batch_size requests, each with context_len tokens cached, decoding one token."""
    pages_per_req = -(-(context_len + 1) // PAGE_SIZE)
    n = batch_size
    return ForwardBatch(
        step_id=step_id,
        input_ids=np.full(n, 42, np.int32),
        cached_lens=np.full(n, context_len, np.int32),
        extend_lens=np.ones(n, np.int32),
        page_ids=np.arange(n * pages_per_req, dtype=np.int32),
        num_pages=np.full(n, pages_per_req, np.int32),
        is_sampled=np.ones(n, bool),
        return_logprob=np.zeros(n, bool),
        sampling=SamplingArrays.greedy(n),
    )


def prefill_batch(prompt_len: int, step_id: int, vocab_size: int = 1000) -> ForwardBatch:
    """One new prompt of random token ids in [3, min(vocab_size, 1000))."""
    num_pages = -(-prompt_len // PAGE_SIZE)
    return ForwardBatch(
        step_id=step_id,
        input_ids=np.random.default_rng(0).integers(3, min(vocab_size, 1000), prompt_len).astype(np.int32),
        cached_lens=np.zeros(1, np.int32),
        extend_lens=np.array([prompt_len], np.int32),
        page_ids=np.arange(num_pages, dtype=np.int32),
        num_pages=np.array([num_pages], np.int32),
        is_sampled=np.ones(1, bool),
        return_logprob=np.zeros(1, bool),
        sampling=SamplingArrays.greedy(1),
    )


class HfSide:
    def __init__(self, model_dir: str, dtype: torch.dtype):
        from transformers import AutoModelForCausalLM

        from zserve.common.gguf_source import gguf_source

        gguf_file = gguf_source(model_dir)
        if gguf_file is not None:  # transformers' GGUF loader: dequantized, in `dtype`
            from zserve.launcher.demo_model import _load_gguf_model

            self.model = _load_gguf_model(gguf_file).to(dtype).eval()
        else:
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        self.config, self.dtype = self.model.config, dtype

    @torch.inference_mode()
    def decode_fn(self, batch_size: int, context_len: int):
        from transformers import DynamicCache

        cfg = self.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (batch_size, cfg.num_key_value_heads, context_len, head_dim)
        cache = DynamicCache(config=cfg)
        for layer_idx in range(cfg.num_hidden_layers):  # the context, as transformers' cache holds it
            cache.update(torch.randn(shape).to(self.dtype), torch.randn(shape).to(self.dtype), layer_idx)
        ids = torch.full((batch_size, 1), 42, dtype=torch.long)
        positions = torch.full((batch_size, 1), context_len, dtype=torch.long)

        @torch.inference_mode()
        def step():
            logits = self.model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True).logits
            cache.crop(-1)  # drop the token just appended (a view), so every step sees context_len tokens
            return logits[:, -1].argmax(-1)

        return step

    def prefill_fn(self, prompt_len: int):
        ids = torch.from_numpy(prefill_batch(prompt_len, 0).input_ids.astype(np.int64))[None]

        @torch.inference_mode()
        def step():
            return self.model(input_ids=ids, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1)

        return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None,
                        help="model directory or .gguf file (default: the demo model, SmolLM2-135M-Instruct)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for both sides (0 = the worker's default)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch-sizes", default=",".join(map(str, DECODE_BATCH_SIZES)), help="decode cases, comma-separated")
    parser.add_argument("--no-prefill", action="store_true", help="skip the prefill case")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, or both comma-separated (each in turn, same process)")
    parser.add_argument("--quantization", default="none", choices=QUANTIZATION_CHOICES,
                        help="int8 (or gguf, for a .gguf model: its blocks as stored): also time our runner so, interleaved")
    args = parser.parse_args()
    dtypes = [d for d in args.dtype.split(",") if d]
    if not dtypes or set(dtypes) - set(DTYPES):
        parser.error(f"--dtype: one or more of {', '.join(DTYPES)}, comma-separated")
    if "ZSERVE_NUM_THREADS" not in os.environ:  # run under the worker's environment (read at process start)
        env = {**os.environ, **worker_env(args.threads, "cpu")}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    model_dir = args.model
    if model_dir is None:
        from zserve.launcher.demo_model import demo_model_dir

        model_dir = str(demo_model_dir())
        if not Path(model_dir).is_dir():
            sys.exit(f"demo model not found at {model_dir}: run .venv/bin/zserve-fetch-demo, or pass --model DIR")
    if model_dir.endswith(".gguf"):  # the directory the launcher makes of it: its weights stay in the file
        from zserve.launcher.gguf_model_dir import gguf_model_dir

        model_dir = str(gguf_model_dir(Path(model_dir), with_tokenizer=False))
    num_threads = int(os.environ["ZSERVE_NUM_THREADS"])
    torch.set_num_threads(num_threads)
    batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x]
    print(f"model {model_dir}, torch {torch.__version__}, {num_threads} thread(s), load average {load_average()}")
    ours_ms = {dtype: bench_dtype(model_dir, DTYPES[dtype], batch_sizes, args, num_threads) for dtype in dtypes}
    if len(dtypes) > 1:
        base, other = dtypes[0], dtypes[1]
        print(f"\nours, {other} / {base}")
        for case, ms in ours_ms[base].items():
            print(f"{case:<22}{ours_ms[other][case] / ms:>8.2f}")
    print(f"load average at the end {load_average()}")


def bench_dtype(model_dir: str, dtype: torch.dtype, batch_sizes: list[int], args, num_threads: int) -> dict[str, float]:
    """Every case in `dtype`; prints its table, returns our ms per case."""
    pages_per_req = -(-(CONTEXT_LEN + 1) // PAGE_SIZE)
    max_tokens = max(max([1, *batch_sizes]) * pages_per_req * PAGE_SIZE, PREFILL_LEN)
    log(f"{dtype}: loading {model_dir} (ours, then transformers), {num_threads} thread(s)")
    ours = make_runner(model_dir, device="cpu", dtype=dtype, page_size=PAGE_SIZE, kv_cache_tokens=max_tokens, num_threads=num_threads)
    quantized = None
    if args.quantization != "none":
        quantized = make_runner(model_dir, device="cpu", dtype=dtype, page_size=PAGE_SIZE, kv_cache_tokens=max_tokens,
                                num_threads=num_threads, quantization=args.quantization)
    hf = HfSide(model_dir, dtype)
    gemm = GemmBound(ours, dtype)
    copier = CopyBandwidth()
    weight_bytes = gemm_weight_bytes(ours.model, dtype)  # read once per decode step (norms and the few embedding rows left out)
    for k in ours.kv_pool.k + ours.kv_pool.v + (quantized.kv_pool.k + quantized.kv_pool.v if quantized else []):  # random context, as on the transformers side
        k.normal_()

    peaks = InstructionPeaks()
    print(f"\n{dtype}: {weight_bytes / 1e6:.0f} MB of weights, {ours.gemm_backend} GEMM; {peaks.describe()}; "
          f"load average {load_average()}")
    q_cols = ""
    if quantized is not None:
        print(f"{dtype} + {args.quantization}: {gemm_weight_bytes(quantized.model, dtype) / 1e6:.0f} MB of weights, {quantized.gemm_backend} GEMM")
        q_cols = f"{'int8_ms':>10}{'int8/ours':>10}"
    print(f"{'case':<22}{'ours_ms':>10}{'hf_ms':>10}{'ratio':>8}{'bound_ms':>10}{'ours/bound':>11}{q_cols}  bound")
    results: dict[str, float] = {}
    num_cases = len(batch_sizes) + (not args.no_prefill)
    for i, batch_size in enumerate(batch_sizes):
        log(f"{dtype}: decode batch {batch_size} ({i + 1}/{num_cases})")
        batch = decode_batch(batch_size, CONTEXT_LEN, step_id=i)
        bound_fn = copier.copy if batch_size == 1 else gemm.fn(batch_size, batch_size)
        fns = [lambda b=batch: ours.run(b), hf.decode_fn(batch_size, CONTEXT_LEN), bound_fn]
        if quantized is not None:
            fns.append(lambda b=batch: quantized.run(b))
        ours_ms, hf_ms, bound_fn_ms, *int8_ms = timed_alternately(fns, args.repeats)
        if batch_size == 1:
            bandwidth = copier.gbs(bound_fn_ms)
            bound_ms, what = weight_bytes / (bandwidth * 1e9) * 1e3, f"weights / copy bandwidth {bandwidth:.1f} GB/s"
        else:
            rate = gemm.flops(batch_size, batch_size) / bound_fn_ms / 1e6
            bound_ms = bound_fn_ms
            what = (f"GEMM at {rate:.0f} GFLOP/s ({peaks.share(rate, ours.weight_kernel, batch_size)}); the step's linear FLOPs at "
                    f"{gemm.flops(batch_size, batch_size) / ours_ms / 1e6:.0f} GFLOP/s")
        case = f"decode_bs{batch_size}_ctx{CONTEXT_LEN}"
        q_cols = f"{int8_ms[0]:>10.2f}{int8_ms[0] / ours_ms:>10.2f}" if int8_ms else ""
        print(f"{case:<22}{ours_ms:>10.2f}{hf_ms:>10.2f}{ours_ms / hf_ms:>8.2f}{bound_ms:>10.2f}{ours_ms / bound_ms:>11.2f}{q_cols}  {what}", flush=True)
        results[case] = ours_ms

    if not args.no_prefill:
        log(f"{dtype}: prefill {PREFILL_LEN} tokens ({num_cases}/{num_cases})")
        batch = prefill_batch(PREFILL_LEN, step_id=100)
        repeats = max(3, args.repeats // 2)
        fns = [lambda: ours.run(batch), hf.prefill_fn(PREFILL_LEN), gemm.fn(PREFILL_LEN, 1)]
        if quantized is not None:
            fns.append(lambda: quantized.run(batch))
        ours_ms, hf_ms, bound_ms, *int8_ms = timed_alternately(fns, repeats, warmup=1)
        case = f"prefill_{PREFILL_LEN}"
        q_cols = f"{int8_ms[0]:>10.2f}{int8_ms[0] / ours_ms:>10.2f}" if int8_ms else ""
        print(
            f"{case:<22}{ours_ms:>10.2f}{hf_ms:>10.2f}{ours_ms / hf_ms:>8.2f}{bound_ms:>10.2f}{ours_ms / bound_ms:>11.2f}{q_cols}"
            f"  GEMM at {gemm.flops(PREFILL_LEN, 1) / bound_ms / 1e6:.0f} GFLOP/s"
            f" ({peaks.share(gemm.flops(PREFILL_LEN, 1) / bound_ms / 1e6, ours.weight_kernel, PREFILL_LEN)})"
            f" ({PREFILL_LEN / ours_ms * 1e3:.0f} vs {PREFILL_LEN / hf_ms * 1e3:.0f} tokens/s)",
            flush=True,
        )
        results[case] = ours_ms
    return results


if __name__ == "__main__":
    main()
