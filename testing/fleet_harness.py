"""A real fleet (`launch_server --dp-size N`) started for a test or a benchmark, and stopped.

    fleet = FleetHarness.start(model_dir, num_replicas=2)
    try:
        ... requests to fleet.router_url, or to fleet.replica_urls[i] directly ...
        fleet.replica_stats(0)["num_prefix_hit_tokens"]
        os.kill(fleet.replica_pid(1), signal.SIGKILL)
    finally:
        fleet.kill()                                   # every process of the fleet, whatever happened

The router's health checks are made fast (ROUTER_TEST_ARGS) so a dead replica leaves it in
about a second. Readiness is the fleet's ready record (launcher/server_ready.py), as for one server;
its ready line names the replicas' URLs (free loopback ports the fleet picked).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from testing.paths import REPO_ROOT
from testing.processes import child_pids, cmdline, pid_alive
from zserve.common.net_ports import free_port, http_url
from zserve.http_proc.shared.server_metrics import PREFIX, STAT_COUNTERS
from zserve.launcher.server_ready import ServerReady
from zserve.launcher.server_subprocess import ServerSubprocess

ROUTER_TEST_ARGS = "--health-check-interval-secs 1 --health-failure-threshold 2 --health-success-threshold 1"
REPLICA_TEST_FLAGS = ("--dtype", "float32", "--kv-cache-tokens", "8192", "--log-stats-interval-s", "0", "--grammar-backend", "none")
COUNTER_TO_STAT = {f"{PREFIX}_{name}_total": key for key, name, _ in STAT_COUNTERS}


REPLICA_URL = re.compile(r"http://127\.0\.0\.1:\d+")


@dataclass
class FleetHarness:
    server: ServerSubprocess
    ready: ServerReady
    replica_urls: list[str]  # replica i's, from the ready line

    @staticmethod
    def start(
        model_dir: str | Path, num_replicas: int = 2, flags: tuple[str, ...] = REPLICA_TEST_FLAGS, *,
        policy: str = "cache_aware", router_args: str = ROUTER_TEST_ARGS, timeout_s: float = 120.0,
        echo_logs: bool = False, env: dict[str, str] | None = None,
    ) -> FleetHarness:
        argv = [
            "--model", str(model_dir), "--dp-size", str(num_replicas), "--port", str(free_port()), "--zmq-port", "0",
            *(["--router"] if num_replicas == 1 else []),  # above 1, --dp-size alone brings the router
            "--router-prometheus-port", "0", "--router-policy", policy, f"--router-args={router_args}", *flags,
        ]
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        server = ServerSubprocess.start(argv, env=env, echo_logs=echo_logs)
        try:
            ready = server.wait_ready(timeout_s)
        except BaseException:
            kill_tree(server.proc.pid)
            server.kill()
            raise
        return FleetHarness(server, ready, REPLICA_URL.findall(ready.ready_line.split(" at ", 1)[1]))

    def router_pid(self) -> int:
        """The router's pid: the supervisor's child that is no replica (it renames itself
        "sglang::router", so its command line does not say sglang_router)."""
        return next(p for p in child_pids(self.server.proc.pid) if b"zserve.launcher" not in cmdline(p))

    @property
    def router_url(self) -> str:
        return http_url("127.0.0.1", self.ready.http_port)

    @property
    def model_name(self) -> str:
        """The served model's name (the model directory's), which requests through the router must give."""
        return Path(self.ready.model).name

    @property
    def num_replicas(self) -> int:
        return len(self.replica_urls)

    def log(self) -> str:
        return self.server.log()

    def replica_pid(self, replica_idx: int) -> int:
        """The pid of replica `replica_idx`'s launcher (a child of the supervisor)."""
        port = self.replica_urls[replica_idx].rsplit(":", 1)[1].encode()
        for pid in child_pids(self.server.proc.pid):
            argv = cmdline(pid)
            if b"zserve.launcher" in argv and port in argv:
                return pid
        raise AssertionError(f"no running replica {replica_idx}\n{self.server.log_tail()}")

    def replica_child_pid(self, replica_idx: int, module: str) -> int:
        """The pid of replica `replica_idx`'s child started as `python -m zserve.<module>` (model_proc ...)."""
        want = f"zserve.{module}".encode()
        for pid in child_pids(self.replica_pid(replica_idx)):
            if want in cmdline(pid):
                return pid
        raise AssertionError(f"replica {replica_idx} runs no {module}\n{self.server.log_tail()}")

    def descendants(self) -> list[int]:
        return descendant_pids(self.server.proc.pid)

    def replica_stats(self, replica_idx: int) -> dict[str, int]:
        """The scheduler counters of replica `replica_idx` (num_prompt_tokens, num_prefix_hit_tokens, num_finished ...)."""
        with urllib.request.urlopen(self.replica_urls[replica_idx] + "/metrics", timeout=10) as response:
            text = response.read().decode()
        return {
            COUNTER_TO_STAT[s.name]: int(s.value)
            for family in text_string_to_metric_families(text) for s in family.samples if s.name in COUNTER_TO_STAT
        }

    def router_workers(self) -> dict[str, bool]:
        """url -> is_healthy, as the router lists its workers."""
        with urllib.request.urlopen(self.router_url + "/workers", timeout=10) as response:
            workers = json.loads(response.read())["workers"]
        return {w["url"]: bool(w["is_healthy"]) for w in workers}

    def wait_for(self, condition, timeout_s: float, what: str, poll_s: float = 0.05) -> float:
        """Seconds until `condition()` held; AssertionError naming `what` after `timeout_s`."""
        start = time.monotonic()
        while not condition():
            if time.monotonic() - start > timeout_s:
                raise AssertionError(f"{what}: not within {timeout_s}s\n{self.server.log_tail(60)}")
            time.sleep(poll_s)
        return time.monotonic() - start

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (the fleet drains) and wait; killed, with everything under it, when it does not exit."""
        try:
            return self.server.stop(signal.SIGTERM, timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the fleet did not exit within {timeout_s}s of SIGTERM\n{self.server.log_tail()}") from None

    def kill(self) -> None:
        """SIGKILL to every process of the fleet (the replicas' own children die with them)."""
        kill_tree(self.server.proc.pid)
        self.server.kill()


def bench_model_dir(model: str, tmp: Path) -> str:
    """The fleet scripts' --model: "demo" (the demo model, fetched if needed), a directory, or ""
    (a tiny random Llama built under `tmp`)."""
    if model == "demo":
        from zserve.launcher.demo_model import ensure_demo_model

        return str(ensure_demo_model(progress=True))
    if not model:
        from testing.e2e_fixtures import build_tiny_llama_dir

        return str(build_tiny_llama_dir(tmp / "tiny-llama"))
    return model


def descendant_pids(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in child_pids(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s descendants (deepest last found first) that are still alive."""
    for child in reversed(descendant_pids(pid)):
        if pid_alive(child):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
