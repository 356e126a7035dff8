"""Ports and URLs on this machine: a free port, the URL that reaches a server, and its health.

Shared by the launcher (the fleet's replicas and router), the Engine, test support and benchmarks,
so the rules live once:
  - a server listening on a wildcard host ("", "0.0.0.0", "*") is reached on 127.0.0.1; an IPv6
    literal is written in brackets (http://[::1]:8000);
  - a server is healthy when GET /health answers 200 (503 while starting, stalled or draining).
Standard library only: every process may import it.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

LOOPBACK_HOST = "127.0.0.1"
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "*"})
HEALTH_TIMEOUT_S = 2.0


def free_port(host: str = LOOPBACK_HOST) -> int:
    """A TCP port nothing listens on now (the OS picks it; another process may take it before us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0" if host in WILDCARD_HOSTS else host, 0))
        return sock.getsockname()[1]


def port_free(port: int, host: str = LOOPBACK_HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def http_url(host: str, port: int) -> str:
    """Where a client on this machine reaches an HTTP server listening on host:port."""
    reach = LOOPBACK_HOST if host in WILDCARD_HOSTS else f"[{host}]" if ":" in host else host
    return f"http://{reach}:{port}"


def health_ok(url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """GET {url}/health answers 200 (False when refused, 503, or no answer within `timeout_s`)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):  # HTTPError (503) is a URLError
        return False
