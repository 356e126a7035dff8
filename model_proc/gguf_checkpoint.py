"""Read a Llama/Qwen2/Qwen3 GGUF file's tensors by their Hugging Face names.

The launcher turns `--model X.gguf` into a small directory (launcher/gguf_model_dir.py) whose
`gguf_source.json` names the file (common/gguf_source.py); `open_checkpoint` picks this reader
for such a directory and the safetensors `Checkpoint` otherwise. gguf.GGUFReader memory-maps it:

    blk.N.attn_q.weight  -> model.layers.N.self_attn.q_proj.weight   (llama: rows un-permuted)
    blk.N.ffn_gate.weight -> model.layers.N.mlp.gate_proj.weight      ... (GGUF_TO_HF below)
    token_embd / output_norm / output -> model.embed_tokens / model.norm / lm_head

F32/F16/BF16 tensors are taken as stored; every other type is dequantized (float32, then cast
to the parameter's dtype by `copy_into`), one log line per type. A tensor-parallel rank
dequantizes the whole tensor and keeps its slice.

Q8_0 (blocks of 32 values along a row, i.e. along the input dimension, each an fp16 scale d and
32 int8 q; the value is q * d) with `keep_int8` (--quantization int8): the matrices go into the
int8 path exactly as stored. `read` still returns the dequantized float32 tensor (the parameter
is filled as usual, and a TP slice or a row un-permute applies to it alike), and `copy_into`
hands the same rows' q and d, un-permuted and sliced the same way, to the parameter as an
`Int8Preset` (layers/int8_weights.py): a linear layer or LM head then packs those values with
group size 32 instead of quantizing its float weight again. Without it (--quantization none),
Q8_0 is dequantized like any other type.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from zserve.common.gguf_source import gguf_source
from zserve.model_proc.checkpoint import Checkpoint
from zserve.model_proc.layers.int8_weights import Int8Preset

logger = logging.getLogger(__name__)

GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
GGUF_TO_HF = {  # blk.N.<key> -> model.layers.N.<value>
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
SKIPPED = {"rope_freqs.weight"}  # llama 3's rope scaling factors: we compute them from config.json
Q8_0_BLOCK = 32  # values per Q8_0 block (one fp16 scale each), along the input dimension


def open_checkpoint(model_dir: str | Path, show_progress: bool = False, keep_int8: bool = False) -> Checkpoint:
    """The reader for `model_dir`: a GGUF file it points at (`keep_int8`: its Q8_0 matrices go
    to the int8 path as stored), else its safetensors."""
    source = gguf_source(model_dir)
    if source is None:
        return Checkpoint(model_dir, show_progress=show_progress)
    return GGUFCheckpoint(model_dir, source, show_progress=show_progress, keep_int8=keep_int8)


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (None for one we do not load)."""
    if gguf_name in SKIPPED:
        return None
    base, _, kind = gguf_name.rpartition(".")
    if base in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[base]}.{kind}"
    m = BLOCK_NAME.fullmatch(gguf_name)
    if m is None or m.group(2) not in GGUF_TO_HF:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no Llama/Qwen counterpart")
    return f"model.layers.{m.group(1)}.{GGUF_TO_HF[m.group(2)]}.{m.group(3)}"


