"""Tool calls read from a chat model's text: the parser (one per format, formats/), the scan that reads the
whole answer and each streamed prefix the same way (scan.py), and a streamed choice's calls (stream.py).
Knows nothing of HTTP: an API turns what it finds into its own shape."""
