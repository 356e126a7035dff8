"""zserve's HTTP front end: an OpenAI-compatible API, a native /generate, /health and /metrics.

A thin process on top of the async ZMQ client (client.AsyncClient); it holds no model and no
tokenizer. The launcher starts it with `--http-port` once the frontend's client port is known.
"""
