"""Activations by their config.json names; gated ones take the fused [gate | up] projection."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)  # [T, 2 * I] -> 2 x [T, I]
    return F.silu(gate) * up


def fused_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu_and_mul in one call (kernels/fused_ops.cpp), rounding where it does."""
    return torch.ops.zserve.silu_mul(x)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """GeGLU (Gemma): gelu_tanh(gate) * up, each rounded to x's dtype as transformers does."""
    gate, up = x.chunk(2, dim=-1)  # [T, 2 * I] -> 2 x [T, I]
    return F.gelu(gate, approximate="tanh") * up


GATED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": silu_and_mul, "swish": silu_and_mul, "gelu_pytorch_tanh": gelu_tanh_and_mul,
}
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "gelu": F.gelu,
    "relu": F.relu,
}


FUSED_GATED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": fused_silu_and_mul, "swish": fused_silu_and_mul,
}


def get_activation(name: str, gated: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    table = GATED_ACTIVATIONS if gated else ACTIVATIONS
    if name not in table:
        raise ValueError(f"activation {name!r} is not supported here; supported: {', '.join(table)}")
    return table[name]
