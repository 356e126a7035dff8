"""One scanner per tool-call format (the names are vLLM's and SGLang's); tools/parser.py lists them."""
