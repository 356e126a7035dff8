"""Read tensors from a model directory's safetensors files, one rank's shard at a time.

A checkpoint is `model.safetensors`, or shards listed in `model.safetensors.index.json`.
`read` uses safetensors' `get_slice`, so a tensor-parallel rank reads only the rows (or
columns) it holds, never the whole tensor. Every read checks the full on-disk shape against
the shape the config implies and names the tensor when they differ.

A linear layer or LM head reads its weight through `read_weight`: the same float rows here; a
reader of a format that stores weights quantized (gguf_checkpoint.py) returns such a weight as
stored, typed (weights/quantized_weight.py), for the --quantization that keeps it.
A 4-bit AWQ or GPTQ checkpoint's layers (`qweight`, `qzeros`, `scales` instead of `weight`) come
back as an `Int4Weight` (packed_int4_checkpoint.py, the scheme given by quant/awq.py) whatever the
--quantization: a float kernel then packs its exact dequantized values.

Layers write parameters through `copy_into`, which records what was loaded; the runner asks
`missing_params` afterwards, so a parameter that no checkpoint tensor filled is an error,
not silent garbage.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm import tqdm

from zserve.model_proc.checkpoints.packed_int4_checkpoint import PackedInt4Scheme
from zserve.model_proc.weights.int4_weights import Int4Weight
from zserve.model_proc.weights.quantized_weight import QuantizedWeight

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SAFETENSORS_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                           "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}
SINGLE_FILE = "model.safetensors"


def bare_model_names(file_of: dict[str, str]) -> dict[str, str]:
    """{"model.<name>": "<name>"} for every tensor of a checkpoint saved from a bare `*Model` (its embeddings
    stored as `embed_tokens.weight`, not `model.embed_tokens.weight`); {} for any other checkpoint."""
    if "embed_tokens.weight" not in file_of or "model.embed_tokens.weight" in file_of:
        return {}
    return {f"model.{name}": name for name in file_of}


class Checkpoint:
    def __init__(self, model_dir: str | Path, show_progress: bool = False, packed_int4: PackedInt4Scheme | None = None):
        self.model_dir = Path(model_dir)
        self.file_of: dict[str, str] = self._index()  # tensor name (as *ForCausalLM names it) -> file name
        # a bare `*Model` checkpoint (how sentence-transformers saves an embedding model: no "model." prefix, no
        # lm_head) is read under the *ForCausalLM names the model code asks for; name -> the name stored
        self.stored_name: dict[str, str] = bare_model_names(self.file_of)
        self.file_of = {name: self.file_of[stored] for name, stored in self.stored_name.items()} or self.file_of
        self._handles: dict[str, Any] = {}
        self.packed_int4 = packed_int4  # AWQ / GPTQ layers (quant/awq.py, quant/gptq.py), or None
        self._loaded_param_ids: set[int] = set()
        self._progress = tqdm(total=len(self.file_of), desc="loading weights", unit="tensor", disable=not show_progress)

    def _index(self) -> dict[str, str]:
        index_path = self.model_dir / INDEX_FILE
        if index_path.is_file():
            try:
                weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                expected = "{'weight_map': {name: file}}"
                raise ValueError(f"{index_path} is malformed ({e!r}); expected {expected}") from None
            for file_name in set(weight_map.values()):
                if not (self.model_dir / file_name).is_file():
                    raise FileNotFoundError(f"{self.model_dir / file_name} is listed in {index_path} but missing")
            return dict(weight_map)
        single = self.model_dir / SINGLE_FILE
        if not single.is_file():
            raise FileNotFoundError(f"no weights in {self.model_dir}: expected {SINGLE_FILE} or {INDEX_FILE}")
        with self._open(SINGLE_FILE) as f:
            return dict.fromkeys(f.keys(), SINGLE_FILE)

    def _open(self, file_name: str) -> Any:
        path = self.model_dir / file_name
        try:
            return safe_open(str(path), framework="pt", device="cpu")
        except Exception as e:  # safetensors raises its own error types for a corrupt header
            raise ValueError(f"{path} is not a readable safetensors file: {e}") from None

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.close()
        self._handles.clear()

    def has(self, name: str) -> bool:
        return name in self.file_of

    def file_bytes_by_type(self) -> dict[str, int]:
        """Bytes of the checkpoint's tensors by stored type ("BF16", "I32", ...), from the files' headers."""
        totals: dict[str, int] = {}
        for name, file_name in self.file_of.items():
            if file_name not in self._handles:
                self._handles[file_name] = self._open(file_name)
            sl = self._handles[file_name].get_slice(self.stored_name.get(name, name))
            dtype = sl.get_dtype()
            num_values = 1
            for dim in sl.get_shape():
                num_values *= dim
            totals[dtype] = totals.get(dtype, 0) + num_values * SAFETENSORS_DTYPE_BYTES.get(dtype, 1)
        return totals

    def _full(self, name: str) -> torch.Tensor:
        """The whole tensor `name`, as stored."""
        file_name = self.file_of[name]
        if file_name not in self._handles:
            self._handles[file_name] = self._open(file_name)
        self._progress.update(1)
        return self._handles[file_name].get_tensor(self.stored_name.get(name, name))

    def read(
        self,
        name: str,
        expected_shape: tuple[int, ...],
        rows: tuple[int, int] | None = None,
        cols: tuple[int, int] | None = None,
        transpose: bool = False,
    ) -> torch.Tensor:
        """Rows [r0, r1) and columns [c0, c1) of tensor `name`, in our orientation.

        `expected_shape` is the full tensor's shape in our orientation. `transpose=True` is for
        GPT-2's Conv1D weights, stored as [in, out] where we use [out, in]: rows then index the
        file's dim 1.
        """
        if name not in self.file_of:
            raise ValueError(f"tensor {name!r} is missing from the checkpoint in {self.model_dir}")
        file_name = self.file_of[name]
        if file_name not in self._handles:
            self._handles[file_name] = self._open(file_name)
        sl = self._handles[file_name].get_slice(self.stored_name.get(name, name))
        file_shape = tuple(sl.get_shape())
        shape = file_shape[::-1] if transpose else file_shape
        if shape != tuple(expected_shape):
            want = tuple(expected_shape)[::-1] if transpose else tuple(expected_shape)
            raise ValueError(
                f"tensor {name!r} in {self.model_dir / file_name} has shape {list(file_shape)}, "
                f"but config.json implies {list(want)}"
            )
        r = slice(*rows) if rows else slice(None)
        c = slice(*cols) if cols else slice(None)
        if len(shape) == 1:
            tensor = sl[r]
        elif transpose:
            tensor = sl[c, r].t()
        else:
            tensor = sl[r, c]
        self._progress.update(1)
        return tensor

    def read_weight(
        self, name: str, expected_shape: tuple[int, ...], rows: tuple[int, int] | None = None,
        cols: tuple[int, int] | None = None, transpose: bool = False,
    ) -> torch.Tensor | QuantizedWeight:
        """A matrix a weight kernel packs: as its file stores it quantized ([in, out]) where
        `stored_weight` returns that, else float rows as `read`."""
        stored = self.stored_weight(name, expected_shape, rows, cols)
        if stored is not None:
            return stored
        return self.read(name, expected_shape, rows=rows, cols=cols, transpose=transpose)

    def stored_weight(
        self, name: str, expected_shape: tuple[int, ...], rows: tuple[int, int] | None, cols: tuple[int, int] | None
    ) -> QuantizedWeight | None:
        """Rows and columns of matrix `name` as the file stores them quantized ([in, out]): an AWQ /
        GPTQ layer's Int4Weight (rows and columns sliced at its groups), else None (floats)."""
        prefix = name.removesuffix(".weight")
        if self.packed_int4 is None or f"{prefix}.qweight" not in self.file_of:
            return None
        out_features, in_features = expected_shape
        group = self.packed_int4.group_size
        if self.packed_int4.method == "gptq" and f"{prefix}.g_idx" in self.file_of:
            PackedInt4Scheme.check_g_idx(self._full(f"{prefix}.g_idx"), group)
        weight = self.packed_int4.unpack(lambda suffix: self._full(f"{prefix}.{suffix}"), in_features, out_features)
        r0, r1 = rows or (0, out_features)
        c0, c1 = cols or (0, in_features)
        if c0 % group or c1 % group:
            raise ValueError(f"{name}: a tensor-parallel shard of columns {c0}..{c1} cuts a group of {group}")
        groups = slice(c0 // group, c1 // group)
        return Int4Weight(
            weight.codes[c0:c1, r0:r1].contiguous(), weight.scales[groups, r0:r1].contiguous(),
            weight.offsets[groups, r0:r1].contiguous(), group,
        )

    def packed_experts(self, name: str, expected_shape: tuple[int, int, int]) -> object | None:
        """A MoE layer's experts of one projection packed together (a GGUF file's stacked tensor:
        GGUFCheckpoint); None here: safetensors hold one matrix per expert."""
        return None

    def copy_into(
        self, param: torch.Tensor, tensor: torch.Tensor, name: str, row_offset: int = 0, transposed: bool = False
    ) -> None:
        """param[row_offset : row_offset + len(tensor)] = tensor, cast to param's dtype.

        `transposed=True`: param is stored [in, out] and `tensor` holds [out, in] rows, so the rows
        land in param's columns."""
        dst = param.t() if transposed else param
        stop = row_offset + tensor.shape[0]
        if tensor.shape[1:] != dst.shape[1:] or stop > dst.shape[0]:
            raise ValueError(
                f"tensor {name!r}: shard of shape {list(tensor.shape)} does not fit rows {row_offset}.. "
                f"of parameter {list(dst.shape)}"
            )
        with torch.no_grad():
            dst[row_offset:stop].copy_(tensor)
        self._loaded_param_ids.add(id(param))

    def mark_loaded(self, param: torch.Tensor) -> None:
        """Record `param` as filled without a copy (a weight kept as its file stores it quantized)."""
        self._loaded_param_ids.add(id(param))

    def missing_params(self, model: torch.nn.Module) -> list[str]:
        """Names of `model`'s parameters that no `copy_into` call filled."""
        return [n for n, p in model.named_parameters() if id(p) not in self._loaded_param_ids]
