"""The routed experts of a mixture-of-experts layer, each run once per step on the rows sent to it.

    x [T, hidden], expert_ids / weights [T, k]  (router.py)
    flatten the T x k (token, expert) pairs and sort them by expert (stable):

        pairs  | e0 e0 e0 | e2 | e5 e5 | ...      rows = token of each pair, counts = pairs per expert
        xs     = x[rows]                           [T * k, hidden], grouped by expert
        ys[i:j] = expert_e(xs[i:j])                one gate_up GEMM and one down GEMM per expert hit
        out[t] = sum over t's k pairs of ys * w    unsorted back to [T, k, hidden], summed over k

Each expert's gate_up and down are GemmWeights, so the runner packs them for the server's weight
kernel like any linear (bf16 zserve kernels, int8, 4-bit on CPU; torch matmul on CUDA and where no
kernel builds): that is the CPU path and the torch path alike, no loop over tokens. With tensor
parallelism each expert's intermediate dimension is split across ranks and `forward` returns this
rank's partial sum: the MoE block all-reduces once, after the experts and the shared expert.

A GGUF file's stacked experts kept as stored (--quantization gguf, the zserve_int8_dot kernel, one
rank, SiLU) load instead as one packed weight per projection and layer (stacked_experts.py): the
per-expert modules are dropped and `forward` is one zserve::moe_experts call, bit-identical to the loop.
"""

from __future__ import annotations

import torch
from torch import nn

from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.kernels.cpu_kernels import load_moe_experts
from zserve.model_proc.layers.activation import FUSED_GATED_ACTIVATIONS, get_activation
from zserve.model_proc.layers.linear import ColumnParallelLinear, RowParallelLinear
from zserve.model_proc.layers.stacked_experts import StackedExperts, join_per_expert


class ExpertMLP(nn.Module):
    """A gated MLP that returns this rank's partial sum (no all-reduce, no bias): an expert, or a shared expert."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str, tp_rank: int, tp_size: int):
        super().__init__()
        sizes = [intermediate_size, intermediate_size]
        self.gate_up_proj = ColumnParallelLinear(hidden_size, sizes, False, tp_rank, tp_size)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, False, tp_rank, tp_size)
        self.hidden_act = hidden_act
        self.act = get_activation(hidden_act, gated=True)

    def use_cpu_kernels(self) -> None:
        self.act = FUSED_GATED_ACTIVATIONS.get(self.hidden_act, self.act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [n, hidden] -> [n, 2I / tp] -> [n, I / tp] -> partial [n, hidden]
        return self.down_proj.matmul(self.act(self.gate_up_proj(x)), None)

    def load(self, ckpt: Checkpoint, prefix: str, names: tuple[str, str, str]) -> None:
        """`names`: the checkpoint's (gate, up, down) projections under `prefix`."""
        gate, up, down = names
        self.gate_up_proj.load(ckpt, [f"{prefix}.{gate}", f"{prefix}.{up}"])
        self.down_proj.load(ckpt, f"{prefix}.{down}")


class FusedExperts(nn.Module):
    def __init__(
        self, num_experts: int, hidden_size: int, intermediate_size: int, hidden_act: str, tp_rank: int, tp_size: int
    ):
        super().__init__()
        self.experts = nn.ModuleList(
            ExpertMLP(hidden_size, intermediate_size, hidden_act, tp_rank, tp_size) for _ in range(num_experts)
        )
        self.shape = (num_experts, hidden_size, intermediate_size)
        self.may_stack = tp_size == 1 and hidden_act == "silu"
        self.stacked: StackedExperts | None = None  # set by `load` where the checkpoint stacks the experts

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [T, hidden]; expert_ids int64 [T, k]; weights [T, k] -> [T, hidden]. As transformers'
        default (grouped_mm) experts: each product expert output x weight is in the wider of the
        two dtypes (fp32 for Mixtral's fp32 weights), the k of a token summed in it, rounded once to x's dtype."""
        if self.stacked is not None:
            return self.stacked(x, expert_ids, weights)
        num_tokens, top_k = expert_ids.shape
        flat_ids = expert_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)  # pairs grouped by expert, tokens ascending within
        rows = order // top_k  # the token of each sorted pair
        counts = torch.bincount(flat_ids, minlength=len(self.experts)).tolist()
        xs = x.index_select(0, rows)
        ys = torch.empty_like(xs)
        start = 0
        for expert, count in zip(self.experts, counts, strict=True):
            if count:
                ys[start : start + count] = expert(xs[start : start + count])
                start += count
        scaled = ys * weights.reshape(-1, 1).index_select(0, order)
        pairs = torch.empty_like(scaled)
        pairs[order] = scaled  # back to (token, k) order
        return pairs.view(num_tokens, top_k, -1).sum(dim=1).to(x.dtype)

    def load(self, ckpt: Checkpoint, prefix: str, names: tuple[str, str, str]) -> None:
        self.stacked = self._load_stacked(ckpt, prefix, names)
        if self.stacked is not None:
            self.experts = nn.ModuleList()  # their weights were never filled: nothing of them stays
            return
        for i, expert in enumerate(self.experts):
            expert.load(ckpt, f"{prefix}.{i}", names)

    def _load_stacked(self, ckpt: Checkpoint, prefix: str, names: tuple[str, str, str]) -> StackedExperts | None:
        """The experts as stacked_experts.py runs them, where this layer, the kernel and the file allow."""
        kernel = self.experts[0].gate_up_proj.pack_on_load
        if not self.may_stack or kernel is None or load_moe_experts() is None:
            return None
        num_experts, hidden, intermediate = self.shape
        gate, up, down = names
        stacked = [ckpt.packed_experts(f"{prefix}.{name}.weight", shape) for name, shape in (
            (gate, (num_experts, intermediate, hidden)), (up, (num_experts, intermediate, hidden)),
            (down, (num_experts, hidden, intermediate)))]
        in_features = (hidden, hidden, intermediate)
        kernels = [kernel.kernel_for(k) for k in in_features]
        if any(s is None or not k.takes_stored(s) for s, k in zip(stacked, kernels, strict=True)):
            return None  # (a projection packed here is dropped: the loop reads it again, expert by expert)
        gate_up = join_per_expert(stacked[0], stacked[1], num_experts)
        return None if gate_up is None else StackedExperts(num_experts, gate_up, stacked[2])
