"""The Triton paged-attention kernels (model_proc/kernels/triton_attention.py) against the pure-torch path (the
oracle), run on the CPU by Triton's interpreter (TRITON_INTERPRET=1, which tests/conftest.py sets where there is no
CUDA, before triton is first imported), or on CUDA where there is a GPU; and the --attention-backend choice.

Shapes are tiny: the interpreter runs every program in Python. Tolerances: fp32 within 1e-5 (another order of
sums, an exp of its own); fp16 and bf16 within 2e-2 absolute + relative (both paths round the probabilities to the
input dtype before they weight V, at different points, and round the output).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from testing.model_fixtures import GreedyDriver, make_runner, make_tiny_checkpoint, random_prompt
from testing.paged_batches import shuffled_page_batch
from testing.paths import REPO_ROOT
from zserve.model_proc.layers import attention as attention_module
from zserve.model_proc.layers import attention_metadata
from zserve.model_proc.layers.attention import PagedAttention, attention_backend
from zserve.model_proc.layers.attention_metadata import AttentionMetadata
from zserve.model_proc.layers.kv_pool import KVPool

TOLERANCE = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-2, "rtol": 2e-2},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}
CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # test_backend_choice names CUDA only: nothing runs there


@pytest.fixture(scope="module")
def device():
    """Where the kernels run: CUDA where there is one (the real kernels), else the CPU under Triton's interpreter
    (tests/conftest.py sets TRITON_INTERPRET=1 there); skipped where triton is not installed."""
    triton = pytest.importorskip("triton", reason="the triton package is not installed (the Triton attention backend is off)")
    if torch.cuda.is_available():
        return CUDA
    if type(triton.language.standard.cdiv).__name__ != "InterpretedFunction":
        pytest.skip("no CUDA, and triton was imported before TRITON_INTERPRET=1 was set (tests/conftest.py sets it)")
    return CPU


def both_paths(
    device: torch.device, cached: list[int], extend: list[int], *, page_size: int, num_heads: int = 4, num_kv_heads: int = 2,
    head_dim: int = 16, dtype: torch.dtype = torch.float32, window: int = 0, softcap: float = 0.0, seed: int = 0,
    q_view: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:  # fmt: skip
    """PagedAttention.forward on the Triton backend and on the torch backend for one batch over shuffled pages (a
    non-contiguous page table): the K/V writes of the new tokens, then attention over cached prefix + new tokens.
    q_view: q as the model hands it over, a view into a wider projection output."""
    rng = np.random.default_rng(seed)
    needed = sum(-(-(c + e) // page_size) for c, e in zip(cached, extend, strict=True))
    batch = shuffled_page_batch(rng, cached, extend, page_size, needed + 3)
    num_pages = needed + 3
    attn = PagedAttention(num_heads, num_kv_heads, head_dim, head_dim**-0.5, 0, sliding_window=window, logit_softcap=softcap)
    gen = torch.Generator().manual_seed(seed)
    width = num_heads + 2 * num_kv_heads if q_view else num_heads
    q = (torch.randn(batch.num_tokens, width, head_dim, generator=gen) * 2).to(dtype)[:, :num_heads]
    assert q.is_contiguous() != q_view
    k, v = (torch.randn(batch.num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    outs, metas = [], []
    for backend in ("triton", "torch"):
        pool = KVPool(1, num_kv_heads, head_dim, page_size, num_pages, dtype, device)
        fill = torch.Generator().manual_seed(seed + 1)
        for cache in (pool.k[0], pool.v[0]):
            cache.copy_(torch.randn(cache.shape, generator=fill))
        metas.append(AttentionMetadata.build(batch, pool, dtype, backend=backend))
        with torch.inference_mode():
            outs.append(attn(q.to(device), k.to(device), v.to(device), metas[-1]))
    assert outs[0].dtype == dtype
    return outs[0].float().cpu(), outs[1].float().cpu(), metas[0]


@pytest.mark.parametrize("page_size", [1, 16, 32])
@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (5, 0.0), (0, 2.5), (20, 30.0)])
def test_decode(device, page_size, window, softcap):
    """Decode rows at ragged lengths, page boundaries included, GQA (2 query heads per KV head)."""
    lens = [0, 1, 4, 15, 16, 17, 31, 32, 33, 70]
    got, want, meta = both_paths(device, lens, [1] * len(lens), page_size=page_size, window=window, softcap=softcap)
    assert meta.triton.decode_reqs.numel() == len(lens) and meta.triton.block_reqs.numel() == 0
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("page_size", [1, 16, 32])
@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (7, 0.0), (0, 2.5), (40, 30.0)])
def test_extend_with_decodes(device, page_size, window, softcap):
    """A mixed batch: new prompts (one longer than an extend block of 32), chunks after a cached prefix that ends
    mid-page, 1-token prompts and decodes, in one layer call."""
    cached, extend = [0, 13, 0, 40, 5, 0], [37, 9, 1, 2, 1, 6]
    got, want, meta = both_paths(device, cached, extend, page_size=page_size, window=window, softcap=softcap, seed=page_size)
    assert meta.triton.block_reqs.tolist() == [0, 0, 1, 3, 5]  # request 0's 37 tokens in two blocks
    assert meta.triton.block_starts.tolist() == [0, 32, 0, 0, 0]
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(3, 3), (6, 2), (8, 1)])
def test_gqa_groups_and_head_dims(device, num_heads, num_kv_heads):
    """Groups of 1, 3 and 8 query heads per KV head; a head dim that is not a power of two (24, padded to 32)."""
    got, want, _ = both_paths(
        device, [0, 9, 20], [11, 1, 3], page_size=16, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=24, seed=3
    )
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("window", [0, 9])
def test_decode_split_over_long_contexts(device, monkeypatch, window):
    """A decode row split into several ranges of keys and reduced (splits of 16 keys here: the server's are 256),
    rows shorter than the splits (empty splits weigh nothing) and a window that leaves some splits empty."""
    monkeypatch.setattr(attention_metadata, "TRITON_SPLIT_TOKENS", 16)
    got, want, meta = both_paths(device, [3, 60, 100], [1, 1, 1], page_size=16, window=window, softcap=5.0, seed=4)
    assert meta.triton.num_splits == 7  # ceil(101 / 16)
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(device, dtype):
    got, want, _ = both_paths(device, [0, 21, 30], [18, 1, 4], page_size=16, dtype=dtype, window=12, softcap=20.0, seed=5)
    torch.testing.assert_close(got, want, **TOLERANCE[dtype])


def test_non_contiguous_queries(device):
    got, want, _ = both_paths(device, [0, 9, 40], [5, 1, 2], page_size=1, q_view=True, seed=6)
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory):
    """A tiny Gemma 2: attention logit softcap 2.0, layers 0 and 2 sliding over 8 tokens."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("gemma2"), "gemma2")


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_greedy_generation_through_the_model_runner(device, kind, request):
    """The backend wired into a ModelRunner (--attention-backend triton): a chunked prompt longer than the window, a
    prefix hit, two requests in a batch and decode steps give the torch backend's greedy tokens (fp32)."""
    model_dir = request.getfixturevalue("llama_dir" if kind == "llama" else "gemma2_dir")
    outputs = {}
    for backend in ("triton", "torch"):
        runner = make_runner(
            model_dir, device=device.type, dtype="float32", page_size=4, kv_cache_tokens=256, attention_backend=backend
        )
        assert runner.attention_backend == backend
        driver = GreedyDriver(runner)
        first = driver.add(random_prompt(13, seed=1), 4, chunk_size=6)
        second = driver.add(random_prompt(7, seed=2), 4)
        outputs[backend] = driver.generate([first, second])
        third = driver.add(first.tokens[:13] + random_prompt(3, seed=3), 3, prefix_of=first, prefix_len=13)
        outputs[backend] += driver.generate([third])
    assert outputs["triton"] == outputs["torch"]


def test_backend_choice(monkeypatch):
    """triton: on CUDA, or on the CPU under TRITON_INTERPRET=1, else refused in one line; auto picks it on CUDA
    where triton is installed and flash-attn is not, and never on the CPU."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(attention_module, "triton_available", lambda: True)
    with pytest.raises(ValueError, match="^--attention-backend triton runs on CUDA, not cpu .*TRITON_INTERPRET=1"):
        attention_backend(CPU, torch.float32, "triton")
    assert attention_backend(CUDA, torch.bfloat16, "triton") == "triton"
    assert attention_backend(CUDA, torch.float32, "triton") == "triton"
    assert attention_backend(CPU, torch.float32, "auto") != "triton"
    monkeypatch.setattr(attention_module, "flash_attn_available", lambda device, dtype: True)
    assert attention_backend(CUDA, torch.bfloat16, "auto") == "flash_varlen"  # flash-attn keeps its place
    assert attention_backend(CUDA, torch.bfloat16, "triton") == "triton"
    monkeypatch.setattr(attention_module, "flash_attn_available", lambda device, dtype: False)
    assert attention_backend(CUDA, torch.bfloat16, "auto") == "triton"
    assert attention_backend(CUDA, torch.float32, "auto") == "triton"
    assert attention_backend(CUDA, torch.bfloat16, "torch") == "torch"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert attention_backend(CPU, torch.float32, "triton") == "triton"
    assert attention_backend(CPU, torch.float32, "auto") != "triton"
    monkeypatch.setattr(attention_module, "triton_available", lambda: False)
    assert attention_backend(CUDA, torch.bfloat16, "auto") == "torch"
    with pytest.raises(RuntimeError, match="triton package is not installed"):
        attention_backend(CUDA, torch.bfloat16, "triton")


def test_the_attention_layer_does_not_import_triton():
    """Only a runner whose backend is "triton" imports it (its first layer call)."""
    code = "import sys, zserve.model_proc.layers.attention, zserve.model_proc.model_runner; print('triton' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
