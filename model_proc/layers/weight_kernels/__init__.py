"""The GEMMs under every linear layer and the LM head: y = x @ W (+ bias), one class each.

Weights load as plain [in, out] tensors. After loading, the runner packs each one for the kernel
`registry.choose_kernel` picked, in the layout that kernel reads best, and frees the plain one
(layers/gemm.py, `prepack_weights`):

  - "zserve_bf16+onednn" (CPU, bf16, where zserve_bf16 and oneDNN's native bf16 both run; `auto`'s
    first choice): both layouts, products of few rows through zserve_bf16, of many through oneDNN,
    the crossover measured at load (row_split_kernel.py);
  - "zserve_bf16" (CPU, bf16, where model_proc/kernels/ built with the avx512_bf16 feature): our kernel
    (kernels/gemm_bf16.cpp) on blocks of 16 columns x pairs of k, so a decode step streams each
    weight once, in order, at the machine's read bandwidth; a weight with odd in_features falls
    back to zserve_widen (else onednn);
  - "zserve_widen" (CPU, bf16 or fp16, kernels built with avx2: every current x86-64):
    our kernel (kernels/gemm_widen.cpp) on blocks of 16 columns x k, weights kept 16-bit and
    widened to fp32 in registers (bf16: a shift; fp16: F16C), fp32 FMAs;
  - "onednn" (CPU, fp32; bf16 only where oneDNN has native bf16, i.e. AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT): oneDNN's linear on a weight reordered into its blocked layout
    (torch.ops.mkldnn._reorder_linear_weight, which raises for bf16 on an AVX2-only CPU);
  - "torch" (CUDA, other dtypes, --gemm-backend torch): torch.mm on the plain tensor;
  - "zserve_int8_dot+onednn" (--quantization int8 or gguf, CPU, bf16 where oneDNN has native bf16;
    `auto`'s first int8 choice): products of few rows through zserve_int8_dot, of many through oneDNN
    on a bf16 copy of the dequantized weights, the crossover measured at load (row_split_int8_kernel.py);
  - "zserve_int8_dot" (--quantization int8 or gguf, CPU, bf16/fp16 with `auto`, any dtype with
    --gemm-backend zserve_dot, kernels built with avx2): the activations quantized to int8 per row in
    blocks of 32 at each product, int8 x int8 in int32 (kernels/gemm_int8_dot.cpp: VPDPBUSD zmm with
    avx512_vnni, VPDPBUSD ymm with avx_vnni in a 256-bit build, VPMADDUBSW elsewhere), one fp32 rescale
    per block; int8 codes in quads (with offsets for a GGUF file's Q5 types), 4-bit codes in nibbles
    (Q4_0, Q4_1, Q4_K) or 6-bit codes in nibbles plus a 2-bit plane (Q6_K, six_bit_codes.py);
  - "zserve_int8" (--quantization int8, CPU, any runtime dtype, kernels built with avx2): each weight
    quantized at load to int8 with fp32 scales per group of input rows (weights/int8_weights.py), run
    by kernels/gemm_int8.cpp in gemm_widen's block layout (int8 widened in registers, fp32 sums):
    half of bf16's bytes per decode step;
  - "int8_torch" (--quantization int8 on CUDA, with the `baseline` set, or with --gemm-backend
    torch): the same int8 values and scales, dequantized on the fly for an fp32 torch.mm (the
    reference: slow, exact).

    file                 holds
    weight_kernel.py     WeightKernel (runs, kernel_for, pack, matmul, weight_bytes), PackedWeight
    (model_proc/weights/quantized_weight.py: how a checkpoint's pre-quantized weight reaches `pack`, typed;
     model_proc/weights/column_blocks.py: the block layouts of zserve's kernels)
    float_kernels.py     torch, onednn, zserve_bf16, zserve_widen
    row_split_kernel.py  zserve_bf16+onednn, and the crossover's measurement
    int8_kernels.py      zserve_int8_dot, zserve_int8, int8_torch
    row_split_int8_kernel.py  zserve_int8_dot+onednn
    registry.py          KERNELS in preference order; choose_kernel (the one place a kernel is chosen, among
                         those the --quantization's method runs on: model_proc/quant/)

Measured (SmolLM2-135M's 30 layers of linear weights plus its LM head, 269 MB in bf16, streamed
from memory as in a decode step, 2 threads, this machine, one process, interleaved):

    rows of x                   1        8        64      512
    bf16  torch.mm [in, out]   20.6 ms  26.1 ms  57.0 ms        (layers only)
    bf16  oneDNN, packed       13.7 ms  14.4 ms  50.0 ms  341 ms
    bf16  zserve_bf16           8.9 ms   9.6 ms  47.0 ms  333 ms  (8.9 ms = 30 GB/s; 64 and 512 rows
                                                                  before the 4x6 tiles: 0.88-0.89x since)
    fp32  torch.mm [in, out]   31.1 ms  66.0 ms   163 ms        (layers only)
    fp32  oneDNN, packed       26.5 ms  28.7 ms  91.9 ms

int8 (zserve_int8, groups of 64: 143 MB): a whole batch-1 decode step of the demo model in bf16
takes 0.79x the zserve_widen one on the Zen 3 (2 threads), its GEMMs 12.5 against 19.3 ms a step
(torch.profiler); from 64 rows on it runs at bf16's speed (the scratch tiles are the same).

Numerics: all three sum in fp32 and round to the output dtype once. In bf16, oneDNN-packed
results are bit-identical to torch.mm (torch sends bf16 matmuls to oneDNN); zserve_bf16's differ
from torch.mm in 0 to 3e-4 of the outputs, by one ulp (another summation order). In fp32, oneDNN
sums in another order than MKL's sgemm: outputs differ in the last bits. tests/model/test_gemm.py
checks every kernel against the exact product; the parity tests against transformers hold on
each.
"""
