"""The mixture-of-experts part of a config.json (Qwen3-MoE, Qwen2-MoE, Mixtral), read without torch, spelled
as the architecture's spec says (ArchSpec.moe).

    layer i is sparse  <=>  num_experts > 0 and i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    (Mixtral: every layer)

A sparse layer routes each token to `num_experts_per_tok` of `num_experts` gated MLPs of
`expert_intermediate_size` (plus, in Qwen2-MoE, one shared expert every token takes, scaled by a
sigmoid gate); a dense layer is the ordinary MLP of `intermediate_size`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zserve.common.architectures.arch_spec import MoeKeys


@dataclass(frozen=True, slots=True)
class MoeConfig:
    num_experts: int
    num_experts_per_tok: int  # top-k
    expert_intermediate_size: int
    norm_topk_prob: bool  # renormalise the top-k probabilities to sum to 1
    shared_expert_intermediate_size: int = 0  # 0: no shared expert
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def is_sparse_layer(self, layer_idx: int) -> bool:
        return (
            self.num_experts > 0
            and layer_idx not in self.mlp_only_layers
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )

    def sparse_mlp_params(self, hidden_size: int, active_only: bool) -> int:
        """Weights of one sparse layer's MLP: router, experts (all, or the top-k a token runs), shared expert."""
        num_experts = self.num_experts_per_tok if active_only else self.num_experts
        shared = 3 * hidden_size * self.shared_expert_intermediate_size + (hidden_size if self.has_shared_expert else 0)
        return hidden_size * self.num_experts + num_experts * 3 * hidden_size * self.expert_intermediate_size + shared

    @property
    def has_shared_expert(self) -> bool:
        return self.shared_expert_intermediate_size > 0

    @staticmethod
    def from_config(raw: dict[str, Any], keys: MoeKeys | None, path: Path) -> MoeConfig | None:
        """The MoE settings spelled as `keys` (an ArchSpec's; None for a dense architecture) say;
        ValueError naming the field."""
        if keys is None:
            return None
        num_experts = _int(raw, path, ("num_experts", "num_local_experts"), minimum=0)
        top_k = _int(raw, path, ("num_experts_per_tok",), minimum=1)
        if num_experts and top_k > num_experts:
            raise ValueError(f"{path}: num_experts_per_tok={top_k} is more than num_experts={num_experts}")
        only = raw.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
            raise ValueError(f"{path}: 'mlp_only_layers' must be a list of layer indices, got {only!r}")
        return MoeConfig(
            num_experts=num_experts,
            num_experts_per_tok=top_k,
            expert_intermediate_size=_int(raw, path, (keys.width_key,), minimum=1),
            norm_topk_prob=keys.always_norm_topk or bool(raw.get("norm_topk_prob", False)),
            shared_expert_intermediate_size=(
                _int(raw, path, ("shared_expert_intermediate_size",), minimum=1) if keys.shared_expert else 0
            ),
            decoder_sparse_step=_int(raw, path, ("decoder_sparse_step",), minimum=1, default=1),
            mlp_only_layers=tuple(only),
        )


def _int(raw: dict[str, Any], path: Path, keys: tuple[str, ...], minimum: int, default: int | None = None) -> int:
    """The first of `keys` config.json has (not null), an int >= minimum."""
    value = next((raw[k] for k in keys if raw.get(k) is not None), default)
    if value is None:
        raise ValueError(f"{path}: missing {' / '.join(repr(k) for k in keys)}")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{path}: {keys[0]!r} must be an integer >= {minimum}, got {value!r}")
    return value
