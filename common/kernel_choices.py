"""The model worker's kernel choices besides the GEMM's (common/weight_formats.py), declared once: the flags table
(server_flags.py) offers them and their owners (model_proc/layers/attention.py, model_proc/kernels/cpu_kernels.py)
check against them. Torch-free."""

from __future__ import annotations

# --attention-backend: auto, the pure-torch path, the CPU kernel, or the Triton kernels (CUDA)
ATTENTION_BACKENDS = ("auto", "torch", "kernel", "triton")
FUSED_OPS_CHOICES = ("auto", "off")  # --fused-ops: the C++ fused ops where they are built, or none
# --kv-cache-dtype: the model's 16-bit (or fp32) dtype, int8 with a scale per token and KV head
# (model_proc/layers/kv_int8.py), or fp8 with scale 1.0 (model_proc/layers/kv_fp8.py)
KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3", "fp8_e5m2")
