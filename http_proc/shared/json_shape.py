"""JsonShape: how big the containers of a raw JSON body are, measured without parsing it.

Parsing is what an oversized body costs: json.loads, then pydantic, then the request's encoding
all take time in proportion to the body's values (a 1,000,000-id prompt: 1.7 s; 100,000 chat
messages: 3 s), on the HTTP process's one event loop, so every other client waits meanwhile.
A body's bytes are scanned instead, a slice at a time with the loop free between slices, and
one whose shape no valid request has is refused before anything parses it:

    run       the most commas between two brackets outside strings: the entries of one flat
              array less one (a prompt's token ids), or the members of one object less one
    objects   `{` outside strings (a chat's messages, their parts and tool calls)

Strings are cut out first: after dropping escaped backslashes and escaped quotes (`\\\\`, `\\"`),
every `"` left opens or closes a string. A slice never ends inside a run of backslashes, so an
escape is never split. The counts are exact for valid JSON; for invalid JSON they are some
numbers, and json.loads names the fault later.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

BRACKETS = re.compile(rb"[\[\]{}]")
SLICE_BYTES = 128 << 10  # a few milliseconds of scanning between two turns of the event loop
BACKSLASH = 0x5C


@dataclass(slots=True)
class JsonShape:
    longest_run: int = 0  # commas in the longest run between two brackets (a flat array's entries - 1)
    num_objects: int = 0
    _run: int = 0  # commas since the last bracket
    _in_string: bool = False

    def feed(self, piece: bytes) -> None:
        """Add the next piece of the body; a piece never ends inside a run of backslashes."""
        if b"\\" in piece:
            piece = piece.replace(b"\\\\", b"").replace(b'\\"', b"")
        parts = piece.split(b'"')
        skeleton = b"".join(parts[1::2] if self._in_string else parts[0::2])  # the text outside strings
        if len(parts) % 2 == 0:  # an odd number of quotes: the next piece starts on the other side
            self._in_string = not self._in_string
        self.num_objects += skeleton.count(b"{")
        runs = BRACKETS.split(skeleton)
        if len(runs) == 1:
            self._run += skeleton.count(b",")
        else:
            inner = max((run.count(b",") for run in runs[1:-1]), default=0)
            self.longest_run = max(self.longest_run, self._run + runs[0].count(b","), inner)
            self._run = runs[-1].count(b",")
        self.longest_run = max(self.longest_run, self._run)

    @staticmethod
    async def of(body: bytes, max_run: int, max_objects: int, slice_bytes: int = SLICE_BYTES) -> JsonShape:
        """The shape of `body`, scanned a slice at a time (the event loop runs other requests
        between slices); stops early once a count passes its bound."""
        shape = JsonShape()
        start = 0
        while start < len(body):
            end = min(start + slice_bytes, len(body))
            while end < len(body) and body[end - 1] == BACKSLASH:
                end += 1
            shape.feed(body[start:end])
            if shape.longest_run > max_run or shape.num_objects > max_objects:
                break
            start = end
            if start < len(body):
                await asyncio.sleep(0)
        return shape
