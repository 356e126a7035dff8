"""Read a GGUF file's tensors, named as its architecture's spec says (common/architectures/: GgufSpec).

The launcher turns `--model X.gguf` into a small directory (launcher/gguf_model_dir.py) whose
`gguf_source.json` names the file (common/gguf_source.py); the gguf quantization method
(quant/gguf.py) detects such a directory and opens this reader. gguf.GGUFReader memory-maps it:

    blk.N.attn_q.weight  -> model.layers.N.self_attn.q_proj.weight   (llama: rows un-permuted)
    blk.N.ffn_gate.weight -> model.layers.N.mlp.gate_proj.weight      ... (the spec's block_names)
    token_embd / output_norm / output -> model.embed_tokens / model.norm / lm_head
    blk.N.ffn_gate_inp.weight  -> model.layers.N.mlp.gate.weight   (the MoE router)
    blk.N.ffn_gate_exps.weight [n_expert, I, H] -> model.layers.N.mlp.experts.{e}.gate_proj.weight, one 2-D
        slice per expert (ffn_up_exps, ffn_down_exps likewise; Mixtral, llama.cpp arch `llama`:
        block_sparse_moe.experts.{e}.w1 / w3 / w2); a slice is read, dequantized or kept as stored like a matrix

F32/F16/BF16 tensors are taken as stored; every other type is dequantized (float32, then cast
to the parameter's dtype by `copy_into`), one log line per type. A tensor-parallel rank
dequantizes the whole tensor and keeps its slice.

Which matrices come back as stored is the served quantization method's (quant/: `served`, its
`gguf_types_kept` and `gguf_packs`); this reader only knows how. --quantization int8 keeps Q8_0
(blocks of 32 values along a row, i.e. along the input dimension, each an fp16 scale d and 32 int8
q; the value is q * d): `read_weight` returns such a matrix as stored (`stored_weight`), an
`Int8Weight` (weights/int8_weights.py: q and d un-permuted and sliced as `read` would slice the
floats, group size 32), and the linear layer or LM head packs those values instead of quantizing
its float weight again. A TP column slice through a block is read as floats. Without it
(--quantization none), Q8_0 is dequantized like any other type.

--quantization gguf keeps every matrix of a type in gguf_blocks.STORED_TYPES as stored (Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS: 4-bit codes as an `Int4Weight`, the
others as int8 codes with their scales and offsets, `Int8Weight`; the table's `code_bits`),
un-permuted and sliced as `read` slices the floats; a matrix of another type (F16, IQ2_XXS, ...)
comes as floats and the kernel quantizes it to int8.
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from zserve.common.architectures import spec_for_gguf
from zserve.common.architectures.arch_spec import GgufSpec
from zserve.common.architectures.gemma_gguf import NORM_SHIFT, is_shifted_norm
from zserve.common.architectures.gguf_names import GGUF_TO_HF, GLOBAL_NAMES
from zserve.common.int_math import cdiv
from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.checkpoints.gguf_file import GGUFFile
from zserve.model_proc.checkpoints.packed_cache import PackedCache
from zserve.model_proc.kernels.cpu_kernels import load_gguf_pack
from zserve.model_proc.weights.compact_scales import CompactScales
from zserve.model_proc.weights.gguf_blocks import block_type, decode
from zserve.model_proc.weights.int4_weights import Int4Weight
from zserve.model_proc.weights.int8_weights import Int8Weight
from zserve.model_proc.weights.packed_blocks_weight import PackedBlocks

logger = logging.getLogger(__name__)

BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# rope scaling factors (llama 3's, phi3's longrope): config.json carries them (launcher/gguf_model_dir.py)
SKIPPED = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")  # stacked [n_expert, out, in]: MoeNames.projections
ROUTER_TENSOR = "ffn_gate_inp"


@dataclass(frozen=True)
class ExpertSlice:
    """One expert's 2-D matrix of a stacked GGUF tensor, read like a ReaderTensor (shape innermost first)."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, int]
    data: np.ndarray  # this expert's rows (bytes per row for a quantized type)


