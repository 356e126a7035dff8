"""The quantization methods, one class each (vLLM's model_executor/layers/quantization as the
anchor): methods.py lists them and answers which one a checkpoint is stored in and what `auto`
picks; quant_method.py is the interface. Adding a method is one class here, listed in methods.py.
"""
