"""The int8 x int8 GEMM's many bf16 rows through bf16 tiles (kernels/bf16_tiles.cpp): on a CPU with AMX-BF16, a
bf16 x of BF16_TILE_MIN_ROWS rows and more is multiplied by the weight decoded to bf16 chunk by chunk (oneDNN's
matmul on AMX-BF16 tiles). The decode must give C * S + O rounded to bf16, the value a 16-bit copy of the same
weight holds (checked through an identity x, whose product is the decoded weight itself, for int8 codes, nibbles
and 6-bit codes, fp32 and compact scales, offsets or none or implied, N off the blocks of 16); the product must be
the bf16 matmul of x and that weight (plus the bias in fp32), across the chunks a long K splits the columns into.
Fewer rows, and fp16 or fp32 x, stay on the int8 paths (test_gemm_amx.py, test_gemm_int8_dot.py).

Where the CPU has no AMX-BF16 (or the set no amx_int8, or the OS refused the tiles) the build says it runs no bf16
tiles, and the tests of the path skip with that reason."""

from __future__ import annotations

import pytest
import torch

from testing.random_dot_weights import random_dot_weight, side_by_side
from tests.model.test_gemm_int8_dot import needs_kernel
from zserve.model_proc.kernels.cpu_isa import BF16_TILE_MIN_ROWS, cpu_flags, cpu_isa
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot
from zserve.model_proc.layers.weight_kernels.int8_kernels import gemm_int8_dot
from zserve.model_proc.weights.packed_blocks_weight import PackedBlocks

N = 40  # off the blocks of 16


def bf16_tile_rows() -> int:
    return torch.ops.zserve.gemm_int8_dot_bf16_tile_rows() if load_gemm_int8_dot() is not None else 0


needs_bf16_tiles = pytest.mark.skipif(
    bf16_tile_rows() == 0,
    reason=f"no bf16 tiles in this process (set {cpu_isa()}: they need amx_int8 in the set, the CPU's amx_bf16 flag, "
    "and the OS's permission for the tiles)",
)


class Fp32Scales:
    """fp32 scales and offsets [NB, NG, 16] in CompactScales' reading interface, for PackedBlocks.dequantize."""

    def __init__(self, scales: torch.Tensor, offsets: torch.Tensor | None):
        self._scales, self._offsets = scales, offsets

    def scales(self) -> torch.Tensor:
        return self._scales

    def offsets(self) -> torch.Tensor | None:
        return self._offsets


def dense(packed, k: int) -> torch.Tensor:
    """float32 [K, N]: C * S + O, the weight `packed` stands for (weights/packed_blocks_weight.py's decode)."""
    if packed.pieces:
        return torch.cat([dense(piece, k) for piece in packed.pieces], dim=1)
    scales = packed.compact if packed.compact is not None else Fp32Scales(packed.scales, packed.offsets)
    if packed.bits == 4 and scales.offsets() is None:  # the reference's 4-bit weight always has offsets
        scales = Fp32Scales(scales.scales(), torch.zeros_like(scales.scales()))
    return PackedBlocks(packed.values, scales, packed.bits, packed.group_size, k, packed.out_features).dequantize()