class ServedMethod(Protocol):
    """What this reader asks of the quantization method a server runs (quant/quant_method.py)."""

    name: str  # the --quantization, for the log
    gguf_types_kept: frozenset[str]  # GGUF types whose matrices `stored_weight` returns as stored
    gguf_packs: bool  # those packed by kernels/gguf_pack.cpp where it knows the type, else decoded to codes


class MoeTensorNames(Protocol):
    """Where the model keeps a sparse layer's tensors (layers/sparse_moe.py MoeNames, the model's `names`)."""

    block: str
    projections: tuple[str, str, str]


def hf_name(gguf_name: str, block_names: dict[str, str] = GGUF_TO_HF) -> str | None:
    """The Hugging Face name of a GGUF tensor (None for one we do not load)."""
    if gguf_name in SKIPPED:
        return None
    base, _, kind = gguf_name.rpartition(".")
    if base in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[base]}.{kind}"
    m = BLOCK_NAME.fullmatch(gguf_name)
    if m is None or m.group(2) not in block_names:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no Llama/Qwen counterpart")
    return f"model.layers.{m.group(1)}.{block_names[m.group(2)]}.{m.group(3)}"


def moe_tensors(t, names: MoeTensorNames | None) -> dict[str, object] | None:
    """A MoE layer's router or stacked experts (`t` a ReaderTensor) by Hugging Face name (one
    ExpertSlice per expert); None for any other tensor."""
    m = BLOCK_NAME.fullmatch(t.name)
    if m is None or m.group(3) != "weight" or (m.group(2) != ROUTER_TENSOR and m.group(2) not in EXPERT_TENSORS):
        return None
    if names is None:
        raise ValueError(f"GGUF tensor {t.name!r} belongs to a mixture-of-experts layer, but the model has none")
    block = f"model.layers.{m.group(1)}.{names.block}"
    if m.group(2) == ROUTER_TENSOR:
        return {f"{block}.gate.weight": t}
    projection = names.projections[EXPERT_TENSORS.index(m.group(2))]
    if len(t.shape) != 3:
        raise ValueError(f"GGUF tensor {t.name!r} has shape {list(t.shape)}; expected [in, out, n_expert]")
    shape = (int(t.shape[0]), int(t.shape[1]))
    return {
        f"{block}.experts.{e}.{projection}.weight": ExpertSlice(f"{t.name}[{e}]", t.tensor_type, shape, t.data[e])
        for e in range(int(t.shape[2]))
    }


def stacked_name(expert_name: str) -> str:
    """`...experts.<e>.<projection>.weight` -> `...experts.<projection>.weight`: a stacked tensor's name."""
    head, _, rest = expert_name.partition(".experts.")
    return f"{head}.experts.{rest.partition('.')[2]}"


