"""StartPhases: how long each step of one process's start took (the launcher's start line, launcher/start_timeline.py).

    phases = StartPhases.since_process_start()   # "python and imports": from exec to here (/proc/self/stat)
    ... load the model ...
    phases.done("load and pack")                 # seconds since the previous mark, under that name
    phases.durations_s                           # {"python and imports": 1.9, "load and pack": 0.8}

A process owns its StartPhases and sends `durations_s` once, in its ProcReady.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

FIRST_PHASE = "python and imports"


def process_age_s() -> float:
    """Seconds since this process was created (the kernel's start time, 10 ms steps); 0.0 where /proc has none."""
    stat = Path("/proc/self/stat")
    if not stat.is_file():
        return 0.0
    start_ticks = int(stat.read_text().rsplit(")", 1)[1].split()[19])  # field 22, after "(comm)"
    return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK"))


@dataclass
class StartPhases:
    durations_s: dict[str, float] = field(default_factory=dict)  # phase -> seconds, in the order they ran
    _last_mark: float = field(default_factory=time.monotonic, repr=False)

    @classmethod
    def since_process_start(cls) -> StartPhases:
        """A timeline whose first phase is the interpreter's start and the imports so far."""
        phases = cls()
        phases.durations_s[FIRST_PHASE] = process_age_s()
        return phases

    def done(self, name: str) -> float:
        """End the phase `name` now (a name used again adds up); returns its seconds."""
        now = time.monotonic()
        seconds = now - self._last_mark
        self.durations_s[name] = self.durations_s.get(name, 0.0) + seconds
        self._last_mark = now
        return seconds

    @property
    def total_s(self) -> float:
        return sum(self.durations_s.values())

    def text(self) -> str:
        """'python and imports 1.92, load and pack 0.80' (seconds)."""
        return ", ".join(f"{name} {seconds:.2f}" for name, seconds in self.durations_s.items())