def assert_within_one_rounding(got: torch.Tensor, want: torch.Tensor, what) -> None:
    """bf16 values equal, but for one step of bf16 where C * S + O fell within an fp32 rounding of a tie (the
    compiler may fuse the product and the sum, the reference rounds the product first)."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape, what
    differ = got != want
    step = (want.float().abs() * 2**-7).clamp_min(torch.finfo(torch.float32).tiny)
    assert bool(((got.float() - want.float()).abs() <= step)[differ].all()), (what, int(differ.sum()))
    assert int(differ.sum()) <= max(2, got.numel() // 1000), (what, int(differ.sum()))


@needs_kernel
def test_the_build_says_from_how_many_rows_bf16_tiles_multiply():
    rows = torch.ops.zserve.gemm_int8_dot_bf16_tile_rows()
    can = "amx_int8" in cpu_isa() and "amx_bf16" in cpu_flags() and torch.ops.zserve.gemm_int8_dot_amx_granted()
    assert rows == (BF16_TILE_MIN_ROWS if can else 0)


@needs_bf16_tiles
@pytest.mark.parametrize("bits", [8, 4, 6])
@pytest.mark.parametrize("compact", [False, True], ids=["fp32_scales", "compact_scales"])
@pytest.mark.parametrize("offsets", ["none", "stored", "implied"])
@pytest.mark.parametrize("group_size", [16, 32, 64])
def test_an_identity_x_gives_the_weight_decoded_to_bf16(bits, compact, offsets, group_size):
    if bits == 6 and not compact:
        pytest.skip("6-bit codes come with compact scales only (Q6_K's, gemm_dot_compact)")
    if offsets == "implied" and (not compact or group_size != 32):
        pytest.skip("an implied offset is a one-group compact block's (Q4_0's -8 d)")
    if group_size == 16 and bits == 4:
        pytest.skip("4-bit codes come in groups of 32 and more")
    k = 256  # >= BF16_TILE_MIN_ROWS: the identity's rows go through the tiles
    assert k >= BF16_TILE_MIN_ROWS
    packed = random_dot_weight(k, N, bits=bits, group_size=group_size, compact=compact, offsets=offsets == "stored",
                               bias=False, seed=bits + 5 * group_size + compact, implied_offset=-8 if offsets == "implied" else 0)
    decoded = gemm_int8_dot(torch.eye(k, dtype=torch.bfloat16), packed, None)
    assert_within_one_rounding(decoded, dense(packed, k).bfloat16(), (bits, compact, offsets, group_size))


@needs_bf16_tiles
@pytest.mark.parametrize("k, n", [(256, N), (8192, 1100)], ids=["one_chunk", "columns_in_chunks"])
def test_the_product_is_the_bf16_matmul_with_the_bias_in_fp32(k, n):
    """8192 x 1100: the 16 MiB scratch holds 64 column blocks, so the product goes in two chunks, the last partial."""
    packed = random_dot_weight(k, n, bits=4, group_size=32, compact=True, offsets=True, bias=True, seed=k)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BF16_TILE_MIN_ROWS + 9, k, generator=g).bfloat16()
    weight = dense(packed, k).bfloat16()
    plain = gemm_int8_dot(x, packed, None)
    assert plain.dtype == torch.bfloat16 and plain.shape == (x.shape[0], n)
    reference = x.float() @ weight.float()  # exact sums in fp32 (then rounded once, as the tiles' sums are)
    torch.testing.assert_close(plain.float(), reference, rtol=2**-7, atol=1e-3 * float(reference.abs().mean()))
    with_bias = gemm_int8_dot(x, packed, torch.zeros(1))  # the wrapper adds packed.bias when a bias is passed
    torch.testing.assert_close(with_bias, (plain.float() + packed.bias[:n]).bfloat16(), rtol=0, atol=0)


@needs_bf16_tiles
def test_fewer_rows_or_another_dtype_stay_on_the_int8_path():
    """Below BF16_TILE_MIN_ROWS rows, and in fp32 at any count, a row's result does not depend on how many rows
    came with it (the int8 paths are bit-identical row by row); at the threshold in bf16 it is the tiles' product."""
    k = 256
    packed = random_dot_weight(k, N, bits=4, group_size=32, compact=True, offsets=True, bias=False, seed=3)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(BF16_TILE_MIN_ROWS, k, generator=g)
    first_alone = gemm_int8_dot(x[:1].bfloat16(), packed, None)
    assert torch.equal(gemm_int8_dot(x[: BF16_TILE_MIN_ROWS - 1].bfloat16(), packed, None)[:1], first_alone)
    assert torch.equal(gemm_int8_dot(x, packed, None)[:1], gemm_int8_dot(x[:1], packed, None))
    tiles = gemm_int8_dot(x.bfloat16(), packed, None)
    reference = x.bfloat16().float() @ dense(packed, k).bfloat16().float()
    torch.testing.assert_close(tiles.float(), reference, rtol=2**-7, atol=1e-3 * float(reference.abs().mean()))
    assert not torch.equal(tiles[:1], first_alone)  # the int8 path's activations rounded to 8 bits: not the same sums


