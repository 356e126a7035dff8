"""FinishReason: why a request ended. An int on the wire; `.text` is the word clients see."""

from __future__ import annotations

from enum import IntEnum


class FinishReason(IntEnum):
    STOP = 1  # an EOS id, a stop token id, or a stop string
    LENGTH = 2  # max_tokens, or the end of the model's context
    ABORT = 3  # the client asked, or the server is shutting down
    ERROR = 4  # refused or failed: an ErrorCode says whose fault

    @property
    def text(self) -> str:
        """"stop", "length", "abort" or "error", as the OpenAI API and zserve's clients spell it."""
        return self.name.lower()

    def __str__(self) -> str:
        return self.text
