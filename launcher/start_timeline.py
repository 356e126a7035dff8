"""StartTimeline: where a node's start time went, logged at INFO in one line once every process is ready.

    start: ready 3.95 s after launch; launcher 0.31 s (python and imports 0.22, model directory 0.01, model facts
    0.08); model ready at 3.88 s (python and imports 0.95, torch and kernels 0.90, ..., load and pack 0.81, KV pool
    prefault 0.02); detokenizer at 1.25 s; tokenizer at 1.32 s; http at 1.34 s; scheduler at 3.91 s

Times are seconds since the launcher process was created. The launcher owns this object; each child's
phases come in its ProcReady (common/start_phases.py), its ready time is when that message arrived.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from zserve.common.messages import ProcReady
from zserve.common.start_phases import StartPhases


@dataclass
class StartTimeline:
    launcher: StartPhases  # the launcher's own phases, up to starting its children
    launched_at: float = field(default_factory=time.monotonic)  # monotonic time of the launcher's exec
    spawned_s: dict[str, float] = field(default_factory=dict)  # child -> seconds since launch when started
    ready_s: dict[str, float] = field(default_factory=dict)  # child -> seconds since launch when its ProcReady came
    child_phases: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def from_launcher_phases(cls, phases: StartPhases) -> StartTimeline:
        """`phases` began at the launcher's exec: its first phase dates the launch."""
        return cls(phases, launched_at=time.monotonic() - phases.total_s)

    def now_s(self) -> float:
        return time.monotonic() - self.launched_at

    def spawned(self, name: str) -> None:
        self.spawned_s[name] = self.now_s()

    def ready(self, msg: ProcReady) -> None:
        self.ready_s[msg.name] = self.now_s()
        if msg.start_phases:
            self.child_phases[msg.name] = dict(msg.start_phases)

    def summary(self) -> str:
        """One line: the launcher's phases, then each child in the order it became ready, with its phases."""
        parts = [f"start: ready {max(self.ready_s.values(), default=self.now_s()):.2f} s after launch",
                 f"launcher {self.launcher.total_s:.2f} s ({self.launcher.text()})"]
        for name, at_s in sorted(self.ready_s.items(), key=lambda item: item[1]):
            phases = self.child_phases.get(name)
            spawned = self.spawned_s.get(name)
            detail = f"started at {spawned:.2f} s" if spawned is not None else ""
            if phases:
                detail += ("; " if detail else "") + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
            parts.append(f"{name} ready at {at_s:.2f} s" + (f" ({detail})" if detail else ""))
        return "; ".join(parts)
