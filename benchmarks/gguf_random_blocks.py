"""Random GGUF tensor bytes of one type, rows at a time, for benchmarks/make_shaped_gguf.py.

Every block is valid: its fp16 scale fields are finite, positive and small, its codes random, so
a dequantized weight is about N(0, 0.02)-sized (std ~0.02, mean ~0; uniform rather than normal for
the quantized types). Per type (ggml's block layouts, as model_proc/weights/gguf_blocks.py decodes them):

    type   values/block  bytes  layout                                    w
    F32/F16/BF16    1   4/2/2   normal(0, 0.02)                           as stored
    Q8_0           32      34   fp16 d, 32 int8 q                         d q
    Q4_0           32      18   fp16 d, 16 bytes of nibbles               d (q - 8)
    Q5_0           32      22   fp16 d, 4 bytes high bits, 16 of nibbles  d (q - 16)
    Q4_K          256     144   fp16 d, dmin; 12 bytes 6-bit sc, m; 128   d sc q - dmin m per 32
    Q6_K          256     210   128 low, 64 high bits, 16 int8 sc, fp16 d d sc (q - 32) per 16

d is set so that d * (typical |code|) * scale has std 0.02; Q4_K's mins centre each run of 32
(dmin m ~ d sc * 7.5). No quantization happens: nothing here costs more than random bytes.
"""

from __future__ import annotations

import numpy as np

WEIGHT_STD = 0.02
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q5_0": 22, "Q4_K": 144, "Q6_K": 210}
BLOCK_VALUES = {"Q8_0": 32, "Q4_0": 32, "Q5_0": 32, "Q4_K": 256, "Q6_K": 256}
FLOAT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
CODE_STD = {  # the std of the centred code each type multiplies by its scale (uniform codes)
    "Q8_0": 73.9,  # int8 uniform over -128..127
    "Q4_0": 4.61,  # 0..15 around 8
    "Q5_0": 9.23,  # 0..31 around 16
    "Q4_K": 4.61,  # 0..15 around 7.5 (the min)
    "Q6_K": 18.47,  # 0..63 around 32
}
K_SCALE_RANGE = {"Q4_K": (32, 64), "Q6_K": (32, 128)}  # sub-block scales drawn from [lo, hi)


def row_bytes(type_name: str, num_cols: int) -> int:
    """Bytes of one row of `num_cols` values (a multiple of the type's block)."""
    if type_name in FLOAT_BYTES:
        return num_cols * FLOAT_BYTES[type_name]
    if num_cols % BLOCK_VALUES[type_name]:
        raise ValueError(f"{type_name} rows are whole blocks of {BLOCK_VALUES[type_name]} values; got {num_cols}")
    return num_cols // BLOCK_VALUES[type_name] * BLOCK_BYTES[type_name]


def random_rows(type_name: str, num_rows: int, num_cols: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [num_rows, row_bytes]: `num_rows` rows of `num_cols` random values in `type_name`."""
    if type_name in FLOAT_BYTES:
        return _float_rows(type_name, num_rows, num_cols, rng)
    num_blocks = num_rows * num_cols // BLOCK_VALUES[type_name]
    blocks = np.frombuffer(rng.bytes(num_blocks * BLOCK_BYTES[type_name]), np.uint8)
    blocks = blocks.reshape(num_blocks, BLOCK_BYTES[type_name]).copy()  # random codes; scales set below
    if type_name == "Q4_K":
        _set_q4_k_scales(blocks, rng)
    elif type_name == "Q6_K":
        sc = rng.integers(*K_SCALE_RANGE["Q6_K"], size=(num_blocks, 16))
        blocks[:, 192:208] = sc.astype(np.uint8)
        blocks[:, 208:210] = _fp16(_jitter(rng, num_blocks) * WEIGHT_STD / (CODE_STD["Q6_K"] * sc.mean()))
    else:  # Q8_0, Q4_0, Q5_0: the scale d first
        blocks[:, 0:2] = _fp16(_jitter(rng, num_blocks) * WEIGHT_STD / CODE_STD[type_name])
    return blocks.reshape(num_rows, -1)


def _set_q4_k_scales(blocks: np.ndarray, rng: np.random.Generator) -> None:
    """d, dmin = 8 d, and per run of 32 a scale sc and a min m = sc * 15/16 (so dmin m = 7.5 d sc:
    the codes 0..15 centred), packed as ggml packs them: bytes 0-3 and 4-7 hold the low six bits
    of the first four sc and m and the top two of the last four; bytes 8-11 their low nibbles."""
    num_blocks = len(blocks)
    sc = rng.integers(*K_SCALE_RANGE["Q4_K"], size=(num_blocks, 8)).astype(np.uint8)
    m = np.rint(sc * (15 / 16)).astype(np.uint8)
    d = _jitter(rng, num_blocks) * WEIGHT_STD / (CODE_STD["Q4_K"] * float(np.mean(K_SCALE_RANGE["Q4_K"])))
    blocks[:, 0:2] = _fp16(d)
    blocks[:, 2:4] = _fp16(d * 8)
    blocks[:, 4:8] = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    blocks[:, 8:12] = (m[:, :4] & 0x3F) | ((m[:, 4:] >> 4) << 6)
    blocks[:, 12:16] = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)


def _float_rows(type_name: str, num_rows: int, num_cols: int, rng: np.random.Generator) -> np.ndarray:
    values = rng.standard_normal((num_rows, num_cols), dtype=np.float32) * np.float32(WEIGHT_STD)
    if type_name == "F32":
        return values.view(np.uint8)
    if type_name == "F16":
        return values.astype(np.float16).view(np.uint8)
    bits = values.view(np.uint32)  # BF16: the top half, rounded to nearest even
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    return rounded.astype(np.uint16).view(np.uint8)


def _jitter(rng: np.random.Generator, n: int) -> np.ndarray:
    """Per-block scale factors in [0.75, 1.25): blocks differ, as real ones do."""
    return rng.uniform(0.75, 1.25, n)


def _fp16(values: np.ndarray) -> np.ndarray:
    """[n] floats -> uint8 [n, 2], their fp16 bytes."""
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)
