"""Fleet: the supervisor of `launch_server --dp-size N`, N replicas and the router in front of them.

    start:     every replica at once (each an ordinary launch_server on its own cores and ports)
               -> wait until each wrote its ready record and answers GET /health
               -> sglang-router with their URLs (and --router-worker-urls), wait until it
               reports every local replica healthy
    supervise: until SIGINT/SIGTERM or the router exits (an error: clients lost their endpoint).
               A replica that exits is taken out of the router at once, started again after
               RESTART_DELAY_S (doubling, up to MAX_RESTART_DELAY_S, while it keeps failing
               before ready) and put back into the router once it is ready
    shutdown:  SIGTERM to every replica at once: each drains (in-flight requests finish, new
               ones get 503, up to --drain-timeout-s; a second signal to the fleet is passed on
               and aborts the drains) -> the router stops last -> SIGKILL to any straggler

The supervisor owns every Replica and the RouterProcess; nothing else changes them. It holds
no model: a replica that dies takes only its own requests with it.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass

from zserve.launcher.child_process import ChildProcess
from zserve.launcher.fleet.replica import Replica
from zserve.launcher.fleet.router import RouterProcess, RouterSettings

logger = logging.getLogger("fleet")
RESTART_DELAY_S = 2.0
MAX_RESTART_DELAY_S = 30.0
STOP_GRACE_S = 15.0  # past the drain timeout, how long a replica may take to exit before SIGKILL
ROUTER_READY_TIMEOUT_S = 60.0
POLL_S = 0.1


class FleetStartError(RuntimeError):
    pass


@dataclass
class Fleet:
    replicas: list[Replica]
    router_settings: RouterSettings
    startup_timeout_s: float
    drain_timeout_s: float
    router: RouterProcess | None = None
    stop_requested: bool = False
    abort_requested: bool = False  # a second stop signal: passed on to the replicas, which abort their drain

    def on_stop_signal(self, signum: int, _frame=None) -> None:
        if self.stop_requested:
            self.abort_requested = True
        self.stop_requested = True

    def start(self) -> None:
        for replica in self.replicas:
            replica.start()
            logger.info("%s starting (pid %d): %s", replica.name, replica.pid, replica.describe())
        self._wait_replicas_ready()
        self._start_router(self.router_settings)

    def _wait_replicas_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        pending = list(self.replicas)
        while pending:
            if self.stop_requested:
                raise FleetStartError("stopped by a signal during startup")
            for replica in list(pending):
                code = replica.exit_code()
                if code is not None:
                    raise FleetStartError(
                        f"{replica.name} {ChildProcess.describe_exit(code)} before it was ready (its log is above)"
                    )
                if replica.poll_ready():
                    logger.info(
                        "%s ready in %.1fs: %s", replica.name, time.monotonic() - replica.started_at, replica.describe()
                    )
                    pending.remove(replica)
            if pending and time.monotonic() > deadline:
                raise FleetStartError(
                    f"not ready after {self.startup_timeout_s:.0f}s: {', '.join(r.name for r in pending)}"
                )
            time.sleep(POLL_S)

    def _start_router(self, settings: RouterSettings) -> None:
        self.router = RouterProcess.start(settings)
        local_urls = {r.spec.url for r in self.replicas}
        deadline = time.monotonic() + ROUTER_READY_TIMEOUT_S
        while not local_urls <= self.router.healthy_urls():
            code = self.router.exit_code()
            if code is not None:
                raise FleetStartError(f"the router exited with code {code} during startup (its log is above)")
            if self.stop_requested:
                raise FleetStartError("stopped by a signal during startup")
            if time.monotonic() > deadline:
                raise FleetStartError(
                    f"the router did not report every replica healthy within {ROUTER_READY_TIMEOUT_S:.0f}s"
                )
            time.sleep(POLL_S)
        logger.info("router ready on %s (policy %s): %d worker(s): %s", settings.url, settings.policy,
                    len(settings.worker_urls), " ".join(settings.worker_urls))

    def supervise(self) -> int:
        """Until a stop signal (0) or the router's exit (1)."""
        while not self.stop_requested:
            if self.router is not None:
                code = self.router.exit_code()
                if code is not None:
                    logger.error("the router %s; stopping the fleet", ChildProcess.describe_exit(code))
                    return 1
            for replica in self.replicas:
                self._watch(replica, time.monotonic())
            time.sleep(POLL_S)
        logger.info("stop requested; draining every replica")
        return 0

    def _watch(self, replica: Replica, now: float) -> None:
        """One replica's step: notice an exit, restart when due, put it back in the router once ready."""
        if replica.restart_at is not None:
            if now >= replica.restart_at:
                replica.start()
                logger.info(
                    "%s restarting (pid %d, start #%d): %s",
                    replica.name, replica.pid, replica.num_starts, replica.describe(),
                )
            return
        code = replica.exit_code()
        if code is not None:
            self._on_replica_exit(replica, code, now)
        elif replica.ready is None and replica.poll_ready():
            replica.num_failed_starts = 0
            rejoined = self.router is not None and self.router.add_worker(replica.spec.url)
            logger.info("%s ready again %.1fs after its restart%s", replica.name, now - replica.started_at,
                        "; added back to the router" if rejoined else "")

    def _on_replica_exit(self, replica: Replica, code: int, now: float) -> None:
        was_ready = replica.ready is not None
        replica.num_failed_starts = 0 if was_ready else replica.num_failed_starts + 1
        delay_s = min(MAX_RESTART_DELAY_S, RESTART_DELAY_S * 2 ** max(0, replica.num_failed_starts - 1))
        removed = was_ready and self.router is not None and self.router.remove_worker(replica.spec.url)
        logger.error("%s (pid %d) %s after %.1fs%s; restarting it in %.0fs", replica.name, replica.pid,
                     ChildProcess.describe_exit(code), now - replica.started_at,
                     "; taken out of the router" if removed else "", delay_s)
        replica.ready = None
        replica.restart_at = now + delay_s

    def shutdown(self) -> None:
        """Drain and stop every replica, then the router; nothing is left running."""
        running = [r for r in self.replicas if r.exit_code() is None and r.server is not None]
        for replica in running:
            replica.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.drain_timeout_s + STOP_GRACE_S
        aborted = False
        while any(r.exit_code() is None for r in running) and time.monotonic() < deadline:
            if self.abort_requested and not aborted:
                logger.info("second stop signal: the replicas abort their in-flight requests")
                for replica in running:
                    replica.signal(signal.SIGTERM)
                aborted = True
            time.sleep(POLL_S)
        for replica in running:
            code = replica.exit_code()
            if code is None:
                logger.warning("%s (pid %d) did not stop in time: killing it", replica.name, replica.pid)
                replica.kill()
            else:
                logger.info("%s stopped (%s)", replica.name, ChildProcess.describe_exit(code))
        if self.router is not None:
            code = self.router.stop()
            logger.info("router stopped (%s)", ChildProcess.describe_exit(code))
