"""sglang-router (`python -m sglang_router.launch_router`) in front of a fleet's replicas.

What the fleet relies on, as sglang-router 0.3.2 behaves (checked against zserve replicas; see
tests/fleet/):
  - it starts even when no worker answers yet, and registers each URL in the background
    (GET /health, then /server_info and /model_info, falling back to /get_server_info and
    /get_model_info);
  - it checks GET /health every --health-check-interval-secs (its default 60 s; the fleet passes
    HEALTH_CHECK_INTERVAL_S) and marks a worker unhealthy after --health-failure-threshold (3)
    failures in a row, healthy again after --health-success-threshold (2) successes;
  - a request that fails on a worker is retried (--retry-max-retries 5, backoff from 50 ms) and
    counts against that worker's circuit breaker, which opens after 10 failures and stays open
    --cb-timeout-duration-secs (60 s) even once the worker is healthy again. So the supervisor
    does not wait for health checks for its own replicas: it removes a dead replica at once
    (DELETE /workers/{id}) and adds it back when it is ready again (POST /workers), which gives
    it a fresh circuit breaker. Workers on other machines (--router-worker-urls) have only the
    health checks and the breaker.
  - a port in use (its own or its Prometheus port) ends it with exit code 1;
  - with --api-key K it answers 401 to a request without `Authorization: Bearer K` (its control
    routes, /workers, included) and sends K to the workers. It takes the key only as a flag, so
    router_main.py adds it from $ZSERVE_API_KEY inside the process, off any command line;
  - its HTTP client keeps an idle connection to a worker for 90 s (reqwest's pool idle timeout) and
    reuses it for the next request or health check: a worker that closes idle connections sooner
    (uvicorn's default keep-alive, 5 s) races it, and the reused connection fails
    (`hyper::Error(IncompleteMessage)` or a reset) as a failed health check. Hence a replica's
    --http-keep-alive-s (120 s by default) outlives the router's pool.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from zserve.common.net_ports import http_url
from zserve.common.server_config import API_KEY_ENV

ROUTER_MODULE = "zserve.launcher.fleet.router_main"  # sglang_router.launch_router, with the API key
HEALTH_CHECK_INTERVAL_S = 5  # workers on other machines leave the router within 3 checks of failing
REQUEST_TIMEOUT_S = 5.0
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
LOG_LEVELS = {"debug": "debug", "info": "warn", "warning": "warn", "error": "error"}  # its info logs every request


class RouterMissing(ValueError):
    pass


def check_router_installed() -> None:
    if importlib.util.find_spec("sglang_router") is None:
        raise RouterMissing(
            "--dp-size serves one endpoint through sglang-router, which is not installed: "
            "pip install 'zserve[router]' (or sglang-router==0.3.2)"
        )


@dataclass(frozen=True)
class RouterSettings:
    host: str
    port: int
    policy: str
    worker_urls: tuple[str, ...]  # the local replicas' first, then the other machines'
    prometheus_port: int
    log_level: str
    extra_args: str  # more launch_router flags, shell-quoted; they come last and win
    api_key: str = field(default="", repr=False)  # clients must send it; passed in the environment, never argv

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", ROUTER_MODULE, "--host", self.host, "--port", str(self.port),
            "--policy", self.policy, "--worker-urls", *self.worker_urls,
            "--prometheus-host", self.host, "--prometheus-port", str(self.prometheus_port),
            "--health-check-interval-secs", str(HEALTH_CHECK_INTERVAL_S), "--worker-startup-check-interval", "1",
            "--shutdown-grace-period-secs", "5", "--log-level", LOG_LEVELS[self.log_level],
            *shlex.split(self.extra_args),
        ]

    @property
    def url(self) -> str:
        return http_url(self.host, self.port)


@dataclass
class RouterProcess:
    settings: RouterSettings
    proc: subprocess.Popen

    @staticmethod
    def start(settings: RouterSettings) -> RouterProcess:
        # it dies with the supervisor
        bound = [sys.executable, "-m", "zserve.launcher.fleet.bound_exec", str(os.getpid())]
        env = {**os.environ, API_KEY_ENV: settings.api_key} if settings.api_key else None
        proc = subprocess.Popen(
            [*bound, *settings.argv()], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor only: it stops the router last
        )
        threading.Thread(target=_echo_logs, args=(proc,), name="router-logs", daemon=True).start()
        return RouterProcess(settings, proc)

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def workers(self) -> list[dict]:
        """GET /workers: each worker's url, id and is_healthy ([] when the router does not answer)."""
        try:
            return self._request("GET", "/workers").get("workers", [])
        except (urllib.error.URLError, OSError, ValueError):
            return []

    def healthy_urls(self) -> set[str]:
        return {w["url"] for w in self.workers() if w.get("is_healthy")}

    def remove_worker(self, url: str) -> bool:
        """Take `url` out of the routing at once (False: the router did not answer or does not know it)."""
        ids = [w["id"] for w in self.workers() if w.get("url") == url]
        try:
            for worker_id in ids:
                self._request("DELETE", f"/workers/{worker_id}")
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return bool(ids)

    def add_worker(self, url: str) -> bool:
        try:
            self._request("POST", "/workers", {"url": url})
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return True

    def stop(self, timeout_s: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.settings.url + path, data=data, method=method, headers=self._headers(),
        )
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            text = response.read().decode()
        return json.loads(text) if text.strip() else {}


    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key}"  # its control routes check the key too
        return headers


def _echo_logs(proc: subprocess.Popen) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write("router | " + ANSI_ESCAPE.sub("", line))
