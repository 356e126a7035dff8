"""The markers a reasoning model's thinking is written between: the one text the launcher (which encodes
`</think>` once, for ModelFacts.think_end_ids) and the HTTP process (whose ReasoningParser splits on them) share."""

REASONING_PARSERS = ("qwen3", "deepseek-r1")  # --reasoning-parser (http_proc/reasoning.py splits on the markers)
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
