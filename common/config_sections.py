"""The sections of the server configuration: each one a frozen record of the flags one part of the
server reads, with their defaults. `ServerConfig` (server_config.py) is all of them at once; a
process or component takes the section(s) it reads, typed (`cfg.section(SchedulerSection)`, or the
`ServerConfig` itself, which is every section). What each flag means, its spellings, choices and
ranges live in the flags table (server_flags.py), not here.
"""

from __future__ import annotations

from dataclasses import dataclass

from zserve.common.task import GENERATE
from zserve.common.worker_env import OMP_SPIN_COUNT

DEFAULT_HTTP_PORT = 8000  # --port: vLLM's HTTP port (SGLang's is 30000: users type --port 30000)
# --zmq-port: Client() with no arguments connects here. Next to SGLang's HTTP port, not on it, so a SGLang user's
# `--port 30000` never collides with it; taken by another server (and not given), the server picks a free one.
DEFAULT_CLIENT_PORT = 30001
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")  # sglang-router's --policy names
API_KEY_ENV = "ZSERVE_API_KEY"  # the API key: read when --api-key is empty; how the launcher hands it to children


@dataclass(frozen=True)
class ModelSection:
    """What is served: the checkpoint, its tokenizer and chat template, and the weights' number format."""

    model: str = ""
    gguf_file: str = ""  # the .gguf file of a hub repo (or of a local directory) --model names
    revision: str = ""  # a hub id --model's branch, tag or commit ("" = main)
    download_dir: str = ""  # the hub cache a hub id --model is read from and downloaded into ("" = HF_HUB_CACHE's)
    served_model_name: str = ""
    task: str = GENERATE  # TASKS: generate, or embed (/v1/embeddings only); resolved into a Task (common/task.py)
    pooler_config: str = ""  # --task embed: JSON over the model directory's pooling (Pooling.overridden)
    tokenizer: str = ""
    chat_template: str = ""
    trust_remote_code: bool = False
    dtype: str = "auto"
    quantization: str = "auto"
    packed_cache: str = "on"  # a GGUF file's packed matrices kept on disk (model_proc/checkpoints/packed_cache.py)
    context_length: int = 0
    seed: int = 0
    enable_lora: bool = False  # LoRA adapters (common/lora_modules.py): per request by name
    lora_modules: str = ""  # name=path[,name=path ...] (PEFT directories), comma-joined as the flag's values
    max_loras: int = 8  # adapters the server may load at most
    max_lora_rank: int = 64  # the largest rank r an adapter may have

    @property
    def tokenizer_dir(self) -> str:
        """Where the tokenizer files are: --tokenizer, else the model directory."""
        return self.tokenizer or self.model


@dataclass(frozen=True)
class ParallelSection:
    """Where the model worker ranks run: the device, tensor-parallel ranks and the nodes they span."""

    device: str = "auto"
    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str = ""


@dataclass(frozen=True)
class CacheSection:
    """The paged KV pool: page size and how many tokens it holds."""

    page_size: int = 16
    kv_cache_tokens: int = 0
    mem_fraction_static: float = 0.0
    kv_memory_fraction: float = 0.3
    kv_cache_dtype: str = "auto"  # common/kernel_choices.py's KV_CACHE_DTYPES


@dataclass(frozen=True)
class SchedulerSection:
    """What the scheduler decides by: slots, the step's token budget, the policies, the prefix cache."""

    max_running_requests: int = 64
    max_prefill_tokens: int = 512
    max_step_ms: float = -1.0  # a step with decodes in it: -1 = no bound, 0 = 3x a decode-only step (auto), or ms
    prefill_max_requests: int = 0
    schedule_policy: str = "mixed"
    admission_policy: str = "pack"
    admission_lookahead: int = 64
    force_fifo_every: int = 8
    kv_reservation: str = "estimated"
    schedule_conservativeness: float = 1.0
    disable_radix_cache: bool = False
    overlap_schedule: str = "auto"  # on CUDA on, on a CPU off (common/scheduler_choices.py)
    grammar_backend: str = "xgrammar"
    max_queued_requests: int = 1024
    log_stats_interval_s: float = 10.0


@dataclass(frozen=True)
class SpeculationSection:
    """Speculative decoding as the flags give it (common/speculative_settings.py resolves it)."""

    speculative_algorithm: str = "none"
    speculative_num_draft_tokens: int = 5
    speculative_ngram_min_match_window_size: int = 1
    speculative_ngram_max_match_window_size: int = 3
    speculative_disable_by_batch_size: int = 16
    speculative_config: str = ""


@dataclass(frozen=True)
class KernelSection:
    """How the model worker computes: on a CPU threads, the instruction set and each kernel's choice; on CUDA graphs."""

    num_threads: int = 0
    omp_spin_count: int = OMP_SPIN_COUNT
    cpu_isa: str = "auto"
    gemm_backend: str = "auto"
    gemm_weight_copy: str = "auto"
    attention_backend: str = "auto"
    fused_ops: str = "auto"
    cuda_graph_max_bs: int = 160  # SGLang's default on most GPUs; buckets are captured on first use
    disable_cuda_graph: bool = False


@dataclass(frozen=True)
class FrontendSection:
    """The server as a whole: the native clients' door, the processes' lifetimes, logging."""

    host: str = "127.0.0.1"
    zmq_port: int = DEFAULT_CLIENT_PORT
    api_key: str = ""
    max_request_bytes: int = 8 << 20  # HTTP bodies; twice this bounds a native client's frame
    client_timeout_s: float = 10.0
    startup_timeout_s: float = 600.0
    drain_timeout_s: float = 30.0
    log_level: str = "info"
    shell: bool = False
    ready_file: str = ""


@dataclass(frozen=True)
class HttpSection:
    """The HTTP server (http_proc/)."""

    http_port: int = DEFAULT_HTTP_PORT
    allowed_hosts: str = ""
    allowed_origins: str = ""
    strict_requests: bool = False
    watchdog_timeout_s: float = 300.0
    reasoning_parser: str = "none"  # qwen3 | deepseek-r1: chat answers' <think>...</think> as reasoning_content
    tool_call_parser: str = "auto"  # the tool-call format chat answers are read in; auto: the chat template's
    enable_auto_tool_choice: bool = False  # vLLM's; accepted, no effect (tool_choice auto needs no switch here)
    http_keep_alive_s: float = 120.0  # past the idle-pool timeout of the clients in front (sglang-router's: 90 s)


@dataclass(frozen=True)
class FleetSection:
    """Data-parallel replicas on this machine and sglang-router in front of them (launcher/fleet/)."""

    dp_size: int = 1
    router: bool = False
    router_port: int = 0  # 0: the router listens on --port, the fleet's one endpoint
    router_policy: str = "cache_aware"
    router_worker_urls: str = ""
    router_prometheus_port: int = 29000
    router_args: str = ""


# ServerConfig's sections in the order of its fields (and of the README's flags table)
SECTIONS = (
    ModelSection, ParallelSection, CacheSection, SchedulerSection, SpeculationSection, KernelSection,
    FrontendSection, HttpSection, FleetSection,
)
