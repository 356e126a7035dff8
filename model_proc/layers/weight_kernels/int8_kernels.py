"""The kernels of int8 weights (--quantization int8, any compute dtype; weights/int8_weights.py):

    zserve_int8_dot  kernels/gemm_int8_dot.cpp (CPU, a feature set with avx2; `auto` in bf16 and fp16,
                 --gemm-backend zserve_dot in any dtype): the activations quantized to int8 too,
                 per row in blocks of 32 (layers/int8_activations.py), int8 x int8 products in
                 int32 (VPDPBUSD with avx512_vnni or avx_vnni, VPMADDUBSW elsewhere), one fp32 rescale per
                 block. Faster than widening at every batch size measured (BENCHMARKS.md 22); a
                 weight whose K is not a multiple of 32 takes zserve_int8
    zserve_int8  kernels/gemm_int8.cpp (CPU, a feature set with avx2): int8 values and fp32 scales in
                 gemm_widen's blocks of 16 columns, widened in registers, fp32 sums
    int8_torch   CUDA, the `baseline` set or --gemm-backend torch: the same values and scales,
                 dequantized on the fly for an fp32 torch.mm (the reference: slow, exact)

Each takes the checkpoint's own int8 values (an `Int8Weight`, GGUF Q8_0) or quantizes the plain
weight in groups of `group_size` input rows (0: one scale per output column).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zserve.common.int_math import cdiv
from zserve.common.weight_formats import GEMM_CHOICES
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8, load_gemm_int8_dot
from zserve.model_proc.layers.int8_activations import ACT_BLOCK, SUM_BLOCK, runs_int8_activations
from zserve.model_proc.layers.weight_kernels.weight_kernel import PackedWeight, WeightKernel
from zserve.model_proc.weights.column_blocks import (
    pack_column_blocks,
    pack_int4_nibbles,
    pack_int8_quads,
    padded_bias,
)
from zserve.model_proc.weights.column_pieces import ColumnPieces
from zserve.model_proc.weights.int4_weights import INT4_GROUP_SIZE, Int4Weight
from zserve.model_proc.weights.int8_weights import DEFAULT_GROUP_SIZE, Int8Weight, dequantize_int8
from zserve.model_proc.weights.packed_blocks_weight import PackedBlocks
from zserve.model_proc.weights.quantized_weight import QuantizedWeight


@dataclass(frozen=True)
class Int8Kernel(WeightKernel):
    """What both int8 kernels share: the int8 values they pack, and their bytes."""

    group_size: int = DEFAULT_GROUP_SIZE  # input rows per scale when quantizing at load
    weight_bits: int = 8  # what it quantizes a float weight to at load: 8, or 4 (--quantization int4)
    quantization = "int8"

    def quantized(self, plain: torch.Tensor) -> Int8Weight | Int4Weight:
        """`plain` [K, N] quantized at load: 4-bit where asked and K allows it, else int8."""
        if self.weight_bits == 4 and plain.shape[0] % INT4_GROUP_SIZE == 0:
            return Int4Weight.quantize(plain, INT4_GROUP_SIZE)
        return Int8Weight.quantize(plain, self.group_size)

    def int8_weight(self, plain: torch.Tensor | None, stored: QuantizedWeight | None) -> Int8Weight:
        """The stored int8 weight (without offsets: the widening kernels have none), or `plain` quantized."""
        if isinstance(stored, Int8Weight) and stored.offsets is None:
            return stored
        return Int8Weight.quantize(plain, self.group_size)

    def takes_stored(self, stored: QuantizedWeight) -> bool:
        return isinstance(stored, Int8Weight) and stored.offsets is None

    def weight_bytes(self, packed: PackedWeight | None, in_features: int, out_features: int, dtype: torch.dtype) -> int:
        if packed is None:
            return super().weight_bytes(packed, in_features, out_features, dtype)
        if packed.pieces:
            return sum(self.weight_bytes(p, in_features, p.out_features, dtype) for p in packed.pieces)
        codes = in_features * out_features * (packed.bits if packed.bits in (4, 6, 8) else 8) // 8
        if packed.compact is not None:
            return codes + packed.compact.nbytes
        per_group = 4 * (1 + (packed.offsets is not None))  # fp32 scale (and offset)
        return codes + cdiv(in_features, packed.group_size) * out_features * per_group


@dataclass(frozen=True)
class ZserveInt8Kernel(Int8Kernel):
    name = "zserve_int8"
    choices = ("auto", "zserve_widen", "onednn")

    @staticmethod
    def runs(device: torch.device, dtype: torch.dtype) -> bool:
        return device.type == "cpu" and load_gemm_int8() is not None

    def pack(
        self, plain: torch.Tensor | None, bias: torch.Tensor | None, stored: QuantizedWeight | None
    ) -> PackedWeight:
        weight = self.int8_weight(plain, stored)
        values = pack_column_blocks(weight.q)
        scales = pack_column_blocks(weight.scales.float())
        bias_blocks = padded_bias(bias, values.shape[0])
        return PackedWeight(values, weight.out_features, bias_blocks, scales, weight.group_size, bits=8)

    def matmul(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        packed_bias = packed.bias if bias is not None else None
        return torch.ops.zserve.gemm_int8(
            x.contiguous(), packed.values, packed.scales, packed.out_features, packed_bias, packed.group_size
        )


@dataclass(frozen=True)
class ZserveInt8DotKernel(Int8Kernel):
    name = "zserve_int8_dot"
    choices = ("auto", "zserve_dot")
    takes_4bit_and_offsets = True

    @staticmethod
    def runs(device: torch.device, dtype: torch.dtype) -> bool:
        return device.type == "cpu" and load_gemm_int8_dot() is not None

    def may_pick(self, choice: str, device: torch.device, dtype: torch.dtype) -> bool:
        # `auto` in fp32 keeps the activations as they are (zserve_int8): fp32 is asked for exactness
        return super().may_pick(choice, device, dtype) and (choice == "zserve_dot" or dtype != torch.float32)

    def kernel_for(self, in_features: int) -> WeightKernel:
        return self if runs_int8_activations(in_features) else ZserveInt8Kernel(self.group_size)  # int8 there

    def dot_weight(self, plain: torch.Tensor | None, stored: QuantizedWeight | None) -> Int8Weight | Int4Weight:
        """The stored weight in either format this kernel runs (int8 codes with offsets too,
        4-bit codes), or `plain` quantized to int8."""
        return stored if isinstance(stored, (Int8Weight, Int4Weight)) else self.quantized(plain)

    def takes_stored(self, stored: QuantizedWeight) -> bool:
        return isinstance(stored, (Int8Weight, Int4Weight, PackedBlocks, ColumnPieces))

    def pack(
        self, plain: torch.Tensor | None, bias: torch.Tensor | None, stored: QuantizedWeight | None
    ) -> PackedWeight:
        if isinstance(stored, ColumnPieces):  # one product per piece, each in its own format
            pieces = tuple(
                self.pack(None, None if bias is None else bias[col : col + part.out_features], part)
                for col, part in zip(stored.column_offsets(), stored.parts, strict=True)
            )
            return PackedWeight(torch.empty(0, dtype=torch.uint8), stored.out_features, pieces=pieces)
        if isinstance(stored, PackedBlocks):  # packed from the file's rows at load (kernels/gguf_pack.cpp)
            return PackedWeight(
                stored.values, stored.out_features, padded_bias(bias, stored.values.shape[0]), None, stored.group_size,
                bits=stored.bits, compact=stored.compact,
            )
        weight = self.dot_weight(plain, stored)
        in_features, group = weight.in_features, weight.group_size
        if group not in (in_features, SUM_BLOCK) and group % ACT_BLOCK:
            raise ValueError(f"zserve_int8_dot: scales per {group} rows; it needs K, 16 or a multiple of 32")
        four_bit = isinstance(weight, Int4Weight)
        values = pack_int4_nibbles(weight.codes) if four_bit else pack_int8_quads(weight.q)
        offsets = None if weight.offsets is None else pack_column_blocks(weight.offsets.float())
        return PackedWeight(
            values, weight.out_features, padded_bias(bias, values.shape[0]), pack_column_blocks(weight.scales.float()),
            group,
            offsets=offsets, bits=4 if four_bit else 8,
        )

    def matmul(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        return gemm_int8_dot(x, packed, bias)


def gemm_int8_dot(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """kernels/gemm_int8_dot.cpp on `packed`'s quads (ZserveInt8DotKernel, and the few-row half of
    zserve_int8_dot+onednn)."""
    if packed.pieces:
        return torch.cat([gemm_int8_dot(x, piece, bias) for piece in packed.pieces], dim=1)
    packed_bias = packed.bias if bias is not None else None
    if packed.compact is not None:  # a GGUF file's scales as it keeps them (weights/compact_scales.py)
        c = packed.compact
        return torch.ops.zserve.gemm_dot_compact(
            x.contiguous(), packed.values, packed.bits, c.scale_supers, c.scale_subs, c.offset_supers, c.offset_subs,
            packed.out_features, packed_bias, packed.group_size, c.implied_offset,
        )
    gemm = torch.ops.zserve.gemm_int4_dot if packed.bits == 4 else torch.ops.zserve.gemm_int8_dot
    weights = (packed.values, packed.scales, packed.offsets)
    return gemm(x.contiguous(), *weights, packed.out_features, packed_bias, packed.group_size)


@dataclass(frozen=True)
class Int8TorchKernel(Int8Kernel):
    name = "int8_torch"
    choices = GEMM_CHOICES
    takes_4bit_and_offsets = True

    @staticmethod
    def runs(device: torch.device, dtype: torch.dtype) -> bool:
        return True

    def takes_stored(self, stored: QuantizedWeight) -> bool:
        return isinstance(stored, (Int8Weight, Int4Weight))

    def pack(
        self, plain: torch.Tensor | None, bias: torch.Tensor | None, stored: QuantizedWeight | None
    ) -> PackedWeight:
        weight = stored if isinstance(stored, (Int8Weight, Int4Weight)) else self.quantized(plain)
        if isinstance(weight, Int4Weight):
            weight = weight.as_int8()
        device = plain.device if plain is not None else weight.q.device  # GemmWeight.pack moved `stored` there
        scales = weight.scales.float().to(device)
        offsets = None if weight.offsets is None else weight.offsets.float().to(device)
        return PackedWeight(
            weight.q.to(device), weight.out_features, scales=scales, group_size=weight.group_size, offsets=offsets,
            bits=8,
        )

    def matmul(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        # the reference: dequantized to fp32 on the fly, summed in fp32, rounded once
        y = torch.mm(x.float(), dequantize_int8(packed.values, packed.scales, packed.group_size, packed.offsets))
        return (y + bias.float() if bias is not None else y).to(x.dtype)