def unpermute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf's `permute` of q/k rows, as transformers' LlamaTensorProcessor does.

    Per head of d rows, h = d/2: llama.cpp rotates adjacent pairs, so the file holds
    (r0, r_h, r1, r_h+1, ...); our rotary (rotate_half) wants the halves (r0..r_h-1, r_h..r_d-1)."""
    head_dim_half = weight.shape[0] // num_heads // 2
    w = weight.reshape(num_heads, head_dim_half, 2, *weight.shape[1:])
    return w.transpose(1, 2).reshape(weight.shape)



def _resident_codes(type_name: str) -> str:
    """How a stored type's codes are kept: Q6_K packed at load as 6-bit codes (kernels/six_bit_codes.h), the
    4-bit types in nibbles, the others as int8 codes."""
    if type_name == "Q6_K" and load_gguf_pack() is not None:
        return "6-bit codes"
    return "4-bit codes" if block_type(type_name).code_bits == 4 else "int8 codes"

class GGUFCheckpoint(Checkpoint):
    def __init__(
        self, model_dir: str | Path, gguf_file: Path, show_progress: bool = False, served: ServedMethod | None = None,
        moe_names: MoeTensorNames | None = None, packed_cache: PackedCache | None = None,
    ):
        """`served`: the method the server runs (None: every matrix as floats); `moe_names`: the
        model's MoE naming (its `names`; None for a model without sparse layers); `packed_cache`:
        where gguf_pack's results are read from or written to (None: packed, nothing kept)."""
        import gguf

        self.gguf_file, self.served, self.packed_cache = gguf_file, served, packed_cache
        self._gguf = gguf
        self._file = GGUFFile(gguf_file)  # a truncated or lying file: one ValueError naming the tensor
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        architecture = self._file.strings.get("general.architecture", "")
        spec = spec_for_gguf(architecture)
        self._gguf_spec = spec.gguf if spec is not None else GgufSpec(name=architecture)  # Llama names, as stored
        block_names = self._gguf_spec.block_names
        self._tensors = {}
        self._stacked: dict[str, object] = {}  # experts.<projection>.weight under a MoE block -> its stacked tensor
        for t in self._file.tensors:
            experts = moe_tensors(t, moe_names)
            self._tensors.update(experts or {hf_name(t.name, block_names): t})
            if experts is not None and len(t.shape) == 3:
                self._stacked[stacked_name(next(iter(experts)))] = t
        self._tensors.pop(None, None)
        self._num_heads = int(config["num_attention_heads"])
        self._num_kv_heads = int(config.get("num_key_value_heads") or self._num_heads)
        super().__init__(model_dir, show_progress=show_progress)
        self._log_types()

    def _index(self) -> dict[str, str]:
        return dict.fromkeys(self._tensors, self.gguf_file.name)

    def file_bytes_by_type(self) -> dict[str, int]:
        """Bytes of the file's tensors by GGML type ("Q4_K", "F32", ...)."""
        totals: dict[str, int] = {}
        for t in self._file.tensors:
            totals[t.tensor_type.name] = totals.get(t.tensor_type.name, 0) + int(t.n_bytes)
        return totals

    def _log_types(self) -> None:
        float_types = {"F32", "F16", "BF16"}
        counts = Counter(t.tensor_type.name for t in self._tensors.values())
        kept = self.served.gguf_types_kept if self.served is not None else frozenset()
        for type_name, n in sorted(counts.items()):
            if type_name in float_types:
                logger.info("GGUF %s: %d %s tensors read as stored", self.gguf_file.name, n, type_name)
            elif type_name in kept and self.served.gguf_packs:
                logger.info("GGUF %s: %d %s tensors kept as stored for --quantization %s (%s; an embedding table "
                            "too, its rows decoded at lookup, where the CPU kernels pack it)", self.gguf_file.name, n,
                            type_name, self.served.name, _resident_codes(type_name))
            elif type_name in kept:
                block = block_type(type_name)
                logger.info("GGUF %s: %d %s tensors: matrices kept as stored for --quantization %s (%d-bit codes, "
                            "a scale per %d input rows), a lookup-only embedding dequantized", self.gguf_file.name, n,
                            type_name, self.served.name, block.code_bits, block.group_size)
            elif type_name == "Q8_0":
                logger.info("GGUF %s: %d Q8_0 tensors dequantized to float32 (--quantization int8 keeps them as int8)",
                            self.gguf_file.name, n)
            else:
                logger.info("GGUF %s: %d %s tensors dequantized to float32", self.gguf_file.name, n, type_name)

    def _unpermute(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if self._gguf_spec.permuted_qk and ".self_attn.q_proj." in name:
            return unpermute_rows(tensor, self._num_heads)
        if self._gguf_spec.permuted_qk and ".self_attn.k_proj." in name:
            return unpermute_rows(tensor, self._num_kv_heads)
        return tensor

    def _full_tensor(self, name: str) -> torch.Tensor:
        t = self._tensors[name]
        qtype = self._gguf.GGMLQuantizationType
        if t.tensor_type in (qtype.F32, qtype.F16):
            tensor = torch.from_numpy(np.array(t.data))  # a copy: the map is read-only
        elif t.tensor_type == qtype.BF16:
            raw = np.array(t.data).view(np.int16)
            tensor = torch.from_numpy(raw).view(torch.bfloat16)
            tensor = tensor.reshape(*raw.shape[:-1], -1)
        else:
            tensor = torch.from_numpy(self._gguf.quants.dequantize(t.data, t.tensor_type))
        self._file.release(t.data)  # copied or dequantized above: the file's pages are not needed again
        tensor = tensor.reshape(tuple(int(d) for d in reversed(t.shape)))  # GGML lists dims innermost first
        if self._gguf_spec.shifted_norms and is_shifted_norm(name):  # norms stored as 1 + w (Gemma)
            tensor = tensor - NORM_SHIFT  # exact in fp32 for stored values in [0.5, 2] (Sterbenz)
        return self._unpermute(name, tensor)

    def _check_shape(self, name: str, shape: tuple[int, ...], expected_shape: tuple[int, ...]) -> None:
        if tuple(shape) != tuple(expected_shape):
            raise ValueError(
                f"tensor {name!r} in {self.gguf_file} has shape {list(shape)}, "
                f"but config.json implies {list(expected_shape)}"
            )

    def read(
        self,
        name: str,
        expected_shape: tuple[int, ...],
        rows: tuple[int, int] | None = None,
        cols: tuple[int, int] | None = None,
        transpose: bool = False,
    ) -> torch.Tensor:
        """As Checkpoint.read; GGUF holds Llama/Qwen only, so never `transpose`."""
        assert not transpose, "GGUF checkpoints hold no Conv1D (GPT-2) weights"
        if name not in self._tensors:
            raise ValueError(f"tensor {name!r} is missing from {self.gguf_file}")
        tensor = self._full_tensor(name)
        self._check_shape(name, tuple(tensor.shape), expected_shape)
        if rows:
            tensor = tensor[rows[0]:rows[1]]
        if cols:
            tensor = tensor[:, cols[0]:cols[1]]
        self._progress.update(1)
        return tensor

    def stored_weight(
        self, name: str, expected_shape: tuple[int, ...], rows: tuple[int, int] | None, cols: tuple[int, int] | None
    ) -> Int8Weight | Int4Weight | PackedBlocks | None:
        """A matrix of a type the served method keeps, as stored: packed for the int8 x int8 kernel
        where the method packs and gguf_pack knows the type, else decoded to codes (None: floats)."""
        t = self._tensors.get(name)
        kept = self.served.gguf_types_kept if self.served is not None else frozenset()
        if t is None or len(t.shape) != 2 or t.tensor_type.name not in kept:
            return None
        packed = self._packed_weight(name, expected_shape, rows, cols) if self.served.gguf_packs else None
        return packed if packed is not None else self._decoded_weight(name, expected_shape, rows, cols)

    def _packed_weight(
        self, name: str, expected_shape: tuple[int, ...], rows: tuple[int, int] | None, cols: tuple[int, int] | None
    ) -> PackedBlocks | None:
        """Rows r0..r1 of a matrix (every column) packed by kernels/gguf_pack.cpp straight from the
        file into the int8 x int8 GEMM's layout, un-permuted, its file pages released; None where
        that op is not built or does not know the type, or for a slice of the columns."""
        t = self._tensors[name]
        out_features, in_features = (int(d) for d in reversed(t.shape))
        gguf_pack = load_gguf_pack()
        if gguf_pack is None or not torch.ops.zserve.gguf_pack_supports(t.tensor_type.name):
            return None
        if cols is not None and tuple(cols) != (0, in_features):
            return None
        self._check_shape(name, (out_features, in_features), expected_shape)
        r0, r1 = rows or (0, out_features)
        row_ids = self._unpermute(name, torch.arange(out_features))[r0:r1].contiguous()
        with warnings.catch_warnings():  # the map is read-only; gguf_pack only reads it
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            raw = torch.from_numpy(t.data)
        if self.packed_cache is None:
            values, *scale_parts, bits, group, implied_offset = gguf_pack(raw, t.tensor_type.name, row_ids, in_features)
        else:
            values, *scale_parts, bits, group, implied_offset = self.packed_cache.get_or_pack(
                name, (r0, r1), lambda: gguf_pack(raw, t.tensor_type.name, row_ids, in_features)
            )
        self._file.release(t.data)
        self._progress.update(1)
        compact = CompactScales(*(part if part.numel() else None for part in scale_parts), implied_offset)
        return PackedBlocks(values, compact, bits, group, in_features, r1 - r0)

    def packed_experts(self, name: str, expected_shape: tuple[int, int, int]) -> PackedBlocks | None:
        """Every expert's matrix of a stacked tensor (`name`: `model.layers.N.mlp.experts.<projection>.weight`,
        `expected_shape` [E, out, in]) packed in one gguf_pack call, each expert's column blocks after
        the previous one's, its file pages released; None unless --quantization gguf keeps this type as
        stored, gguf_pack is built and each expert's columns are whole 16-column blocks."""
        t = self._stacked.get(name)
        gguf_pack = load_gguf_pack()
        packs = self.served is not None and self.served.gguf_packs and t is not None
        if not packs or gguf_pack is None or t.tensor_type.name not in self.served.gguf_types_kept:
            return None
        if not torch.ops.zserve.gguf_pack_supports(t.tensor_type.name):
            return None
        in_features, out_features, num_experts = (int(d) for d in t.shape)
        self._check_shape(name, (num_experts, out_features, in_features), expected_shape)
        if out_features % 16:
            return None
        with warnings.catch_warnings():  # the map is read-only; gguf_pack only reads it
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            raw = torch.from_numpy(t.data.reshape(num_experts * out_features, -1))
        values, *scale_parts, bits, group, implied_offset = gguf_pack(
            raw, t.tensor_type.name, torch.arange(num_experts * out_features), in_features
        )
        self._file.release(t.data)
        self._progress.update(num_experts)
        compact = CompactScales(*(part if part.numel() else None for part in scale_parts), implied_offset)
        return PackedBlocks(values, compact, bits, group, in_features, num_experts * out_features)

    def _decoded_weight(
        self, name: str, expected_shape: tuple[int, ...], rows: tuple[int, int] | None, cols: tuple[int, int] | None
    ) -> Int8Weight | Int4Weight | None:
        """A matrix as gguf_blocks decodes it, un-permuted and sliced as `read` slices the floats,
        [in, out]; None for a column slice through a group (read as floats)."""
        t = self._tensors[name]
        out_features, in_features = (int(d) for d in reversed(t.shape))
        self._check_shape(name, (out_features, in_features), expected_shape)
        blocks = decode(t.tensor_type.name, np.array(t.data), out_features, in_features)
        g = blocks.group_size
        r0, r1 = rows or (0, out_features)
        c0, c1 = cols or (0, in_features)
        if c0 % g or (c1 % g and c1 != in_features):
            return None
        self._progress.update(1)
        groups = slice(c0 // g, cdiv(c1, g))

        def part(tensor: torch.Tensor | None, columns: slice) -> torch.Tensor | None:
            return None if tensor is None else self._unpermute(name, tensor)[r0:r1, columns].t().contiguous()

        codes = part(blocks.codes, slice(c0, c1))
        scales, offsets = part(blocks.scales, groups), part(blocks.offsets, groups)
        if blocks.bits == 4:
            return Int4Weight(codes, scales, offsets, g)
        return Int8Weight(codes, scales, g, offsets)
