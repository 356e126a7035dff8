"""The flags table: what each `launch_server` flag means, how SGLang and vLLM users may spell it, its
choices and ranges, and the environment variable that sets its default. Keyed by the
`ServerConfig` field it sets (the field holds the type and the default: config_sections.py);
launcher/cli.py builds the parser from it, launcher/flags_table.py the README's table, and
`env_defaults` reads the variables.

Over 400 lines on purpose: it is one table with an entry per flag (every ServerConfig field), in the order of the
sections and of the README's table, so that a flag's spellings, help and peers' names are read and reviewed side
by side; the choices themselves are their owners' constants (tests/common/test_flag_choices.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from zserve.common.architectures import GGUF_ARCHITECTURES
from zserve.common.config_sections import ROUTER_POLICIES
from zserve.common.isa_features import CPU_ISA_ENV, FEATURES, LEVELS
from zserve.common.kernel_choices import ATTENTION_BACKENDS, FUSED_OPS_CHOICES, KV_CACHE_DTYPES
from zserve.common.proc_runtime import LOG_LEVELS
from zserve.common.scheduler_choices import (
    ADMISSION_POLICIES,
    GRAMMAR_BACKENDS,
    KV_RESERVATIONS,
    OVERLAP_SCHEDULES,
    STEP_POLICIES,
)
from zserve.common.speculative_settings import SPECULATIVE_ALGORITHMS
from zserve.common.task import TASKS
from zserve.common.think_markers import REASONING_PARSERS
from zserve.common.tool_call_format import TOOL_CALL_FORMATS
from zserve.common.weight_formats import (
    DTYPE_CHOICES,
    GEMM_CHOICES,
    PACKED_CACHE_CHOICES,
    QUANTIZATION_CHOICES,
    WEIGHT_COPY_CHOICES,
)


@dataclass(frozen=True)
class FlagSpec:
    help: str
    flag: str = ""  # the flag's spelling when it is not --field-name
    aliases: tuple[str, ...] = ()  # other spellings with the same meaning (SGLang's, vLLM's)
    choices: tuple[str, ...] | None = None
    value_aliases: Mapping[str, str] = field(default_factory=dict)  # spelling -> the value stored (half -> float16)
    min: float | None = None  # inclusive
    max: float | None = None  # inclusive
    above: float | None = None  # exclusive
    below: float | None = None  # exclusive
    env: str = ""  # a ZSERVE_* variable that sets the default (read only by env_defaults)
    nargs: str | None = None  # "+": several values, stored comma-joined
    positional: bool = False  # also taken as the one positional argument
    switches: Mapping[str, object] = field(default_factory=dict)  # a peer's flag that sets one value
    deprecated: Mapping[str, str] = field(default_factory=dict)  # old spelling -> why it moved
    peer_note: str = ""  # the SGLang / vLLM counterpart, when not plain from the spellings


def flag_of(name: str) -> str:
    """The canonical spelling of the flag that sets field `name`."""
    return FLAG_SPECS[name].flag or "--" + name.replace("_", "-")


def env_defaults(environ: Mapping[str, str] = os.environ) -> dict[str, tuple[str, str]]:
    """field name -> (variable, value) for each flag whose environment variable is set: the one place
    those variables are read. They are defaults only: the launcher's command line builds the config
    with them (launcher/cli.py), a flag given there wins, and the processes take the choice from the
    config."""
    return {
        name: (spec.env, environ[spec.env]) for name, spec in FLAG_SPECS.items() if spec.env and environ.get(spec.env)
    }


FLAG_SPECS: dict[str, FlagSpec] = {
    # ModelSection
    'model': FlagSpec(
        'model directory (config.json + safetensors + tokenizer), or a .gguf file '
        f'({", ".join(GGUF_ARCHITECTURES)}; or a directory holding one), or a Hugging Face hub id org/name '
        "(fetched into the hub cache: config, tokenizer and safetensors only; $HF_HUB_OFFLINE=1 reads the cache "
        "alone), org/repo:QUANT for a repo's GGUF file (llama.cpp's -hf); a local path that exists wins; default: "
        'the SmolLM2-135M-Instruct demo model, fetched on first use',
        aliases=('--model-path',),
        positional=True,
    ),
    'gguf_file': FlagSpec(
        'the .gguf file to serve from a hub repo --model (or from a directory --model holding several); '
        "--model org/repo:QUANT picks the repo's file whose name holds QUANT instead (llama.cpp's -hf)",
        aliases=('--hf-file',),
        peer_note="llama.cpp -hff / --hf-file (its -hf org/repo:QUANT is --model org/repo:QUANT here)",
    ),
    'revision': FlagSpec(
        'with a hub id --model: the branch, tag or commit hash to serve (empty = main); no effect on a local '
        'path (a warning says so)',
        peer_note='vLLM and SGLang --revision',
    ),
    'download_dir': FlagSpec(
        "with a hub id --model: the Hugging Face cache it is read from and downloaded into, in huggingface_hub's "
        'layout (empty = $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)',
        peer_note='vLLM and SGLang --download-dir',
    ),
    'served_model_name': FlagSpec(
        "the model's name in the OpenAI API (/v1/models, the request's model) and the metrics' model_name "
        "label (empty = a hub id --model as typed, else the model directory's name)",
    ),
    'task': FlagSpec(
        'generate, or embed: serve /v1/embeddings from a decoder checkpoint (last-token, mean or CLS pooling '
        "and normalisation as its sentence-transformers modules.json says; without one, last token, "
        'normalised); generation routes are refused',
        aliases=('--runner',),
        choices=TASKS,
        value_aliases={'pooling': 'embed', 'embedding': 'embed'},
        switches={'--is-embedding': 'embed'},
        peer_note="vLLM --task embed (--runner pooling in newer vLLM), SGLang --is-embedding",
    ),
    'pooler_config': FlagSpec(
        "with --task embed: JSON over the model directory's pooling, vLLM's keys: pooling_type (LAST, MEAN, "
        'CLS) and normalize (true, false); empty = as the directory says',
        aliases=('--override-pooler-config',),
        peer_note='vLLM --pooler-config (--override-pooler-config before); SGLang has none',
    ),
    'tokenizer': FlagSpec(
        'a directory with the tokenizer files (tokenizer.json, tokenizer_config.json), when they are not '
        "in --model (empty = --model's)",
        aliases=('--tokenizer-path',),
        peer_note='vLLM --tokenizer, SGLang --tokenizer-path',
    ),
    'chat_template': FlagSpec(
        "a Jinja chat template file used instead of the model's (empty = the model's own)",
    ),
    'trust_remote_code': FlagSpec(
        'accepted for SGLang and vLLM command lines; no effect: zserve runs its own code for the '
        'architectures it supports and never code from the model directory (a note says so)',
    ),
    'dtype': FlagSpec(
        'auto (bf16 on CUDA and on x86 CPUs with AVX2 + FMA + F16C or native bf16, where the CPU kernels '
        'run; else fp32; the log says which and why), float32, bfloat16, float16',
        choices=DTYPE_CHOICES,
        value_aliases={'half': 'float16', 'float': 'float32'},
    ),
    'quantization': FlagSpec(
        'weights of the linear layers and the LM head: auto (on a CPU in a 16-bit dtype: gguf for a .gguf '
        'model, int8 for a 4-bit AWQ / GPTQ checkpoint, whose layers stay 4-bit; else none), none (the --dtype; '
        'stored quantized weights dequantized to it), int8 (quantized at load, '
        'symmetric, an fp32 scale per 64 input rows of each output column; a GGUF Q8_0 tensor is taken as '
        "stored; embeddings, norms and biases stay --dtype; CPU in bf16/fp16: zserve's int8 x int8 GEMM, "
        'the activations quantized per row in blocks of 32 at each product (--gemm-backend zserve_widen '
        'keeps them), in fp32 the weights-only GEMM; elsewhere dequantized on the fly) '
        '(model_proc/weights/int8_weights.py), int4 (quantized at load, asymmetric 4-bit in groups of 32 input '
        "rows as GGUF's Q4_1, run by the int8 x int8 GEMM's 4-bit path) (model_proc/weights/int4_weights.py), "
        'or gguf (a .gguf model only: its quantized matrices kept as '
        'the file stores them, Q4_0/Q4_1/Q4_K as 4-bit codes, Q6_K as 6-bit codes, '
        'Q8_0/Q5_0/Q5_1/Q5_K/IQ4_NL/IQ4_XS/Q3_K/Q2_K '
        'as int8 codes, run by the int8 x int8 GEMM; other matrices quantized to int8) '
        '(model_proc/weights/gguf_blocks.py)',
        choices=("auto", *QUANTIZATION_CHOICES),
        peer_note="vLLM/SGLang --quantization (their int8 schemes: w8a8, activations quantized per token; "
        "here per block of 32, as llama.cpp's Q8_0)",
    ),
    'packed_cache': FlagSpec(
        "--quantization gguf: on (the file's matrices, once packed into the int8 x int8 GEMM's layout, are "
        'kept in the model\'s cache directory, <cache root>/gguf/<file>-<key>/packed/, as many bytes as the '
        'resident weights, and read back on later starts instead of packed again; rebuilt when the file, the '
        'layout or zserve changes, or when it does not check) or off (packed at every start, nothing written) '
        '(model_proc/checkpoints/packed_cache.py); default $ZSERVE_PACKED_CACHE when set',
        choices=PACKED_CACHE_CHOICES,
        env='ZSERVE_PACKED_CACHE',
        peer_note='none',
    ),
    'context_length': FlagSpec(
        "tokens of prompt + output a request may use at most (0 = the model's maximum; above it is "
        'refused)',
        aliases=('--max-model-len',),
        min=0,
    ),
    'seed': FlagSpec(
        'seed for per-request seeds drawn when a request gives none',
        aliases=('--random-seed',),
        min=0,
    ),
    'enable_lora': FlagSpec(
        'serve LoRA adapters (PEFT directories, --lora-modules): a request names one by lora_path, or by '
        '`model` on the OpenAI routes; requests for different adapters and none share a step',
    ),
    'lora_modules': FlagSpec(
        'with --enable-lora: the adapters, NAME=PATH [NAME=PATH ...] (a PATH alone is named by itself), each a '
        'PEFT directory (adapter_config.json + adapter_model.safetensors), loaded at start',
        aliases=('--lora-paths',),
        nargs='+',
        peer_note='vLLM --lora-modules; SGLang --lora-paths',
    ),
    'max_loras': FlagSpec(
        'with --enable-lora: adapters the server may load at most',
        aliases=('--max-loras-per-batch',),
        min=1,
    ),
    'max_lora_rank': FlagSpec(
        'with --enable-lora: the largest adapter rank r accepted',
        min=1,
    ),
    # ParallelSection
    'device': FlagSpec(
        'cpu, cuda, cuda:N or auto',
    ),
    'tp_size': FlagSpec(
        'tensor-parallel ranks: model worker processes holding one shard each, joined by '
        'torch.distributed (NCCL on CUDA, gloo on CPU); on CUDA local rank i uses cuda:i',
        aliases=('--tensor-parallel-size', '--tp'),
        min=1,
    ),
    'nnodes': FlagSpec(
        'machines the --tp-size ranks are spread over, tp_size / nnodes each; node 0 runs the whole '
        'server',
        min=1,
    ),
    'node_rank': FlagSpec(
        "this machine's index, 0..nnodes-1; a node other than 0 runs only its model worker ranks and "
        'joins node 0',
        min=0,
    ),
    'dist_init_addr': FlagSpec(
        'host:port of node 0, reachable from every node (required with --nnodes > 1): torch.distributed '
        'meets on port, rank 0 broadcasts batches on port + 1; empty = a private file rendezvous, '
        'loopback only',
    ),
    # CacheSection
    'page_size': FlagSpec(
        'tokens per KV page',
        aliases=('--block-size',),
        min=1,
    ),
    'kv_cache_tokens': FlagSpec(
        'KV pool size in tokens (0 = size from free memory)',
        aliases=('--max-total-tokens',),
        min=0,
    ),
    'mem_fraction_static': FlagSpec(
        "share of the device's whole memory (RAM on CPU: MemTotal or the cgroup limit) for the weights "
        'plus the KV pool, which gets what the weights leave (0 = off: --kv-memory-fraction sizes the '
        'pool)',
        aliases=('--gpu-memory-utilization',),
        min=0.0,
        below=1.0,
        peer_note="SGLang --mem-fraction-static (weights + KV); vLLM --gpu-memory-utilization (all of the "
        "engine's memory; here activations are not counted)",
    ),
    'kv_memory_fraction': FlagSpec(
        'fraction of free memory for the KV pool when --kv-cache-tokens is 0',
        above=0.0,
        below=1.0,
    ),
    'kv_cache_dtype': FlagSpec(
        "the KV cache's element type: auto (the model's dtype), int8 (a scale per token and KV head, as "
        "llama.cpp's q8_0 cache; about half the bytes, so about twice the pages for the same memory), or "
        "fp8_e4m3 / fp8_e5m2 (fp8 = fp8_e4m3; one byte a value, scale 1.0, values clamped to the format's range: "
        "exactly twice the pages of a 16-bit cache); the CPU kernel reads each in place",
        choices=KV_CACHE_DTYPES,
        value_aliases={'fp8': 'fp8_e4m3'},
        peer_note="SGLang / vLLM --kv-cache-dtype (fp8 scale 1.0: their default without calibrated scales); "
        "llama.cpp -ctk/-ctv q8_0",
    ),
    # SchedulerSection
    'max_running_requests': FlagSpec(
        'request slots (rows of the request table)',
        aliases=('--max-num-seqs',),
        min=1,
    ),
    'max_prefill_tokens': FlagSpec(
        "tokens of prompt computed per step at most (SGLang's --chunked-prefill-size, vLLM's "
        '--max-num-batched-tokens): longer prompts are chunked',
        flag='--chunked-prefill-size',
        aliases=('--max-num-batched-tokens',),
        min=1,
        deprecated={'--max-prefill-tokens': "SGLang's --max-prefill-tokens is another budget"},
    ),
    'max_step_ms': FlagSpec(
        'while requests decode, the prefill chunk beside them is sized from the measured cost per token so a step '
        'takes at most this many ms (scheduler_proc/step_time_bound.py): -1 = no bound (the token budget alone, '
        'as SGLang and vLLM), 0 = auto (3x a decode-only step); shorter gaps in running streams for a longer TTFT '
        'of the prompt and fewer tokens/s under load (README, Scheduling)',
        min=-1,
        peer_note="none in SGLang or vLLM (their chunk is a token count only)",
    ),
    'prefill_max_requests': FlagSpec(
        'requests newly admitted per prefill step at most, next to the token budget (0 = no cap)',
        min=0,
    ),
    'schedule_policy': FlagSpec(
        'what a step runs: prefill-first, decode-first or mixed (prefill chunks and decodes together)',
        flag='--step-policy',
        choices=STEP_POLICIES,
        deprecated={
            '--schedule-policy': "SGLang's --schedule-policy orders the queue; here that is --admission-policy",
        },
        peer_note="none (SGLang's --schedule-policy orders the queue: --admission-policy here)",
    ),
    'admission_policy': FlagSpec(
        'fifo or pack',
        choices=ADMISSION_POLICIES,
        peer_note='SGLang --schedule-policy fcfs = fifo',
    ),
    'admission_lookahead': FlagSpec(
        'pending requests the pack policy looks at',
        min=1,
    ),
    'force_fifo_every': FlagSpec(
        'pack policy: every N-th prefill step is fifo so long prompts cannot starve',
        min=1,
    ),
    'kv_reservation': FlagSpec(
        'KV kept promised to admitted requests: estimated (their prompt plus a decaying estimate of their '
        'output; a decode step short of pages retracts the newest running requests, which resume later) '
        'or full (prompt plus all of max_tokens; never retracts)',
        choices=KV_RESERVATIONS,
    ),
    'schedule_conservativeness': FlagSpec(
        "scales the estimated reservation's output ratio (start 0.7, floor 0.1): above 1 admits fewer "
        'requests and retracts less',
        above=0.0,
    ),
    'disable_radix_cache': FlagSpec(
        'turn prefix caching off',
        aliases=('--no-enable-prefix-caching',),
        switches={'--enable-prefix-caching': False},
    ),
    'overlap_schedule': FlagSpec(
        'overlap scheduling: build and send each step while the one before runs, so the worker never waits for '
        "the scheduler's turn (rows that need the last token, under a grammar, penalties or speculative decoding, "
        'wait a step; scheduler_proc/overlap_rows.py); auto = on where the worker computes on CUDA, off on a CPU '
        "(there the scheduler's turn takes a core from the worker: README, Scheduling)",
        choices=OVERLAP_SCHEDULES,
        switches={'--enable-overlap-schedule': 'on', '--disable-overlap-schedule': 'off'},
        peer_note="SGLang's --enable-overlap-schedule / --disable-overlap-schedule (on by default there, on GPUs)",
    ),
    'grammar_backend': FlagSpec(
        'structured output (json_object, json_schema, regex, ebnf, tool_choice required or named): '
        'xgrammar (readied in the background at startup), or none (such requests are refused)',
        aliases=('--guided-decoding-backend',),
        choices=GRAMMAR_BACKENDS,
        peer_note='SGLang --grammar-backend; vLLM --guided-decoding-backend (both default to xgrammar)',
    ),
    'max_queued_requests': FlagSpec(
        "waiting requests beyond which new ones are refused with 'server busy'",
        min=1,
    ),
    'log_stats_interval_s': FlagSpec(
        "seconds between the scheduler's stats lines while busy (throughput, running/waiting/retracted, "
        'KV usage, prefix-cache hits; silent when idle; 0 = off)',
        min=0.0,
        switches={'--disable-log-stats': 0.0},
        peer_note='vLLM logs every 10 s (--disable-log-stats); SGLang every --decode-log-interval steps',
    ),
    # SpeculationSection
    'speculative_algorithm': FlagSpec(
        "speculative decoding: none, or ngram (drafts from n-gram matches in the request's own prompt + "
        'output, verified by the model in one forward: same tokens, fewer steps on repetitive text; rows '
        'asking for logprobs, penalties or a grammar are not drafted)',
        choices=SPECULATIVE_ALGORITHMS,
        value_aliases={'NGRAM': 'ngram', 'NONE': 'none'},
        peer_note='SGLang --speculative-algorithm NGRAM; vLLM --speculative-config \'{"method": "ngram"}\'',
    ),
    'speculative_num_draft_tokens': FlagSpec(
        'speculative decoding: draft tokens proposed per request per step at most',
        min=1,
        max=64,
        peer_note='SGLang --speculative-num-draft-tokens; vLLM num_speculative_tokens (in --speculative-config)',
    ),
    'speculative_ngram_min_match_window_size': FlagSpec(
        'ngram speculation: the shortest tail of the sequence matched against its earlier tokens',
        aliases=('--ngram-prompt-lookup-min',),
        min=1,
        peer_note="SGLang's same name; vLLM prompt_lookup_min (in --speculative-config)",
    ),
    'speculative_ngram_max_match_window_size': FlagSpec(
        'ngram speculation: the longest tail of the sequence matched against its earlier tokens (tried '
        'first)',
        aliases=('--ngram-prompt-lookup-max',),
        min=1,
        peer_note="SGLang's same name; vLLM prompt_lookup_max (in --speculative-config)",
    ),
    'speculative_disable_by_batch_size': FlagSpec(
        'speculative decoding: no drafts in a step with at least this many decoding requests (0 = never '
        'off): a large batch already keeps a CPU busy, and a rejected draft then costs as much as a '
        'generated token',
        min=0,
        peer_note="vLLM's --speculative-disable-by-batch-size (disable_by_batch_size in --speculative-config)",
    ),
    'speculative_config': FlagSpec(
        'speculative decoding as vLLM\'s JSON, e.g. {"method": "ngram", "num_speculative_tokens": 5, '
        '"prompt_lookup_max": 3, "prompt_lookup_min": 1}: sets the four --speculative-* flags above (its '
        'keys win); only method ngram',
        peer_note='vLLM --speculative-config (method ngram)',
    ),
    # KernelSection
    'num_threads': FlagSpec(
        "torch threads in the model worker (0 = every core this process may use, shared among a node's "
        'ranks)',
        min=0,
    ),
    'omp_spin_count': FlagSpec(
        'GOMP_SPINCOUNT of the model worker: iterations an idle OpenMP thread spins before it sleeps (0 = '
        'sleep at once)',
        min=0,
    ),
    'cpu_isa': FlagSpec(
        "x86 features the CPU kernels are built for: auto (every one the CPU has, from /proc/cpuinfo), a "
        f"level ({', '.join(LEVELS)}) or features joined by + (of {', '.join(FEATURES)}; e.g. avx2+avx_vnni), "
        'so one machine runs every path; a feature this CPU lacks is refused (common/isa_features.py); '
        'default $ZSERVE_CPU_ISA when set',
        env=CPU_ISA_ENV,
        peer_note='none',
    ),
    'gemm_backend': FlagSpec(
        "CPU linear layers: auto (bf16 with native bf16: zserve's bf16 GEMM for products of few rows and "
        "oneDNN's for many, two copies of the weights, the crossover measured at start; else zserve's "
        "widening GEMM where it runs, else oneDNN; with --quantization int8 in a 16-bit dtype: int8 weights "
        "times activations quantized to int8, VNNI where the CPU has it), zserve_bf16 (zserve's bf16 GEMM "
        "alone: one copy), zserve_widen (int8: weights widened to float, activations kept), zserve_dot "
        "(int8 x int8 in any dtype), onednn, or torch (torch.mm, the reference); a choice this CPU or dtype cannot run "
        'falls back to the next (model_proc/layers/weight_kernels/); default $ZSERVE_GEMM when set',
        choices=GEMM_CHOICES,
        env='ZSERVE_GEMM',
        peer_note='none',
    ),
    'gemm_weight_copy': FlagSpec(
        'a second copy of the linear weights, in bf16 for oneDNN, for products of many rows (prefill '
        'chunks, large batches; AMX tiles where the CPU has them), beside zserve\'s layout for few rows: auto '
        '(kept while it fits a quarter of the memory free after loading, and not beside the codes of a file '
        'that stores its weights quantized: GGUF, AWQ, GPTQ), on (kept; the crossover is still measured), or '
        'off (one copy) (model_proc/layers/weight_kernels/weight_copy_policy.py); default $ZSERVE_GEMM_WEIGHT_COPY '
        'when set',
        choices=WEIGHT_COPY_CHOICES,
        env='ZSERVE_GEMM_WEIGHT_COPY',
        peer_note='none',
    ),
    'attention_backend': FlagSpec(
        "attention: auto (on CUDA flash-attn when installed, else the Triton kernels when triton is; on CPU "
        "zserve's paged-attention kernel where it builds; else torch), torch (the pure-torch path), kernel (the "
        'CPU kernel; refuse to start without it), or triton (the Triton paged-attention kernels, CUDA only; refused '
        'on CPU unless TRITON_INTERPRET=1); default $ZSERVE_ATTENTION when set',
        choices=ATTENTION_BACKENDS,
        env='ZSERVE_ATTENTION',
        peer_note="SGLang --attention-backend (its own backends' names)",
    ),
    'fused_ops': FlagSpec(
        'CPU fused norms, gated activation and rotary + K/V write: auto (where the kernels build) or off '
        "(torch's ops, the reference path); default $ZSERVE_FUSED_OPS when set",
        choices=FUSED_OPS_CHOICES,
        env='ZSERVE_FUSED_OPS',
        peer_note='none',
    ),
    'cuda_graph_max_bs': FlagSpec(
        'CUDA: the largest decode batch replayed from a captured CUDA graph (buckets 1, 2, 4, 8, then every 8 up '
        'to it, each captured on first use; a larger batch, or a step that is not a plain decode, runs eagerly); '
        'graphs need the triton attention backend and one rank (model_proc/cuda_graphs.py); accepted on CPU, no '
        'effect',
        min=1,
        peer_note='same name (SGLang)',
    ),
    'disable_cuda_graph': FlagSpec(
        'CUDA: run every decode step eagerly, no CUDA graphs; accepted on CPU, no effect (it has none)',
        aliases=('--enforce-eager',),
        peer_note="same name (SGLang); vLLM's --enforce-eager",
    ),
    # FrontendSection
    'host': FlagSpec(
        'interface clients connect on; loopback unless set',
    ),
    'zmq_port': FlagSpec(
        'the ZMQ port of the native clients, Client() / AsyncClient() / the chat shell (0 = pick a free '
        'one and print it; the default, when another server holds it, also picks a free one)',
        min=0,
        max=65535,
        peer_note="none (SGLang's and vLLM's clients speak HTTP)",
    ),
    'api_key': FlagSpec(
        "when set, every HTTP route but /health needs 'Authorization: Bearer KEY' (401 otherwise) and ZMQ "
        'clients must present it (api_key=, or $ZSERVE_API_KEY); read from $ZSERVE_API_KEY when empty',
    ),
    'max_request_bytes': FlagSpec(
        'HTTP: largest request body accepted (413 above)',
        min=1,
    ),
    'client_timeout_s': FlagSpec(
        "abort a client's requests when it sends no heartbeat for this long",
        above=0.0,
    ),
    'startup_timeout_s': FlagSpec(
        'how long to wait for every process to be ready',
        above=0.0,
    ),
    'drain_timeout_s': FlagSpec(
        "on SIGTERM or a first Ctrl-C: stop admitting (new requests get 'server shutting down', HTTP 503) "
        'and let in-flight requests finish for up to this many seconds before aborting the rest (0 = '
        'abort at once; a second signal aborts at once)',
        min=0.0,
        peer_note='vLLM/SGLang drain on SIGTERM too',
    ),
    'log_level': FlagSpec(
        'debug, info, warning, error',
        choices=LOG_LEVELS,
    ),
    'shell': FlagSpec(
        'after start, open a terminal chat against the server',
    ),
    'ready_file': FlagSpec(
        'once every process is ready, write one JSON record there (launcher/server_ready.py: the '
        "launcher's pid, the client and HTTP ports), next to the `zserve ready` log line: for programs "
        'that start the server (empty = none)',
        peer_note='none',
    ),
    # HttpSection
    'http_port': FlagSpec(
        "port of the OpenAI-compatible HTTP server on --host: the OpenAI API, SGLang's native /generate, "
        '/metrics and /health (0 = no HTTP server)',
        flag='--port',
        aliases=('--http-port',),
        min=0,
        max=65535,
        peer_note="same meaning as SGLang's and vLLM's --port (their defaults: 30000, 8000)",
    ),
    'allowed_hosts': FlagSpec(
        'HTTP: Host names answered besides loopback names and --host, comma-separated (* = any); others '
        'get 403',
    ),
    'allowed_origins': FlagSpec(
        'HTTP: origins allowed cross-origin requests (CORS), comma-separated (* = any; empty = none: '
        'requests with another Origin get 403)',
    ),
    'strict_requests': FlagSpec(
        'HTTP: keep refusing OpenAI request fields this server does not know with a 400 (default: '
        'ignored, and logged once per field name, as vLLM does)',
        peer_note='none (vLLM and SGLang ignore unknown fields)',
    ),
    'watchdog_timeout_s': FlagSpec(
        'HTTP /health answers 503 stalled when requests wait or run and no model step has ended for this '
        'many seconds; a long step alone (a big model on CPU, a long prefill) keeps it 200',
        flag='--watchdog-timeout',
        above=0.0,
        peer_note='SGLang --watchdog-timeout (default 300 s; it kills the server instead)',
    ),
    'reasoning_parser': FlagSpec(
        "HTTP chat: a reasoning model's thinking (<think>...</think>) split from the answer into "
        'message.reasoning_content (streamed: delta.reasoning_content): qwen3 (thinking unless the request '
        'sends chat_template_kwargs enable_thinking false) or deepseek-r1 (always thinking); none keeps it '
        'in content (http_proc/reasoning.py)',
        choices=('none', *REASONING_PARSERS),
        value_aliases={'deepseek_r1': 'deepseek-r1'},
        peer_note="vLLM --reasoning-parser (qwen3, deepseek_r1); SGLang --reasoning-parser (qwen3, deepseek-r1)",
    ),
    'tool_call_parser': FlagSpec(
        'HTTP chat: the format tool calls are read in from answers to requests with tools: hermes '
        '(<tool_call> JSON; qwen25 is its SGLang name), llama3_json, mistral ([TOOL_CALLS]), qwen3_coder '
        '(<function=...> XML), pythonic ([f(a=1)]); auto picks it from the chat template (none found: '
        'calls stay text) (http_proc/tools/parser.py)',
        choices=('auto', *TOOL_CALL_FORMATS),
        value_aliases={'qwen25': 'hermes', 'qwen': 'hermes', 'llama3': 'llama3_json', 'llama4_pythonic': 'pythonic'},
        peer_note='vLLM --tool-call-parser (hermes, llama3_json, mistral, qwen3_coder, pythonic); SGLang '
        '--tool-call-parser (qwen25, llama3, mistral, qwen3_coder, pythonic)',
    ),
    'enable_auto_tool_choice': FlagSpec(
        'accepted for vLLM command lines; no effect: zserve reads tool calls under tool_choice auto (or '
        'none given) whenever it knows the format (--tool-call-parser or the chat template), where vLLM '
        'refuses tool_choice auto without this flag',
        peer_note='vLLM --enable-auto-tool-choice (SGLang has none)',
    ),
    'http_keep_alive_s': FlagSpec(
        'HTTP: how long an idle kept-alive connection stays open; longer than the idle-pool timeout of the '
        "clients in front (sglang-router's 90 s), so the server never closes a connection just as a client "
        'reuses it (the failed router health checks of uvicorn\'s 5 s default)',
        above=0.0,
        peer_note="uvicorn --timeout-keep-alive (vLLM: $VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s)",
    ),
    # FleetSection
    'dp_size': FlagSpec(
        'data-parallel replicas behind one endpoint: N whole servers on this machine, each pinned to its own '
        "cores (the allowed CPUs split into N disjoint sets, a NUMA node's cores to that node's replicas; "
        'launcher/fleet/core_split.py) with --num-threads = its core count unless given, each on a free '
        "loopback port, and sglang-router in front of them on --host:--port (pip install 'zserve[router]'; "
        'refused without it); a replica that exits is restarted (0 = one per NUMA node)',
        aliases=('--data-parallel-size',),
        min=0,
        peer_note='SGLang --dp-size (sglang_router.launch_server); vLLM --data-parallel-size',
    ),
    'router': FlagSpec(
        'the fleet with its router even at --dp-size 1 (with --dp-size N > 1 the router is always there): '
        'the router takes requests once every replica answers /health; a replica that dies leaves it and '
        'rejoins when restarted; the fleet ends if the router exits',
        peer_note='sglang_router.launch_server',
    ),
    'router_port': FlagSpec(
        "the router's HTTP port when it is not --port (0 = --port: the fleet's one endpoint)",
        min=0,
        max=65535,
        peer_note='sglang_router.launch_server --router-port',
    ),
    'router_policy': FlagSpec(
        'with --router: how it picks a replica: cache_aware (the replica whose prompts share the longest '
        'prefix, unless loads are too uneven), round_robin, random, power_of_two (the less loaded of two)',
        choices=ROUTER_POLICIES,
        peer_note='sglang_router --policy',
    ),
    'router_worker_urls': FlagSpec(
        "with --router: more servers for the router besides this machine's replicas (zserve or SGLang on "
        "other machines), URL [URL ...] (http://host:port); the router's health checks take them out and "
        'back',
        nargs='+',
        peer_note='sglang_router --worker-urls',
    ),
    'router_prometheus_port': FlagSpec(
        "with --router: port of the router's own Prometheus metrics (0 = a free one; a port in use stops "
        'the router)',
        min=0,
        max=65535,
        peer_note='sglang_router --prometheus-port',
    ),
    'router_args': FlagSpec(
        'with --router: more sglang_router.launch_router flags as one string, e.g. '
        "'--health-check-interval-secs 1 --retry-max-retries 3'; they come after the fleet's own, so they "
        'win',
        peer_note='none',
    ),
}