@needs_bf16_tiles
def test_column_pieces_of_different_codes_each_go_through_the_tiles():
    """Q4_K_M's attention: 4-bit pieces with compact scales and offsets beside an int8 piece in groups of 16."""
    k = 256
    pieces = side_by_side(
        random_dot_weight(k, 32, bits=4, group_size=32, compact=True, offsets=True, bias=False, seed=1),
        random_dot_weight(k, 16, bits=8, group_size=16, compact=True, offsets=False, bias=False, seed=2),
        random_dot_weight(k, 16, bits=6, group_size=16, compact=True, offsets=False, bias=False, seed=3),
    )
    decoded = gemm_int8_dot(torch.eye(k, dtype=torch.bfloat16), pieces, None)
    assert_within_one_rounding(decoded, dense(pieces, k).bfloat16(), "pieces")


@needs_bf16_tiles
def test_a_long_prompt_of_a_q4_k_m_file_matches_transformers_in_bf16(tmp_path, monkeypatch):
    """A Q4_K_M file in bf16 end to end: a 300-token prompt's prefill goes through the bf16 tiles (every linear layer
    sees 300 rows), the LM head's one row and every decode step through the int8 paths. The oracle is transformers'
    own GGUF loader on the same file in bf16, every linear layer's input quantized as the int8 kernel quantizes it
    where it has fewer than BF16_TILE_MIN_ROWS rows (testing/int8_oracle.py) and left in bf16 where it has more:
    greedy tokens identical up to a near-tie of its logits (test_gguf_stored.py's rule), and the first token (the
    prefill's) always identical. (On this fixture both prompts leave transformers at the same near-tie a few decode
    steps in: after token 322, 438 against 296.)"""
    import torch.nn as nn

    from testing.cache_dirs import private_cache_dir
    from testing.gguf_fixtures import write_gguf
    from testing.int8_oracle import fake_quantize
    from testing.model_fixtures import GreedyDriver, first_divergence, make_runner, make_tiny_checkpoint, random_prompt
    from tests.model.test_gguf_stored import NEAR_TIE_ULPS, WIDE, transformers_greedy_with_logits
    from zserve.launcher.demo_model import _load_gguf_model
    from zserve.launcher.gguf_model_dir import gguf_model_dir

    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "cache")))
    hf_dir = make_tiny_checkpoint(tmp_path / "hf", "llama", **WIDE, max_position_embeddings=512)
    gguf_file = write_gguf(hf_dir, tmp_path / "m.gguf", "Q4_K_M")
    runner = make_runner(gguf_model_dir(gguf_file, with_tokenizer=False), page_size=4, kv_cache_tokens=1024, device="cpu",
                         dtype="bfloat16", quantization="gguf", gemm_backend="zserve_dot")
    assert runner.gemm_backend == "zserve_int8_dot"
    prompts = [random_prompt(n, seed=n) for n in (300, 290)]
    driver = GreedyDriver(runner)
    ours = driver.generate([driver.add(p, 8) for p in prompts])

    model = _load_gguf_model(gguf_file).to(torch.bfloat16)

    def as_the_kernel_sees_it(_module, args):
        x = args[0]
        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[0] >= BF16_TILE_MIN_ROWS:
            return None  # the tiles' product: x in bf16
        return (fake_quantize(rows.float()).reshape(x.shape).to(x.dtype), *args[1:])

    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.register_forward_pre_hook(as_the_kernel_sees_it)
    for prompt, out in zip(prompts, ours, strict=True):
        theirs, logits = transformers_greedy_with_logits(model, prompt, 8)
        where = first_divergence(out, theirs, logits, NEAR_TIE_ULPS)  # raises at any difference but a near-tie
        assert where is None or where > 0, (out, theirs)  # the prefill's token (the tiles' product) is the same
