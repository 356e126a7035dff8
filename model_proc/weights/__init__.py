"""The floor under the checkpoint readers and the layers: the types a weight matrix travels in
from the file to the kernel (Int8Weight, Int4Weight, PackedBlocks with CompactScales, ColumnPieces,
the QuantizedWeight protocol), the kernels' block layout they are packed in (column_blocks.py), and
the GGUF block tables (gguf_blocks.py and its decoders). Nothing here imports another part of model_proc.
"""
