"""One data-parallel replica of a fleet: an ordinary `launch_server`, pinned to its cores, restartable.

The supervisor (launcher/fleet/supervisor.py) owns every Replica and is the only one to call its methods.
A replica is a whole server (its own launcher, tokenizer, scheduler, worker, detokenizer, HTTP):
when its launcher dies, its children die with it (PR_SET_PDEATHSIG), so the supervisor watches
the launcher process alone.

Pinning: the CPU affinity is set on the supervisor's calling thread just before the fork and
restored right after, so the child starts pinned (and every process it starts inherits the set)
without a preexec_fn, which is unsafe while the log reader threads run.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

from zserve.common.net_ports import health_ok
from zserve.launcher.fleet.core_split import format_cpulist
from zserve.launcher.fleet.plan import ReplicaSpec
from zserve.launcher.server_ready import ServerReady
from zserve.launcher.server_subprocess import ServerSubprocess


@dataclass
class Replica:
    spec: ReplicaSpec
    env: dict[str, str]  # the whole environment of its launcher
    server: ServerSubprocess | None = None
    ready: ServerReady | None = None  # set once it wrote its ready record and answered /health
    num_starts: int = 0
    started_at: float = 0.0  # time.monotonic() of the last start
    restart_at: float | None = None  # time.monotonic() when the supervisor starts it again
    num_failed_starts: int = 0  # exits before ready, in a row: the restart delay doubles with each

    @property
    def name(self) -> str:
        return f"replica {self.spec.replica_idx}"

    def describe(self) -> str:
        """Cores, threads and ports, for the logs."""
        zmq = self.ready.zmq_port if self.ready is not None else self.spec.zmq_port or "free"
        return (f"cores {format_cpulist(list(self.spec.cpus))} ({self.spec.num_threads} threads), "
                f"HTTP {self.spec.url}, ZMQ port {zmq}")

    def start(self) -> None:
        self.ready, self.restart_at = None, None
        with _pinned(self.spec.cpus):
            self.server = ServerSubprocess.start(
                list(self.spec.argv), env=self.env, echo_logs=True, max_log_lines=500, echo_prefix=f"{self.name} | ",
                new_session=True,
            )
        self.num_starts += 1
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self.server.proc.pid if self.server is not None else None

    def exit_code(self) -> int | None:
        """None while its launcher runs (or before the first start)."""
        return None if self.server is None else self.server.proc.poll()

    def poll_ready(self) -> bool:
        """True once its ready record is written and GET /health answers 200 (checked once each)."""
        if self.ready is not None:
            return True
        if self.server is None or self.exit_code() is not None:
            return False
        record = ServerReady.read(self.server.ready_path)
        if record is None or not health_ok(self.spec.url):
            return False
        self.server.ready_path.unlink(missing_ok=True)
        self.ready = record
        return True

    def signal(self, sig: int) -> None:
        if self.server is not None and self.server.proc.poll() is None:
            self.server.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int | None:
        """Its exit code, or None if it still runs after `timeout_s`."""
        if self.server is None:
            return 0
        try:
            return self.server.proc.wait(timeout=max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.server is not None:
            self.server.kill()


class _pinned:
    """Pin the calling thread to `cpus` for the block (children forked inside inherit it)."""

    def __init__(self, cpus: tuple[int, ...]):
        self.cpus = set(cpus)
        self.saved: set[int] | None = None

    def __enter__(self) -> None:
        if hasattr(os, "sched_setaffinity"):
            self.saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.cpus)

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            os.sched_setaffinity(0, self.saved)

