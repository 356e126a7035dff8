"""Two "nodes" on this machine: two launch_server invocations through scripts/launch_two_nodes.sh,
--tp-size 2 --nnodes 2 on loopback. Node 0 serves a request correctly; stopping node 0 stops
node 1; a rank of node 1 dying takes node 0 down even with no request in flight."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

from testing.e2e_fixtures import GreedyOracle
from testing.paths import REPO_ROOT
from testing.processes import pid_alive, wait_dead
from testing.server_process import ServerProcess
from zserve.client import Client

REPO = REPO_ROOT
FLAGS = ("--dtype", "float32", "--kv-cache-tokens", "2048", "--num-threads", "1", "--page-size", "4", "--chunked-prefill-size", "16",
         "--http-port", "0")  # fp32: the oracle; no HTTP (its default port is one per machine)
NODE0_READY = re.compile(r"zserve ready: .*clients connect to tcp://[\d.]+:(\d+)")
NODE1_READY = re.compile(r"zserve node 1 ready: model ranks 1 of 2 joined node 0")


def free_port_pair() -> int:
    """A port P with P and P + 1 free (the rendezvous and the batch broadcast)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65535:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 1))
                    return port
                except OSError:
                    continue
    raise RuntimeError("no free port pair")


def spawn_node(model_dir, node_rank: int, dist_init_addr: str, client_port: int) -> tuple[ServerProcess, queue.Queue]:
    env = dict(
        os.environ, PYTHONUNBUFFERED="1", MODEL=str(model_dir), TP="2", NODE_RANK=str(node_rank),
        DIST_INIT_ADDR=dist_init_addr, ZMQ_PORT=str(client_port),
    )
    proc = subprocess.Popen(
        ["bash", "scripts/launch_two_nodes.sh", *FLAGS], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    handle = ServerProcess(proc, client_port)
    ready: queue.Queue = queue.Queue()
    pattern = NODE0_READY if node_rank == 0 else NODE1_READY

    def reader() -> None:
        for line in proc.stdout:
            handle.log_lines.append(line)
            if pattern.search(line):
                ready.put(True)

    threading.Thread(target=reader, daemon=True).start()
    return handle, ready


def wait_ready(handle: ServerProcess, ready: queue.Queue, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ready.get(timeout=0.2)
            return
        except queue.Empty:
            if handle.proc.poll() is not None:
                time.sleep(0.2)
                raise AssertionError(f"node exited with {handle.proc.returncode} before ready:\n{handle.log()}") from None
    raise AssertionError(f"node not ready within {timeout_s}s:\n{handle.log()}")


@pytest.fixture
def nodes(model_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        client_port = s.getsockname()[1]
    dist_init_addr = f"127.0.0.1:{free_port_pair()}"
    started = [spawn_node(model_dir, rank, dist_init_addr, client_port) for rank in (0, 1)]
    try:
        for handle, ready in started:
            wait_ready(handle, ready)
        yield started[0][0], started[1][0]
    finally:
        for handle, _ in started:
            if handle.proc.poll() is None:
                handle.proc.kill()
                handle.proc.wait()


def test_two_nodes_serve_and_stopping_node_0_stops_node_1(nodes, model_dir):
    node0, node1 = nodes
    node1_children = node1.child_pids()
    assert len(node1_children) == 1 and len(node0.child_pids()) == 4  # node 1: rank 1 only
    prompt = "The quick brown fox jumps over the lazy dog. " * 2  # longer than the 16-token budget
    with Client(node0.port, timeout_s=120) as c:
        results = [c.generate(prompt, max_tokens=12, ignore_eos=True) for _ in range(2)]  # the second: a prefix hit
        assert c.stats()["num_prefix_hit_tokens"] > 0
    oracle = GreedyOracle(model_dir)
    expected = oracle.greedy(oracle.encode(prompt), 12, stop_at_eos=False)
    assert [r.output_ids for r in results] == [expected, expected]
    assert results[0].text == oracle.decode(expected)

    node0.proc.send_signal(signal.SIGTERM)
    assert node0.proc.wait(timeout=20) == 0, node0.log()
    assert node1.proc.wait(timeout=15) == 0, node1.log()  # rank 0 told rank 1 the server stopped
    assert "node 0 stopped the server" in node1.log()
    assert wait_dead(node1_children, 5) == []


def test_a_dead_rank_on_node_1_stops_both_nodes_even_when_idle(nodes):
    node0, node1 = nodes
    node0_children = node0.child_pids()
    os.kill(node1.rank_pid(1), signal.SIGKILL)
    assert node1.proc.wait(timeout=15) == 1, node1.log()
    assert node0.proc.wait(timeout=15) == 1, node0.log()  # rank 0 saw its follower's connection drop
    assert "a follower rank disconnected" in node0.log()
    assert wait_dead(node0_children, 10) == [], node0.log()
    assert not any(pid_alive(p) for p in node0_children)