def unpermute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf's `permute` of q/k rows, as transformers' LlamaTensorProcessor does.

    Per head of d rows, h = d/2: llama.cpp rotates adjacent pairs, so the file holds
    (r0, r_h, r1, r_h+1, ...); our rotary (rotate_half) wants the halves (r0..r_h-1, r_h..r_d-1)."""
    head_dim_half = weight.shape[0] // num_heads // 2
    w = weight.reshape(num_heads, head_dim_half, 2, *weight.shape[1:])
    return w.transpose(1, 2).reshape(weight.shape)


class GGUFCheckpoint(Checkpoint):
    def __init__(self, model_dir: str | Path, gguf_file: Path, show_progress: bool = False, keep_int8: bool = False):
        import gguf

        self.gguf_file, self.keep_int8 = gguf_file, keep_int8
        self._int8_rows: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # id(read's tensor) -> (it, q, d)
        self._gguf = gguf
        self._reader = gguf.GGUFReader(str(gguf_file))
        self._tensors = {}
        for t in self._reader.tensors:
            name = hf_name(t.name)
            if name is not None:
                self._tensors[name] = t
        field = self._reader.fields.get("general.architecture")
        self.architecture = str(field.contents()) if field is not None else ""
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        self._num_heads = int(config["num_attention_heads"])
        self._num_kv_heads = int(config.get("num_key_value_heads") or self._num_heads)
        super().__init__(model_dir, show_progress=show_progress)
        self._log_types()

    def _index(self) -> dict[str, str]:
        return dict.fromkeys(self._tensors, self.gguf_file.name)

    def _log_types(self) -> None:
        float_types = {"F32", "F16", "BF16"}
        counts = Counter(t.tensor_type.name for t in self._tensors.values())
        for type_name, n in sorted(counts.items()):
            if type_name in float_types:
                logger.info("GGUF %s: %d %s tensors read as stored", self.gguf_file.name, n, type_name)
            elif type_name == "Q8_0" and self.keep_int8:
                logger.info("GGUF %s: %d Q8_0 tensors: matrices kept as stored for --quantization int8 (int8 values, "
                            "a scale per 32 input rows), a lookup-only embedding dequantized", self.gguf_file.name, n)
            elif type_name == "Q8_0":
                logger.info("GGUF %s: %d Q8_0 tensors dequantized to float32 (--quantization int8 keeps them as int8)", self.gguf_file.name, n)
            else:
                logger.info("GGUF %s: %d %s tensors dequantized to float32", self.gguf_file.name, n, type_name)

    def _unpermute(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if self.architecture == "llama" and ".self_attn.q_proj." in name:
            return unpermute_rows(tensor, self._num_heads)
        if self.architecture == "llama" and ".self_attn.k_proj." in name:
            return unpermute_rows(tensor, self._num_kv_heads)
        return tensor

    def _q8_0_parts(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A Q8_0 matrix's q (int8 [out, in]) and d (float32 [out, in / 32]), rows un-permuted."""
        t = self._tensors[name]
        rows, cols = (int(d) for d in reversed(t.shape))
        blocks = np.array(t.data).reshape(rows, cols // Q8_0_BLOCK, 2 + Q8_0_BLOCK)  # per block: fp16 d, then 32 int8
        d = torch.from_numpy(np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0].astype(np.float32))
        q = torch.from_numpy(np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(rows, cols))
        return self._unpermute(name, q), self._unpermute(name, d)

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
        tensor = tensor.reshape(tuple(int(d) for d in reversed(t.shape)))  # GGML lists dims innermost first
        return self._unpermute(name, tensor)

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
        t = self._tensors[name]
        int8_parts = None
        if self.keep_int8 and t.tensor_type == self._gguf.GGMLQuantizationType.Q8_0 and len(t.shape) == 2:
            int8_parts = self._q8_0_parts(name)
            q, d = int8_parts
            tensor = q.float() * d.repeat_interleave(Q8_0_BLOCK, dim=1)  # = gguf's dequantize, bit for bit
        else:
            tensor = self._full_tensor(name)
        if tuple(tensor.shape) != tuple(expected_shape):
            raise ValueError(
                f"tensor {name!r} in {self.gguf_file} has shape {list(tensor.shape)}, "
                f"but config.json implies {list(expected_shape)}"
            )
        if rows:
            tensor = tensor[rows[0]:rows[1]]
        if cols:
            tensor = tensor[:, cols[0]:cols[1]]
        if int8_parts is not None:
            q, d = int8_parts
            r0, r1 = rows or (0, q.shape[0])
            c0, c1 = cols or (0, q.shape[1])
            if c0 % Q8_0_BLOCK == 0 and (c1 % Q8_0_BLOCK == 0 or c1 == q.shape[1]):  # a TP column slice on whole blocks
                self._int8_rows[id(tensor)] = (tensor, q[r0:r1, c0:c1], d[r0:r1, c0 // Q8_0_BLOCK : -(-c1 // Q8_0_BLOCK)])
        self._progress.update(1)
        return tensor

    def copy_into(self, param: torch.Tensor, tensor: torch.Tensor, name: str, row_offset: int = 0, transposed: bool = False) -> None:
        """As Checkpoint.copy_into; rows `read` took from a Q8_0 matrix (with `keep_int8`) also
        land, as stored, in the parameter's `int8_preset` (a [in, out] parameter: `transposed`)."""
        super().copy_into(param, tensor, name, row_offset=row_offset, transposed=transposed)
        entry = self._int8_rows.pop(id(tensor), None)
        if entry is None or entry[0] is not tensor or not transposed or param.dim() != 2:
            return
        _, q, d = entry
        preset = getattr(param, "int8_preset", None)
        if preset is None:
            in_features, out_features = param.shape
            preset = Int8Preset(
                q=torch.zeros(in_features, out_features, dtype=torch.int8),
                scales=torch.zeros(-(-in_features // Q8_0_BLOCK), out_features),
                group_size=Q8_0_BLOCK,
            )
            param.int8_preset = preset
        stop = row_offset + q.shape[0]
        preset.q[:, row_offset:stop] = q.t()
        preset.scales[:, row_offset:stop] = d.t()
        preset.filled_cols += q.shape[0]
