"""How the linear layers' weights are stored and multiplied: the choice lists, declared once.

ServerConfig's `--gemm-backend` and `--quantization` flags (common/server_config.py) and the model
worker's kernel choice (model_proc/layers/weight_kernels/registry.py) read them from here. Torch-free,
so the launcher and the flags table import it without torch.
"""

from __future__ import annotations

# --gemm-backend: auto picks the fastest that runs
GEMM_CHOICES = ("auto", "zserve_bf16", "zserve_widen", "zserve_dot", "onednn", "torch")
# --quantization: none keeps --dtype; int8 (model_proc/weights/int8_weights.py); gguf keeps a GGUF file's quantized
# matrices as stored (model_proc/weights/gguf_blocks.py: 4-bit ones packed, the others as int8 codes)
QUANTIZATION_CHOICES = ("none", "int8", "int4", "gguf")  # int4: model_proc/weights/int4_weights.py
# --gemm-weight-copy: a second copy of the weights for products of many rows (model_proc/layers/weight_kernels/
# weight_copy_policy.py)
WEIGHT_COPY_CHOICES = ("auto", "on", "off")
# --dtype: the compute dtype and its short spellings (model_proc/compute_dtype.py maps each to a torch dtype)
DTYPE_CHOICES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
# --packed-cache: a GGUF file's packed matrices kept on disk (model_proc/checkpoints/packed_cache.py) or not
PACKED_CACHE_CHOICES = ("on", "off")
