"""The model worker's kernel choices besides the GEMM's (common/weight_formats.py), declared once: the flags table
(server_flags.py) offers them and their owners (model_proc/layers/attention.py, model_proc/kernels/cpu_kernels.py)
check against them. Torch-free."""

from __future__ import annotations

# --attention-backend: auto, the pure-torch path, the CPU kernel, or the Triton kernels (CUDA)
ATTENTION_BACKENDS = ("auto", "torch", "kernel", "triton")
FUSED_OPS_CHOICES = ("auto", "off")  # --fused-ops: the C++ fused ops where they are built, or none
