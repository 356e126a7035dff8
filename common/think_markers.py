"""The markers a reasoning model's thinking is written between: the one text the launcher (which encodes
`</think>` once, for ModelFacts.think_end_ids) and the HTTP process (whose ReasoningParser splits on them) share."""

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
