"""CudaGraphs: decode steps captured as CUDA graphs, one per batch-size bucket, replayed with the batch copied into
static buffers (cuda_graph_buckets.py chooses the bucket, cuda_graph_inputs.py owns the buffers).

    run(batch):  bucket = buckets.choose(batch)        None -> the eager forward (the caller's)
                 inputs[bucket].fill(batch)            rows past the batch: padding on the scratch page
                 graph[bucket] (captured on first use: a warmup on a side stream, then torch.cuda.graph with the
                 one private memory pool every bucket shares) .replay()
                 -> logits and hidden of the real rows (padding rows dropped)

What the graph holds: the model's forward and compute_logits. Sampling (greedy or not, penalties, grammars,
top-logprobs) stays eager on the real rows' logits, as in SGLang: its paths depend on the batch's values.

Only where the per-step inputs can be static: CUDA, the Triton attention backend (its metadata over the static
buffers, a fixed split count), one rank (no collectives in the capture), and --disable-cuda-graph off; else
`create` returns None and the runner is unchanged. A capture that fails (e.g. a layer that reads a value back to
the host, as the MoE expert routing does) turns the graphs off with a warning and the step runs eagerly.
Not yet run on a GPU: the buckets and the buffers are tested on the CPU, capture and replay only where CUDA is.
"""

from __future__ import annotations

import logging

import torch

from zserve.common.config_sections import KernelSection
from zserve.common.forward_batch import ForwardBatch
from zserve.model_proc.cuda_graph_buckets import CudaGraphBuckets
from zserve.model_proc.cuda_graph_inputs import CudaGraphInputs
from zserve.model_proc.layers.attention_metadata import AttentionMetadata
from zserve.model_proc.layers.kv_pool import KVPool

logger = logging.getLogger(__name__)

WARMUP_RUNS = 2  # eager runs on the side stream before a capture: Triton compiles, the allocator settles
GRAPH_BACKENDS = ("triton",)  # attention backends whose per-step inputs CudaGraphInputs makes static


def unsupported_reason(kernels: KernelSection, device: torch.device, attention_backend: str, tp_size: int) -> str:
    """Why decode steps are not captured here ("" when they are)."""
    if kernels.disable_cuda_graph:
        return "--disable-cuda-graph"
    if device.type != "cuda":
        return f"the device is {device.type}"
    if attention_backend not in GRAPH_BACKENDS:
        return f"the attention backend is {attention_backend} (graphs need one of {', '.join(GRAPH_BACKENDS)})"
    if tp_size > 1:
        return f"tp_size={tp_size} (collectives are not captured)"
    return ""


class CudaGraphs:
    def __init__(self, model: torch.nn.Module, kv_pool: KVPool, buckets: CudaGraphBuckets, max_pages: int):
        """Graphs of `model` over `kv_pool`, whose last page is the scratch page (never given to the scheduler)."""
        self.model, self.kv_pool, self.buckets, self.max_pages = model, kv_pool, buckets, max_pages
        self.scratch_page = kv_pool.num_pages - 1
        self.inputs: dict[int, CudaGraphInputs] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # bucket -> (logits, hidden), static
        self.pool = None  # the private memory pool, from the first capture

    @staticmethod
    def create(
        kernels: KernelSection, device: torch.device, attention_backend: str, tp_size: int,
        model: torch.nn.Module, kv_pool: KVPool, context_len: int,
    ) -> CudaGraphs | None:  # fmt: skip
        """The graphs where they can run (unsupported_reason), else None."""
        reason = unsupported_reason(kernels, device, attention_backend, tp_size)
        if reason:
            if device.type == "cuda":
                logger.info("CUDA graphs off: %s", reason)
            return None
        buckets = CudaGraphBuckets.up_to(kernels.cuda_graph_max_bs)
        logger.info("CUDA graphs for decode: buckets %s, captured on first use", list(buckets.sizes))
        return CudaGraphs(model, kv_pool, buckets, -(-context_len // kv_pool.page_size))

    def run(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(logits float32[num_reqs, vocab], hidden [num_reqs, hidden]) from a replay, or None: run it eagerly.
        The tensors are the graph's outputs: the next replay of the bucket overwrites them."""
        bucket = self.buckets.choose(batch)
        if bucket is None or (bucket not in self.graphs and not self._capture(bucket)):
            return None
        self.inputs[bucket].fill(batch)
        self.graphs[bucket].replay()
        logits, hidden = self.outputs[bucket]
        n = batch.num_reqs
        return CudaGraphInputs.rows_of(logits, n), CudaGraphInputs.rows_of(hidden, n)

    def _step(self, inputs: CudaGraphInputs, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.model(inputs.input_ids, meta)
        return self.model.compute_logits(hidden), hidden

    def _capture(self, bucket: int) -> bool:
        """Capture `bucket` (every row padding: only the scratch page is written); False, with the graphs turned
        off, when the capture fails."""
        inputs = CudaGraphInputs(bucket, self.max_pages, self.kv_pool.page_size, self.scratch_page,
                                 self.kv_pool.device)
        meta = inputs.metadata(self.kv_pool)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    self._step(inputs, meta)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self._step(inputs, meta)
        except RuntimeError as e:
            logger.warning("CUDA graph capture of batch size %d failed, decode runs eagerly from now: %s", bucket, e)
            self.buckets = CudaGraphBuckets(())
            return False
        if self.pool is None:
            self.pool = graph.pool()
        self.inputs[bucket], self.graphs[bucket], self.outputs[bucket] = inputs, graph, outputs
        logger.info("captured the decode step at batch size %d", bucket)
        return True
