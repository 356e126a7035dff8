"""The checkpoint readers: safetensors (checkpoint.py, with AWQ / GPTQ layers: packed_int4_checkpoint.py)
and GGUF (gguf_checkpoint.py over gguf_file.py). Which one opens a model, and which matrices it
returns as stored, is the quantization method's (model_proc/quant/); they stand on weights/ only.
"""
