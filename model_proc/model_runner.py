"""ModelRunner: weights + KV pool + sampler on one device; runs ForwardBatches.

    run(batch):  validate -> attention metadata -> forward (writes K/V of new tokens)
                 -> rows sharing an identical prompt's K/V: slot copy from their KV source
                 -> logits at every row's last token -> sample -> StepResult
                 (+ each row's pooled chunk vector on an embedding server: chunk_pooler.py)

Every array is by batch row (common/forward_batch.py): the logits are float32[num_reqs, vocab],
and the sampler, the penalties, the grammar masks and the StepResult index them alike. A row
that is not sampled (the ChunkedReq, at most one a step) is drawn like the others and reported
as NO_TOKEN: one extra logits row in a step that computes a whole chunk, for no mapping
between row numberings anywhere.

It keeps no state about requests: which pages a request owns, and how many of its tokens are
already in them, comes with every batch. It trusts the slot ids only after `batch.validate`.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from zserve.common.config_sections import CacheSection, KernelSection, ModelSection
from zserve.common.forward_batch import NO_TOKEN, ForwardBatch, StepResult
from zserve.common.gguf_source import gguf_source
from zserve.common.lora_modules import served_lora_modules
from zserve.common.model_config import ModelConfig
from zserve.common.start_phases import StartPhases
from zserve.common.weight_memory import WeightMemory
from zserve.common.worker_env import default_num_threads
from zserve.model_proc.checkpoints.early_cache_read import EarlyCacheRead
from zserve.model_proc.checkpoints.packed_cache import PackedCache
from zserve.model_proc.chunk_pooler import final_norm, pool_chunks
from zserve.model_proc.compute_dtype import resolve_dtype
from zserve.model_proc.cuda_graphs import CudaGraphs
from zserve.model_proc.draft_verifier import DraftVerifier
from zserve.model_proc.kernels.cpu_kernels import fused_ops_available
from zserve.model_proc.kv_pool_sizing import KVPoolSizing
from zserve.model_proc.layers.attention import attention_backend
from zserve.model_proc.layers.attention_metadata import AttentionMetadata
from zserve.model_proc.layers.gemm import gemm_weight_bytes, pack_as_loaded, prepack_weights
from zserve.model_proc.layers.kv_pool import free_memory_bytes
from zserve.model_proc.layers.weight_kernels.int8_kernels import ZserveInt8DotKernel
from zserve.model_proc.layers.weight_kernels.registry import choose_kernel
from zserve.model_proc.layers.weight_kernels.weight_copy_policy import WeightCopyPolicy
from zserve.model_proc.layers.weight_kernels.weight_kernel import WeightKernel
from zserve.model_proc.logits_processors import top_logprobs_of
from zserve.model_proc.lora.lora_adapters import attach_lora
from zserve.model_proc.lora.lora_batch import LoraBatch
from zserve.model_proc.models.registry import build_model
from zserve.model_proc.process_memory import release_freed_memory
from zserve.model_proc.quant.methods import auto_quantization, checkpoint_method, get_quant_method
from zserve.model_proc.rank_place import RankPlace
from zserve.model_proc.resident_memory import resident_bytes_by_form
from zserve.model_proc.sampler import Sampler

logger = logging.getLogger(__name__)

PROGRESS_MIN_PARAMS = 50_000_000  # show a loading bar for models at least this big


def resolve_quantization(choice: str, model_dir: str | Path, device: torch.device, dtype: torch.dtype) -> str:
    """--quantization auto: what the checkpoint's method is served as (quant/methods.py: gguf for a
    GGUF file, int8 for AWQ / GPTQ) on a CPU where the int8 x int8 kernel runs in a 16-bit dtype;
    else none."""
    if choice != "auto":
        return choice
    int8_dot_runs = device.type == "cpu" and dtype != torch.float32 and ZserveInt8DotKernel.runs(device, dtype)
    return auto_quantization(checkpoint_method(model_dir), int8_dot_runs)


def resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} asked for, but CUDA is not available")
    return resolved


PROMPT_SCORE_ROWS = 128  # prompt positions whose logits are computed at once (echo): bounds the [rows, vocab] tensor

class ModelRunner:
    def __init__(
        self,
        model: ModelSection,
        cache: CacheSection,
        kernels: KernelSection,
        place: RankPlace,
        *,
        show_progress: bool | None = None,
        start_phases: StartPhases | None = None,
        early_cache_read: EarlyCacheRead | None = None,
    ):
        """The config's records it reads: `model` (the checkpoint, --dtype, --quantization, --packed-cache,
        --seed), `cache` (the KV pool: kv_pool_sizing.py), `kernels` (--num-threads, 0 =
        `default_num_threads()` on CPU; --gemm-backend, --attention-backend, --fused-ops,
        --gemm-weight-copy) and this rank's `place` (device, tp_rank, tp_size). `start_phases`: the
        worker's start timeline (common/start_phases.py), marked at each step here; `early_cache_read`:
        the packed cache's read started with the worker (checkpoints/early_cache_read.py)."""
        phases = start_phases or StartPhases()
        self.kernels, self.packed_cache_choice = kernels, model.packed_cache  # _load_model
        self.early_cache_read = early_cache_read  # the packed cache's read started with the worker: _packed_cache
        self.config = ModelConfig.from_model_dir(model.model)
        self.device = resolve_device(place.device)
        self.dtype, dtype_reason = resolve_dtype(model.dtype, self.device)
        # --quantization (read by _load_model): auto keeps a GGUF file's quantized blocks where the kernel runs them
        self.quantization = resolve_quantization(model.quantization, self.config.model_dir, self.device, self.dtype)
        self.page_size, self.tp_rank, self.tp_size = cache.page_size, place.tp_rank, place.tp_size
        sizing = KVPoolSizing(cache, self.config.num_layers, self.config.num_kv_heads // place.tp_size,
                              self.config.head_dim, self.dtype, self.device, place.tp_size)
        if place.tp_size > 1 and not torch.distributed.is_initialized():
            raise ValueError(f"tp_size={place.tp_size} needs torch.distributed initialised before the ModelRunner")
        if self.device.type == "cpu":
            torch.set_num_threads(kernels.num_threads or default_num_threads())
        torch.manual_seed(model.seed)
        phases.done("model config")

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-prefault") as background:
            # sized in tokens, the pool exists before the weights, its first pages faulted in on the other
            # thread while they load (the first request would pay it)
            pool = sizing.before_weights()
            prefault: Future | None = background.submit(pool.prefault) if pool is not None else None
            t0 = time.perf_counter()
            self.model = self._load_model(show_progress, phases)
            # the LoRA adapters' updates (model_proc/lora/); None: a server without adapters runs the base path only
            self.lora_batch = self._load_adapters(model)
            logger.info(
                "loaded %s (%s, %s) on %s in %.1fs",
                self.config.architecture, self.dtype, dtype_reason, self.device, time.perf_counter() - t0,
            )
            if pool is None:
                pool = sizing.after_weights(self.model)
                prefault = background.submit(pool.prefault)
            prefault.result()  # raises what the prefault raised
        self.kv_pool = pool
        phases.done("KV pool (the rest of its prefault)")
        logger.info("KV pool: %d pages x %d tokens, %.2f GiB", self.kv_pool.num_pages, self.page_size,
                    self.kv_pool.num_bytes / 2**30)
        resident, copy_bytes = resident_bytes_by_form(self.model, self.dtype)
        self.memory = WeightMemory(self.file_bytes_by_type, resident, copy_bytes, self.kv_pool.num_bytes)
        logger.info("memory: %s", self.memory.summary())
        self.attention_backend = attention_backend(self.device, self.dtype, kernels.attention_backend)
        self.sampler = Sampler(self.device)
        # decode steps replayed from CUDA graphs (cuda_graphs.py); None on CPU and wherever they cannot run
        self.cuda_graphs = CudaGraphs.create(kernels, self.device, self.attention_backend, place.tp_size,
                                             self.model, self.kv_pool, self.config.context_len)
        phases.done("attention and sampler")

    def _load_model(self, show_progress: bool | None, phases: StartPhases) -> torch.nn.Module:
        if show_progress is None:
            show_progress = self.config.num_params >= PROGRESS_MIN_PARAMS
        previous_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)  # parameters are created in the compute dtype ...
        try:
            with torch.device(self.device):  # ... on the device, uninitialised until loaded
                model = build_model(self.config, self.tp_rank, self.tp_size)
        finally:
            torch.set_default_dtype(previous_dtype)
        phases.done("model build")
        model_dir, quantization = self.config.model_dir, self.quantization
        # the kernel is chosen first, so each matrix is packed as soon as its layer has loaded: the load peak is
        # the packed model plus one matrix (and its file pages), never the whole model in --dtype
        plain_bytes = gemm_weight_bytes(model, self.dtype)  # shapes only: nothing is packed yet
        self.weight_kernel = self._choose_weight_kernel(plain_bytes)
        pack_as_loaded(model, self.weight_kernel)
        phases.done("kernel choice")
        t0 = time.perf_counter()
        stored, served = checkpoint_method(model_dir), get_quant_method(quantization)
        cache = self._packed_cache()
        phases.done("packed cache read")
        loaded = False
        try:
            with stored.open_checkpoint(model_dir, served, show_progress, getattr(model, "names", None), cache) as ckpt:
                phases.done("checkpoint open")
                model.load(ckpt)
                missing = ckpt.missing_params(model)
                self.file_bytes_by_type = ckpt.file_bytes_by_type()
            loaded = True
        finally:
            if cache is not None:
                cache.close(complete=loaded)
        assert not missing, f"parameters not filled from the checkpoint: {missing}"
        if cache is not None:
            logger.info("packed cache: %d matrices read from %s, %d packed from the file", cache.num_hits,
                        cache.paths()[1], cache.num_packed)
        count = prepack_weights(model, self.weight_kernel)  # what loading did not pack: a tied LM head
        release_freed_memory()
        phases.done("load and pack")
        # norms, gated activation, rotary + K/V write: one call each
        if fused_ops_available(self.device, self.dtype, self.kernels.fused_ops):
            for module in model.modules():
                if hasattr(module, "use_cpu_kernels"):
                    module.use_cpu_kernels()
        if self.weight_kernel.repacks:
            logger.info("read and packed the weight matrices for the %s GEMM in %.1fs (%d after loading)",
                        self.gemm_backend, time.perf_counter() - t0, count)
        if self.quantization != "none":
            logger.info("--quantization %s: %.1f MB of linear and LM-head weights in %s, %.1f MB quantized",
                        self.quantization, plain_bytes / 1e6, str(self.dtype).removeprefix("torch."),
                        gemm_weight_bytes(model, self.dtype) / 1e6)
        return model.eval()

    def _load_adapters(self, model: ModelSection) -> LoraBatch | None:
        modules = served_lora_modules(model.enable_lora, model.lora_modules)
        if not modules:
            return None
        if self.tp_size > 1:
            raise ValueError("LoRA adapters are served with --tp-size 1 only")
        # the products run on the weight kernel of a float model (a quantizing kernel would round the adapters)
        kernel = self.weight_kernel if self.quantization == "none" else None
        batch = attach_lora(self.model, modules, model.max_lora_rank, self.dtype, self.device, kernel)
        logger.info("LoRA adapters: %s", ", ".join(f"{m.name} ({m.path})" for m in modules))
        return batch

    def _packed_cache(self) -> PackedCache | None:
        """The cache of a GGUF file's packed matrices (--packed-cache on, --quantization gguf, on CPU), else None."""
        source = gguf_source(self.config.model_dir)
        packs = get_quant_method(self.quantization).gguf_packs  # the method that packs a file's rows at load
        early, self.early_cache_read = self.early_cache_read, None  # taken once
        if self.packed_cache_choice != "on" or not packs or source is None or self.device.type != "cpu":
            if early is not None:
                early.take(Path(), -1)  # read for nothing: freed
            return None
        return PackedCache.open(Path(self.config.model_dir), source, self.tp_rank, self.tp_size, early)

    def _choose_weight_kernel(self, plain_bytes: int) -> WeightKernel:
        """The weight kernel for this server, calibrated, with or without its second copy of the
        weights (--gemm-weight-copy, model_proc/layers/weight_kernels/weight_copy_policy.py)."""
        kernel = choose_kernel(self.device, self.dtype, self.kernels.gemm_backend, self.quantization)
        stored_quantized = checkpoint_method(self.config.model_dir).quantized
        # the weights are not loaded yet: what is free now less their --dtype size bounds what will be free after
        free_after_bytes = max(0, free_memory_bytes(self.device) - plain_bytes)
        policy = WeightCopyPolicy(self.kernels.gemm_weight_copy)
        decision = policy.apply(kernel, plain_bytes, free_after_bytes, stored_quantized)
        if decision.reason:
            logger.log(logging.WARNING if decision.warning else logging.INFO, "%s", decision.reason)
        return decision.kernel.calibrated()

    @property
    def gemm_backend(self) -> str:
        """The weight kernel's name (layers/weight_kernels/registry.py): what --gemm-backend and
        --quantization picked here."""
        return self.weight_kernel.name

    @property
    def num_pages_total(self) -> int:
        """The pages the scheduler may give out: with CUDA graphs, the last is their scratch page."""
        return self.kv_pool.num_pages - (self.cuda_graphs is not None)

    def info(self) -> dict:
        """What the scheduler needs to know (the WorkerReady message's fields)."""
        return {
            "num_pages": self.num_pages_total,
            "page_size": self.page_size,
            "context_len": self.config.context_len,
            "eos_token_ids": list(self.config.eos_token_ids),
            "vocab_size": self.config.vocab_size,
            "device_type": self.device.type,
        }

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> StepResult:
        t0 = time.perf_counter()
        self._validate(batch)
        # float32[num_reqs, vocab]; every computed token's hidden state; logits at the drafts (None: no drafts)
        logits, hidden, draft_logits = self._forward(batch)
        positions = torch.from_numpy((batch.cached_lens + batch.extend_lens).astype(np.int64)).to(self.device)
        want_logprob = batch.return_logprob & batch.is_sampled
        token_ids, logprobs = self.sampler.sample(
            logits, batch.sampling, positions, want_logprob, batch.penalties, batch.grammar
        )
        token_ids = token_ids.cpu().numpy()
        if not batch.is_sampled.all():
            token_ids[~batch.is_sampled] = NO_TOKEN
        num_accepted = None
        if batch.draft_lens is not None:  # a drafted row's token above is the bonus, kept if every draft is accepted
            num_accepted = DraftVerifier(self.sampler).verify(draft_logits, batch, token_ids)
        num_top, top_ids, top_logprobs = 0, None, None
        if batch.top_logprobs is not None and batch.top_logprobs.any():
            num_top = int(batch.top_logprobs.max())
            ids, values = top_logprobs_of(logits, num_top)
            top_ids, top_logprobs = ids.reshape(-1), values.reshape(-1)
        result = StepResult(
            step_id=batch.step_id, next_token_ids=token_ids, logprobs=logprobs.cpu().numpy(),
            num_top=num_top, top_ids=top_ids, top_logprobs=top_logprobs, num_accepted=num_accepted,
        )
        if batch.prompt_logprobs is not None:
            self._score_prompts(batch, hidden, result)
        if batch.pooling is not None:  # an embedding server: each row's chunk vector
            result.pooled = pool_chunks(final_norm(self.model), hidden, batch).reshape(-1)
        result.forward_ms = (time.perf_counter() - t0) * 1e3
        return result

    def _score_prompts(self, batch: ForwardBatch, hidden: torch.Tensor, result: StepResult) -> None:
        """Prompt logprobs (echo): each asking row's chunk positions score the prompt token after
        them, under the model's own distribution (log_softmax of the raw logits), in slices of
        PROMPT_SCORE_ROWS positions so the [positions, vocab] logits stay small."""
        asked = batch.prompt_logprobs
        starts = batch.token_starts()
        k = asked.num_top
        values, top_ids, top_values = [], [], []
        for row, next_id in zip(asked.rows.tolist(), asked.next_ids.tolist(), strict=True):
            start, extend_len = int(starts[row]), int(batch.extend_lens[row])
            targets = batch.input_ids[start + 1 : start + extend_len].astype(np.int64)  # what positions 0..e-2 predict
            if next_id >= 0:  # and the last position: the next chunk's first token
                targets = np.append(targets, next_id)
            num = len(targets)
            for lo in range(0, num, PROMPT_SCORE_ROWS):
                hi = min(num, lo + PROMPT_SCORE_ROWS)
                logprobs = torch.log_softmax(self.model.compute_logits(hidden[start + lo : start + hi]).float(), dim=-1)
                picked = torch.from_numpy(targets[lo:hi]).to(logprobs.device)
                values.append(logprobs.gather(1, picked[:, None])[:, 0].cpu().numpy())
                if k:
                    v, i = torch.topk(logprobs, k, dim=-1)
                    top_ids.append(i.to(torch.int32).cpu().numpy().reshape(-1))
                    top_values.append(v.cpu().numpy().reshape(-1))
        result.prompt_logprobs = np.concatenate(values).astype(np.float32) if values else np.zeros(0, np.float32)
        if k:
            result.prompt_top_ids = np.concatenate(top_ids) if top_ids else np.zeros(0, np.int32)
            result.prompt_top_logprobs = (
                np.concatenate(top_values).astype(np.float32) if top_values else np.zeros(0, np.float32)
            )

    @torch.inference_mode()
    def last_logits(self, batch: ForwardBatch) -> torch.Tensor:
        """float32[num_reqs, vocab]: logits at every row's last token (a KV-sharing row's are its
        source's; a drafted row's, at its last draft), for parity tests. Runs a full forward, so it
        writes the batch's K/V like `run`."""
        self._validate(batch)
        return self._forward(batch)[0]

    def _validate(self, batch: ForwardBatch) -> None:
        batch.validate(self.page_size, self.num_pages_total)
        seq_lens = batch.cached_lens.astype(np.int64) + batch.extend_lens
        if batch.num_reqs == 0:
            raise ValueError(f"ForwardBatch {batch.step_id}: no requests")
        if (seq_lens > self.config.context_len).any():
            i = int(np.argmax(seq_lens > self.config.context_len))
            raise ValueError(
                f"ForwardBatch {batch.step_id}: request {i} reaches {int(seq_lens[i])} tokens, "
                f"past the model's context of {self.config.context_len}"
            )
        if batch.num_tokens and (batch.input_ids.min() < 0 or batch.input_ids.max() >= self.config.vocab_size):
            bad = batch.input_ids[(batch.input_ids < 0) | (batch.input_ids >= self.config.vocab_size)][0]
            raise ValueError(
                f"ForwardBatch {batch.step_id}: token id {int(bad)} "
                f"is outside the vocabulary of {self.config.vocab_size}"
            )

    def _forward(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Forward the batch's computed rows, then give each KV-sharing row its source's K/V for
        this step's positions; logits at every row's last token (a sharing row's are its
        source's, computed once), the hidden state of every computed token, and the logits at
        each drafted row's first d tokens (float32[sum(draft_lens), vocab], DraftVerifier's input;
        None without drafts), from the same compute_logits call."""
        if self.lora_batch is not None:
            self.lora_batch.set_tokens(batch.token_lora_ids())
        graphs = self.cuda_graphs if batch.lora_ids is None else None  # graphs are captured without adapters
        if graphs is not None and (replayed := graphs.run(batch)) is not None:
            return *replayed, None  # a plain decode step: no drafts
        computed = batch.computed_part()
        meta = AttentionMetadata.build(computed, self.kv_pool, self.dtype, backend=self.attention_backend)
        input_ids = torch.from_numpy(computed.input_ids.astype(np.int64)).to(self.device)
        hidden = self.model(input_ids, meta)  # [T, hidden]
        last_token_idx = batch.token_starts() + batch.extend_lens - 1  # int64[num_reqs], into `hidden`
        expand = None
        if batch.kv_source is not None:
            src_slots, dst_slots = batch.shared_kv_slots(self.page_size)
            self.kv_pool.copy_slots(
                torch.from_numpy(src_slots).to(self.device), torch.from_numpy(dst_slots).to(self.device)
            )
            last_token_idx, expand = np.unique(last_token_idx, return_inverse=True)  # a source's logits once
        num_last = last_token_idx.size
        draft_token_idx = DraftVerifier.draft_token_idx(batch)  # None: no drafts (most steps)
        if draft_token_idx is not None:  # scored rows: [the rows' last tokens | the drafted rows' first d]
            last_token_idx = np.concatenate([last_token_idx, draft_token_idx])
        last_hidden = hidden
        if draft_token_idx is not None or num_last != computed.num_tokens:  # a pure decode batch needs no gather
            last_hidden = hidden.index_select(0, torch.from_numpy(last_token_idx).to(self.device))
        logits = self.model.compute_logits(last_hidden)
        draft_logits = None
        if draft_token_idx is not None:
            logits, draft_logits = logits[:num_last], logits[num_last:]
        if expand is not None:  # one row per request, a sharing row reading its source's
            logits = logits.index_select(0, torch.from_numpy(expand.astype(np.int64)).to(self.device))
        return logits, hidden, draft_logits
