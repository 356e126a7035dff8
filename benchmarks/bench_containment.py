"""Containment: how long an oversized request takes to be refused, and how much it delays a small request sent
next to it (the small one alone first, best of 3; then sent 50 ms after the oversized one, best of --tries).

    .venv/bin/python benchmarks/bench_containment.py            # the tiny random Llama (no demo model needed)

Oversized requests: 1,000,000 `input_ids` and 100,000 `messages` through the ZMQ client port, and the same
through HTTP (/v1/completions with a token-list prompt, SGLang-shaped /generate, /v1/chat/completions).
The target (issue 24): each adds under 0.5 s to the small request. Prints one line per case.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zmq  # noqa: E402

from benchmarks.machine_info import load_average, machine_info  # noqa: E402
from testing.e2e_fixtures import build_tiny_llama_dir  # noqa: E402
from testing.server_process import free_port, start_server  # noqa: E402
from zserve.client import Client  # noqa: E402
from zserve.common.messages import CLIENT_TO_FRONTEND, FRONTEND_TO_CLIENT, GenerateReq  # noqa: E402

SMALL_HTTP = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()


def log(msg: str) -> None:
    print(f"[bench_containment] {msg}", file=sys.stderr, flush=True)


def http_post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def small_zmq(port: int) -> float:
    with Client(port, timeout_s=60) as c:
        t0 = time.perf_counter()
        c.generate("hi", max_tokens=1)
        return time.perf_counter() - t0


def small_http(port: int) -> float:
    t0 = time.perf_counter()
    status, body = http_post(port, "/v1/completions", SMALL_HTTP)
    assert status == 200, body
    return time.perf_counter() - t0


def big_zmq(port: int, body: dict) -> Callable[[], tuple[float, str]]:
    frame = CLIENT_TO_FRONTEND.encode(GenerateReq(req_id=7, client_id="oversized", body=body))

    def run() -> tuple[float, str]:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{port}")
        try:
            t0 = time.perf_counter()
            sock.send(frame)
            reply = FRONTEND_TO_CLIENT.decode(sock.recv())
            return time.perf_counter() - t0, str(getattr(reply, "error", reply))
        finally:
            sock.close(0)
            ctx.term()

    return run


def big_http(port: int, path: str, body: dict) -> Callable[[], tuple[float, str]]:
    data = json.dumps(body).encode()

    def run() -> tuple[float, str]:
        t0 = time.perf_counter()
        status, reply = http_post(port, path, data)
        return time.perf_counter() - t0, f"{status} {reply[:120].decode(errors='replace')}"

    return run


def measure(name: str, big: Callable[[], tuple[float, str]], small: Callable[[int], float], port: int, tries: int) -> dict:
    alone_s = min(small(port) for _ in range(3))
    added, refused_s, answer = [], [], ""
    for _ in range(tries):
        out: dict = {}
        thread = threading.Thread(target=lambda out=out: out.update(big=big()))
        thread.start()
        time.sleep(0.05)
        added.append(small(port) - alone_s)
        thread.join()
        refused_s.append(out["big"][0])
        answer = out["big"][1]
    line = (f"{name:<36} refused in {min(refused_s):5.2f}-{max(refused_s):5.2f} s; small alone {alone_s * 1000:4.0f} ms, "
            f"added {min(added) * 1000:5.0f}-{max(added) * 1000:5.0f} ms ({answer[:70]!r})")
    print(line, flush=True)
    return {"name": name, "alone_s": alone_s, "added_s": added, "refused_s": refused_s}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=3, help="oversized requests per case (default: %(default)s)")
    args = parser.parse_args(argv)
    info = machine_info()
    log(f"CPU {info.get('cpu')} ({info.get('cpu_isa')}); load average {load_average()}")
    model_dir = build_tiny_llama_dir(Path(tempfile.mkdtemp(prefix="zserve-containment-")))
    http_port = free_port()
    server = start_server(model_dir, "--port", str(http_port), "--num-threads", "1", "--kv-cache-tokens", "4096")
    ids = [5] * 1_000_000
    messages = [{"role": "user", "content": "a"}] * 100_000
    cases = [
        ("zmq input_ids 1M", big_zmq(server.port, {"input_ids": ids, "sampling": {"max_tokens": 4}}), small_zmq, server.port),
        ("zmq messages 100k", big_zmq(server.port, {"messages": messages, "sampling": {"max_tokens": 4}}), small_zmq, server.port),
        ("http /v1/completions 1M ids", big_http(http_port, "/v1/completions", {"prompt": ids, "max_tokens": 4}), small_http, http_port),
        ("http /generate 1M ids", big_http(http_port, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 4}}),
         small_http, http_port),
        ("http /v1/chat 100k messages", big_http(http_port, "/v1/chat/completions", {"messages": messages, "max_tokens": 4}),
         small_http, http_port),
    ]
    try:
        rows = [measure(name, big, small, port, args.tries) for name, big, small, port in cases]
    finally:
        server.stop()
    log(f"load average {load_average()}")
    return rows


if __name__ == "__main__":
    main()
